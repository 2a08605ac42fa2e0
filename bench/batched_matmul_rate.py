"""Batched small matmuls on the cpu backend against one 2-d matmul of the same FLOPs (issue 47).

    OMP_NUM_THREADS=1 OPFORGE_NUM_THREADS=1 .venv/bin/python bench/batched_matmul_rate.py

For each batched matmul of torchvision ``swin_t`` and timm ``coat_lite_tiny`` at a 224x224
input (shapes below, with where they come from), two one-op programs are exported with
``backends=["cpu"]`` and run on the lean runtime: the batched matmul ``[*batch, M, K] @
[*batch, K, N]`` and the 2-d matmul ``[prod(batch) * M, K] @ [K, N]`` (the same FLOPs,
``2 * prod(batch) * M * K * N``). Both operands are inputs (as in attention), contiguous
(in the models k^T is a transposed view: this measures the matmul, not the layout). Timed at
one thread, interleaved (one call of each program per round, each round the mean of
enough calls to last ~20 ms), median of the rounds. A 1x1x1 matmul program gives the
per-call floor (the Python call and the delegate's binding), reported beside.

Writes ``bench/results/batched_matmul_rate.md``.
"""

from __future__ import annotations

import datetime
import math
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from machine import describe_machine  # noqa: E402

ROUNDS = 7
ROUND_S = 0.02

# swin_t (torchvision/models/swin_transformer.py, shifted_window_attention: q, k, v are
# [B * windows, heads, 49, C / heads]; attn = q @ k^T, then attn @ v): embed 96, heads
# 3/6/12/24, window 7x7 = 49 tokens, head dim 32, 56/28/14/7 tokens a side at 224, so
# 64/16/4/1 windows per stage.
# coat_lite_tiny (timm/models/coat.py, FactorAttnConvRelPosEnc: factor = softmax(k)^T @ v,
# then q @ factor, per head [B, 8, N, C / 8]): dims 64/128/256/320, 8 heads, N = 56^2+1,
# 28^2+1, 14^2+1, 7^2+1 tokens (with the class token).
SHAPES = []
for stage, (windows, heads) in enumerate(((64, 3), (16, 6), (4, 12), (1, 24)), 1):
    SHAPES.append(("swin_t", f"stage {stage} q@k^T", (windows, heads), 49, 32, 49))
    SHAPES.append(("swin_t", f"stage {stage} attn@v", (windows, heads), 49, 49, 32))
for stage, (side, dim) in enumerate(((56, 64), (28, 128), (14, 256), (7, 320)), 1):
    tokens, ch = side * side + 1, dim // 8
    SHAPES.append(("coat_lite_tiny", f"stage {stage} k^T@v", (1, 8), ch, tokens, ch))
    SHAPES.append(("coat_lite_tiny", f"stage {stage} q@factor", (1, 8), tokens, ch, ch))


class _MatMul(torch.nn.Module):
    def forward(self, a, b):
        return torch.matmul(a, b)


def _program(a_shape, b_shape):
    """(a zero-argument call of the exported one-matmul program, its engine implementations)."""
    from opforge.backends.cpu.engine import program_impls
    from opforge.export import export
    from opforge.runtime import load

    rng = np.random.default_rng(0)
    a = rng.standard_normal(a_shape).astype(np.float32)
    b = rng.standard_normal(b_shape).astype(np.float32)
    program = export(_MatMul(), (torch.from_numpy(a), torch.from_numpy(b)), backends=["cpu"])
    forward = load(program).method("forward")
    (got,) = forward(a, b)
    if not np.allclose(np.asarray(got), a @ b, rtol=1e-4, atol=1e-3 * math.sqrt(a_shape[-1])):
        raise AssertionError(f"matmul {a_shape} @ {b_shape}: wrong result")
    impls = sorted({impl or "own" for _, impl in program_impls(program)})
    return (lambda: forward(a, b)), ", ".join(impls)


def _time(calls: dict) -> dict[str, float]:
    """Each call's median seconds per call over interleaved rounds."""
    counts = {}
    for name, call in calls.items():
        call()
        t0 = time.perf_counter()
        call()
        counts[name] = max(1, int(ROUND_S / max(time.perf_counter() - t0, 1e-7)))
    seconds: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(ROUNDS):
        for name, call in calls.items():
            t0 = time.perf_counter()
            for _ in range(counts[name]):
                call()
            seconds[name].append((time.perf_counter() - t0) / counts[name])
    return {name: statistics.median(s) for name, s in seconds.items()}


def main() -> int:
    torch.set_num_threads(1)
    floor_call, _ = _program((1, 1), (1, 1))
    rows = []
    for model, site, batch, m, k, n in SHAPES:
        count = math.prod(batch)
        batched, batched_impl = _program((*batch, m, k), (*batch, k, n))
        flat, flat_impl = _program((count * m, k), (k, n))
        t = _time({"floor": floor_call, "batched": batched, "flat": flat})
        flops = 2.0 * count * m * k * n
        row = dict(model=model, site=site, batch=batch, m=m, k=k, n=n, mflop=flops / 1e6,
                   batched_us=t["batched"] * 1e6, flat_us=t["flat"] * 1e6,
                   floor_us=t["floor"] * 1e6,
                   batched_gflops=flops / t["batched"] / 1e9, flat_gflops=flops / t["flat"] / 1e9,
                   ratio=t["flat"] / t["batched"], batched_impl=batched_impl, flat_impl=flat_impl)
        rows.append(row)
        print(f"{model:15s} {site:20s} {row['batched_gflops']:6.1f} {row['flat_gflops']:6.1f} "
              f"GFLOP/s ratio {row['ratio']:.2f} (floor {row['floor_us']:.1f} us)", flush=True)
    _write(rows)
    return 0


def _write(rows: list[dict]) -> None:
    machine = describe_machine(HERE.parent)
    lines = ["| model | matmul | batch x [M, K] @ [K, N] | MFLOP | batched µs | batched GFLOP/s | "
             "2-d µs | 2-d GFLOP/s | batched / 2-d rate | implementations (batched; 2-d) |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['site']} | {'x'.join(map(str, r['batch']))} x "
                     f"[{r['m']}, {r['k']}] @ [{r['k']}, {r['n']}] | {r['mflop']:.2f} | "
                     f"{r['batched_us']:.1f} | {r['batched_gflops']:.1f} | {r['flat_us']:.1f} | "
                     f"{r['flat_gflops']:.1f} | {r['ratio']:.2f} | {r['batched_impl']}; "
                     f"{r['flat_impl']} |")
    per_model = []
    for model in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == model]
        flops = sum(r["mflop"] for r in mine)
        batched = sum(r["batched_us"] for r in mine)
        flat = sum(r["flat_us"] for r in mine)
        per_model.append(f"- {model}: {flops:.1f} MFLOP over its {len(mine)} distinct "
                         f"batched matmuls (one of each) at {flops / batched * 1e3:.1f} GFLOP/s "
                         f"batched, {flops / flat * 1e3:.1f} GFLOP/s as 2-d matmuls "
                         f"(ratio {flat / batched:.2f})")
    floor = statistics.median(r["floor_us"] for r in rows)
    load = os.getloadavg()
    text = (
        "# Batched small matmuls against one 2-d matmul of the same FLOPs (issue 47, item 3)\n\n"
        f"Written by `bench/batched_matmul_rate.py` on {datetime.date.today()} at commit "
        f"{machine['opforge_commit']}; {machine['cpu']} (Zen 4, AVX-512, {machine['cores']} "
        "cores shared with other work), one thread (`OMP_NUM_THREADS=1`, "
        "`OPFORGE_NUM_THREADS=1`), run at nice 10 while a CI run and a fuzzer shared the "
        f"machine (load average at the end {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}).\n\n"
        "Each row: a one-matmul program exported with `backends=[\"cpu\"]` on the lean "
        "runtime, the batched matmul and the 2-d matmul `[batch * M, K] @ [K, N]` of the same "
        f"FLOPs, interleaved, median of {ROUNDS} rounds (each ~{ROUND_S * 1e3:.0f} ms of calls). "
        "Times are whole calls from Python: the per-call floor (a 1x1x1 matmul program) was "
        f"{floor:.1f} µs (median over the rows) and is inside every number (under a tenth of "
        "the smallest row). `own` among the batched programs' implementations is a `copy` op "
        "on the engine's own kernels after the oneDNN matmul (the 2-d programs have none): "
        "its time is inside the batched column. Shapes from the "
        "models' sources at 224x224 (see the bench's docstring): swin_t's windows of 49 "
        "tokens, coat_lite_tiny's factorised attention per head (8 heads).\n\n"
        + "\n".join(lines) + "\n\nPer model:\n\n" + "\n".join(per_model) + "\n")
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "batched_matmul_rate.md").write_text(text)
    print(text)


if __name__ == "__main__":
    sys.exit(main())
