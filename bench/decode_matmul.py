"""Decode-shaped matmuls on the cpu backend's engine: a few rows (1-8) against a decoder's
weights, float32 on oneDNN's matmul beside the engine's own kernels, per shape, 1 thread.

    OMP_NUM_THREADS=1 .venv/bin/python bench/decode_matmul.py
    .venv/bin/python bench/decode_matmul.py --rows 1 4 --shapes 768x2048

Each kernel is an engine plan of one op written by hand (the plan the lowering emits for
a linear layer): ``matmul`` of [M, K] by a constant [K, N] on oneDNN's matmul
(``OPFORGE_CPU_DECODE_MATMUL=0``) and on the engine's decode-shaped kernel, which reads
the same reordered weights (``native/small_matmul.cpp``; the engine takes it for these
shapes), ``int_matmul`` of int8 per-channel and int4 blocks-of-32 weights
(``native/int_matmul.cpp``), the same int4 weights against activations on a 16-bit grid
(``int_matmul``'s int16 mode, what a 16a4w_block program runs: ``native/int_matmul16.cpp``,
int16 dot products: AVX512-VNNI, else AVX2's vpmaddwd), and ``int_dot_matmul`` of int8 activations quantized per
block of 32 in the call against int8 and int4 blocks-of-32 weights (schemes 8da8w and 8da4w:
``native/int_dot_matmul.cpp``, integer dot products, AVX512-VNNI where the CPU has it). A decode
step reads each weight once, from memory: the weights of a real decoder (hundreds of MB)
are not in any cache. So each kind is timed round-robin over enough copies of its weights
to pass 160 MB (each copy its own engine), and the time per call is the median over
rounds, by the calling thread's CPU time (the engine runs a 1-thread op on it: on a shared
machine this leaves out the time other processes held the core); GB/s is the weight bytes
one call reads (scales included) over that time.
Prints a table and writes ``results/decode_matmul.md`` with the machine.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys
import time

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests" / "backends"))

from machine import describe_machine  # noqa: E402

SHAPES = ("768x768", "768x256", "768x2048", "2048x768", "768x32000")
KINDS = ("float32 (oneDNN)", "float32 (own)", "int8 per channel", "int4 block 32",
         "int4 block 32, int16 a", "8da8w (int dot)", "8da4w (int dot)")
GRID = 4.0 / 32767  # the int16 kind's activation grid: fl(i·GRID), |i| <= 32767
TOTAL = 160 << 20


def plan(kind: str, m: int, k: int, n: int, seed: int):
    import test_cpu_hostile_plans as hostile
    import torch

    from opforge.backends.cpu.lowering.int_weights import IntWeight

    rng = np.random.default_rng(seed)
    p = hostile.Plan()
    a = p.tensor(hostile.F32, [m, k], role="input")
    y = p.tensor(hostile.F32, [m, n], role="output")
    if kind.startswith("float32"):
        w = rng.standard_normal((k, n)).astype(np.float32)
        p.op("matmul", [a, p.const(w)], [y])
        return p, w.nbytes
    if kind.startswith("8da"):
        from opforge.backends.cpu.lowering.int_dot import pack

        bits = 8 if kind.startswith("8da8w") else 4
        top = 127 if bits == 8 else 7
        q = torch.from_numpy(rng.integers(-top - 1, top + 1, (n, k)).astype(np.int8))
        scales = torch.from_numpy(rng.random((n, k // 32)).astype(np.float32) * 0.01)
        packed, panel_scales = pack(IntWeight(q, scales, 32, bits))
        p.op("int_dot_matmul", [a, p.const(packed.numpy()), p.const(panel_scales.numpy())], [y],
             ia=[bits, 32], fa=[2.0 ** -64])
        return p, packed.numel() + panel_scales.numel() * 4
    bits, group = (8, k) if kind.startswith("int8") else (4, 32)
    top = 127 if bits == 8 else 7
    q = torch.from_numpy(rng.integers(-top, top + 1, (n, k)).astype(np.int8))
    scales = torch.from_numpy(rng.random((n, -(-k // group))).astype(np.float32) * 0.01)
    packed, panel_scales = IntWeight(q, scales, group, bits).packed()
    p.op("int_matmul", [a, p.const(packed.numpy()), p.const(panel_scales.numpy())], [y],
         ia=[bits, group], fa=[GRID] if "int16" in kind else [])
    return p, packed.numel() + panel_scales.numel() * 4


def time_kind(kind: str, m: int, k: int, n: int, rounds: int) -> tuple[float, int, str]:
    import test_cpu_hostile_plans as hostile
    from opforge.backends.cpu.binding import Binding

    first, nbytes = plan(kind, m, k, n, 0)
    copies = max(1, min(200, -(-TOTAL // nbytes)))
    own_off = ("OPFORGE_CPU_DECODE_MATMUL", "OPFORGE_CPU_MATMUL_AVX2")  # AVX-512, AVX2
    if kind == "float32 (oneDNN)":  # read when each op is built
        os.environ.update({name: "0" for name in own_off})
    try:
        handles = [first.handle()] + [plan(kind, m, k, n, i)[0].handle() for i in range(1, copies)]
    finally:
        for name in own_off:
            os.environ.pop(name, None)
    x = np.random.default_rng(1).standard_normal((m, k)).astype(np.float32)
    if "int16" in kind:  # on the grid the op's fa names
        x = np.round(x / GRID).astype(np.float32) * np.float32(GRID)
    calls = [Binding(h, [x], [np.zeros((m, n), np.float32)]) for h in handles]
    for call in calls:  # warm: first-run work, page faults
        call()
    per_call = []
    for _ in range(rounds):
        start = time.thread_time()
        for call in calls:
            call()
        per_call.append((time.thread_time() - start) / len(calls))
    impl = [str(line) for line in handles[0].describe()]
    del calls
    for handle in handles:  # (an engine holds its weights until closed)
        handle.close()
    return statistics.median(per_call), nbytes, next((l for l in impl if "matmul" in l), "")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), help="KxN")
    parser.add_argument("--rows", nargs="+", type=int, default=[1, 2, 4, 8])
    parser.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=pathlib.Path, default=HERE / "results")
    args = parser.parse_args(argv)
    lines = ["| K×N | M | " + " | ".join(f"{k} µs (GB/s)" for k in args.kinds) + " |",
             "| --- | ---: |" + " ---: |" * len(args.kinds)]
    for shape in args.shapes:
        k, n = (int(v) for v in shape.split("x"))
        for m in args.rows:
            cells = []
            for kind in args.kinds:
                seconds, nbytes, _ = time_kind(kind, m, k, n, args.rounds)
                cells.append(f"{seconds * 1e6:.1f} ({nbytes / seconds / 1e9:.1f})")
            lines.append(f"| {shape} | {m} | " + " | ".join(cells) + " |")
            print(lines[-1], flush=True)
    machine = describe_machine(HERE.parent)
    text = "\n".join([
        "# Decode-shaped matmuls (cpu backend engine, 1 thread)", "",
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {machine['cpu']}, {machine['cores']} cores, "
        f"load average {machine['load_average'][0]:.2f}; opforge {machine['opforge_commit']}; "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}. "
        "`bench/decode_matmul.py` says what each column is.", "", *lines]) + "\n"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "decode_matmul.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
