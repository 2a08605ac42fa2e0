"""The cpu engine's attention op (native/attention.cpp) alone: µs per call at one query row.

A hand-built plan holds ``--chain`` attention ops one after another (each op's output is
the next one's query: a convex mix of value rows, so the values stay bounded) over one
cache of ``--slots`` positions, K/V heads ``--kv-heads``, query heads ``--heads``, head size
``--head-dim`` (default: bench/llm_models.py's ``base``: 12 heads, 4 KV heads, 64, beside a
2,048-slot cache). The chain makes the Python call's overhead a small share; one call's
process CPU time / chain is reported, the median of ``--rounds`` rounds, every (position,
cache dtype, engine) interleaved in each round.

``--baseline PATH`` times an engine library built from other sources (a copy of an
earlier ``libopforge_cpu.*.so``) beside the current one in the same rounds: before/after
ratios measured in one process under one load.

    OMP_NUM_THREADS=1 .venv/bin/python bench/attention_op.py --baseline /tmp/before.so \
        --out bench/results/decode_positions_attention_op.md

``--out`` appends the table as a new dated section to a markdown file.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import describe_machine  # noqa: E402

from opforge.backends.cpu import blob, engine  # noqa: E402
from opforge.backends.cpu.binding import Binding  # noqa: E402
from opforge.backends.cpu.lowering.core import Plan, TensorSpec  # noqa: E402
from opforge.backends.cpu.lowering.layouts import row_major  # noqa: E402

DTYPES = {"float32": (torch.float32, np.float32), "float16": (torch.float16, np.float16)}


def attention_plan(heads, kv_heads, head_dim, slots, rows, cache_dtype, chain,
                   slots_first=False) -> bytes:
    """q [H, rows, D], k, v [Hkv, S, D] of ``cache_dtype`` (``slots_first``: views of caches
    [S, Hkv, D], the bundled decoder's layout), positions i64 [rows] → ``chain`` attention
    ops, each reading the last one's output as its query."""
    plan = Plan()

    def tensor(dtype, dims, role, strides=None, base=-1):
        plan.tensors.append(TensorSpec(dtype, tuple(dims), strides or row_major(dims), role, base))
        tid = len(plan.tensors) - 1
        (plan.inputs if role == "input" else plan.outputs if role == "output" else []).append(tid)
        return tid

    def cache():
        if not slots_first:
            return tensor(cache_dtype, (kv_heads, slots, head_dim), "input")
        whole = tensor(cache_dtype, (slots, kv_heads, head_dim), "input")
        return tensor(cache_dtype, (kv_heads, slots, head_dim), "alias",
                      (head_dim, kv_heads * head_dim, 1), whole)

    q = tensor(torch.float32, (heads, rows, head_dim), "input")
    k, v = cache(), cache()
    pos = tensor(torch.int64, (rows,), "input")
    for c in range(chain):
        out = tensor(torch.float32, (heads, rows, head_dim), "output" if c == chain - 1 else "temp")
        plan.ops.append({"kind": "attention", "in": [q, k, v, pos], "out": [out], "ia": [0],
                         "fa": [float(head_dim) ** 0.5], "post": [], "name": f"attention {c}"})
        q = out
    return blob.encode(plan)


def load_library(path: str):
    """Another engine library beside the current one: a private copy, so dlopen gives it
    its own handle and symbols."""
    engine.library()  # oneDNN loaded, the current engine declared
    copy = Path(tempfile.mkdtemp()) / "engine_baseline.so"
    shutil.copy(path, copy)
    lib = ctypes.CDLL(str(copy))
    engine._declare(lib)
    return lib


def handle_on(lib, blob_bytes: bytes, threads: int):
    plan, data = blob.parse(memoryview(blob_bytes))
    saved = engine._lib
    engine._lib = lib  # EngineHandle takes library(); its calls then go through handle.lib
    try:
        return engine.EngineHandle(plan, data, threads, 0, None, {})
    finally:
        engine._lib = saved


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--slots", type=int, default=2048)
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--positions", type=int, nargs="+", default=[10, 128, 1000])
    ap.add_argument("--dtypes", nargs="+", default=["float32", "float16"], choices=list(DTYPES))
    ap.add_argument("--chain", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--calls", type=int, default=20, help="calls per round and case")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--slots-first", action="store_true",
                    help="caches [S, KV heads, D] (the bundled decoder's), else [KV heads, S, D]")
    ap.add_argument("--baseline", help="an earlier engine library to time beside the current")
    ap.add_argument("--label", default="", help="what the engines are (the section's title)")
    ap.add_argument("--out", type=Path, help="a markdown file to append the table to")
    args = ap.parse_args()

    engines = {"current": engine.library()}
    if args.baseline:
        engines["baseline"] = load_library(args.baseline)
    rng = np.random.default_rng(0)
    cases = {}
    for dtype in args.dtypes:
        torch_dtype, np_dtype = DTYPES[dtype]
        plan = attention_plan(args.heads, args.kv_heads, args.head_dim, args.slots, args.rows,
                              torch_dtype, args.chain, args.slots_first)
        shape = ((args.slots, args.kv_heads, args.head_dim) if args.slots_first else
                 (args.kv_heads, args.slots, args.head_dim))
        k, v = (rng.standard_normal(shape).astype(np_dtype) for _ in range(2))
        q = rng.standard_normal((args.heads, args.rows, args.head_dim)).astype(np.float32)
        outs = {}
        for name, lib in engines.items():
            handle = handle_on(lib, plan, args.threads)
            for p in args.positions:
                pos = np.arange(p - args.rows + 1, p + 1, dtype=np.int64)
                o = np.zeros_like(q)
                cases[(dtype, p, name)] = Binding(handle, [q, k, v, pos], [o])
                outs[(p, name)] = o
        for p in args.positions:  # the engines agree (float rounding)
            if len(engines) > 1:
                cases[(dtype, p, "current")]()
                cases[(dtype, p, "baseline")]()
                diff = np.abs(outs[(p, "current")] - outs[(p, "baseline")]).max()
                assert diff < 1e-4, f"engines differ by {diff} at {dtype} position {p}"
    times = {key: [] for key in cases}
    for _ in range(args.rounds):
        for key, call in cases.items():
            call()
            start = time.process_time()
            for _ in range(args.calls):
                call()
            times[key].append((time.process_time() - start) / args.calls / args.chain * 1e6)

    machine = describe_machine(Path(__file__).resolve().parent.parent)
    lines = [f"## {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: attention op, "
             f"{args.rows} query row(s), µs a call{': ' + args.label if args.label else ''}", "",
             f"{machine['cpu']}, {machine['cores']} cores (flags {' '.join(machine['flags'])}), "
             f"load average {os.getloadavg()[0]:.2f}; {args.threads} thread(s), "
             f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}; {args.heads} heads, "
             f"{args.kv_heads} KV heads, head_dim {args.head_dim}, a {args.slots}-slot cache "
             f"{'[S, KV heads, D]' if args.slots_first else '[KV heads, S, D]'}; "
             f"median of {args.rounds} rounds of process CPU time, every case and engine "
             f"interleaved in each round, {args.chain} ops a call (`bench/attention_op.py`).", ""]
    names = list(engines)
    head = "| cache | position | " + " | ".join(f"{n} (µs)" for n in names) + \
        (" | baseline / current |" if len(names) > 1 else " |")
    lines += [head, "| --- | ---: |" + " ---: |" * (len(names) + (len(names) > 1))]
    for dtype in args.dtypes:
        for p in args.positions:
            med = {name: statistics.median(times[(dtype, p, name)]) for name in names}
            cells = " | ".join(f"{med[n]:.2f}" for n in names)
            ratio = f" | {med['baseline'] / med['current']:.2f}x |" if len(names) > 1 else " |"
            lines.append(f"| {dtype} | {p} | {cells}{ratio}")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "a") as f:
            f.write(("\n" if args.out.exists() and args.out.stat().st_size else "") + text)

if __name__ == "__main__":
    main()
