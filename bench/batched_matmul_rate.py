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

Second table (the layouts the models hand the matmul): in the models an operand is a head
view of a fused projection (coat_lite_tiny's ``q`` is ``[8, N, C/8]`` with strides ``[C/8,
3C, 1]`` inside ``qkv``; swin_t's ``v`` likewise), and the lowering copies such a view to a
dense one before oneDNN's matmul (``lowering/matmul.py``, ``_matmul_operand``). Timed: that
program against one where oneDNN reads the strided view itself (the lowering's operand rule
relaxed for the run, ``_strided_operands``), each the whole pattern (view, matmul, the
transpose back and an add), interleaved as above.

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


class _QFactor(torch.nn.Module):
    """coat_lite_tiny's ``q @ factor`` on the head view of ``qkv`` ([1, N, 3C]), back to [1, N, C]."""

    def __init__(self, heads: int, ch: int):
        super().__init__()
        self.heads, self.ch = heads, ch

    def forward(self, qkv, factor):
        n = qkv.shape[1]
        q = qkv[..., : self.heads * self.ch].reshape(1, n, self.heads, self.ch).transpose(1, 2)
        return (q @ factor).transpose(1, 2).reshape(1, n, self.heads * self.ch) + 1.0


class _AttnV(torch.nn.Module):
    """swin_t stage 1's ``attn @ v`` on the head view of ``qkv`` ([windows, 49, 3 * 96])."""

    def forward(self, attn, qkv):
        b, n, _ = qkv.shape
        v = qkv.reshape(b, n, 3, 3, 32).permute(2, 0, 3, 1, 4)[2]
        return (attn @ v).transpose(1, 2).reshape(b, n, 96) + 1.0


LAYOUTS = [("swin_t", "stage 1 attn@v, v a head view", _AttnV(), ((64, 3, 49, 49), (64, 49, 288)))]
for _side, _dim in ((56, 64), (28, 128), (14, 256), (7, 320)):
    LAYOUTS.append(("coat_lite_tiny", f"q@factor N={_side * _side + 1}, q a head view",
                    _QFactor(8, _dim // 8), ((1, _side * _side + 1, 3 * _dim), (1, 8, _dim // 8, _dim // 8))))


def _strided_operands(enabled: bool) -> None:
    """Let oneDNN's matmul read any operand whose rows are contiguous (no dense copy) while
    ``enabled``: the alternative the second table times."""
    from opforge.backends.cpu.lowering import matmul
    from opforge.backends.cpu.lowering.core import known, same

    original = getattr(_strided_operands, "original", None) or matmul._matmul_operand
    _strided_operands.original = original

    def strided(L, tid):
        t = L.spec(tid)
        if len(t.dims) >= 2 and t.role != "const" and same(t.strides[-1], 1) and \
                known(lambda: t.strides[-2] >= t.dims[-1]):
            return tid
        return original(L, tid)

    matmul._matmul_operand = strided if enabled else original


def _program(a_shape, b_shape, module=None):
    """(a zero-argument call of the exported program, its engine ops as ``kind [impl]``):
    one matmul ``a @ b``, or ``module`` on inputs of those shapes."""
    from opforge.backends.cpu.engine import program_impls
    from opforge.export import export
    from opforge.runtime import load

    rng = np.random.default_rng(0)
    a = rng.standard_normal(a_shape).astype(np.float32)
    b = rng.standard_normal(b_shape).astype(np.float32)
    module = module or _MatMul()
    program = export(module, (torch.from_numpy(a), torch.from_numpy(b)), backends=["cpu"])
    forward = load(program).method("forward")
    (got,) = forward(a, b)
    with torch.no_grad():
        want = module(torch.from_numpy(a), torch.from_numpy(b)).numpy()
    k = a_shape[-1]
    if not np.allclose(np.asarray(got), want, rtol=1e-4, atol=1e-3 * math.sqrt(k)):
        raise AssertionError(f"{type(module).__name__} {a_shape}, {b_shape}: wrong result")
    ops = ", ".join(f"{kind} [{impl or 'own'}]" for kind, impl in program_impls(program))
    return (lambda: forward(a, b)), ops


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
    layouts = []
    for model, site, module, (a_shape, b_shape) in LAYOUTS:
        copied, copied_ops = _program(a_shape, b_shape, module)
        _strided_operands(True)
        try:
            strided, strided_ops = _program(a_shape, b_shape, module)
        finally:
            _strided_operands(False)
        t = _time({"copied": copied, "strided": strided})
        layouts.append(dict(model=model, site=site, copied_us=t["copied"] * 1e6,
                            strided_us=t["strided"] * 1e6, copied_ops=copied_ops,
                            strided_ops=strided_ops))
        print(f"{model:15s} {site:36s} copy {t['copied'] * 1e6:8.1f} us, strided "
              f"{t['strided'] * 1e6:8.1f} us", flush=True)
    _write(rows, layouts)
    return 0


def _write(rows: list[dict], layouts: list[dict]) -> None:
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
    layout_lines = ["| model | pattern | operand copied, µs | strided operand, µs | copied / strided | "
                    "engine ops (copied; strided) |", "| --- | --- | ---: | ---: | ---: | --- |"]
    for r in layouts:
        layout_lines.append(f"| {r['model']} | {r['site']} | {r['copied_us']:.1f} | "
                            f"{r['strided_us']:.1f} | {r['copied_us'] / r['strided_us']:.2f} | "
                            f"{r['copied_ops']}; {r['strided_ops']} |")
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
        "the smallest row). Shapes from the models' sources at 224x224 (see the bench's "
        "docstring): swin_t's windows of 49 tokens, coat_lite_tiny's factorised attention "
        "per head (8 heads).\n\n"
        + "\n".join(lines) + "\n\nPer model:\n\n" + "\n".join(per_model) + "\n\n"
        "The layouts the models hand the matmul (each row a whole pattern: the head view of "
        "a fused projection, the matmul, the transpose back and an add): the lowering's "
        "dense copy of the strided operand before oneDNN's matmul, against oneDNN reading the "
        "strided view itself.\n\n" + "\n".join(layout_lines) + "\n")
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "batched_matmul_rate.md").write_text(text)
    print(text)


if __name__ == "__main__":
    sys.exit(main())
