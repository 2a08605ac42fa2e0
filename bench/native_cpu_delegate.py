"""The cpu backend's call from C (the native runtime's DelegateSet, src/backend_cpu.cpp)
against the Python runtime's call of the same program (issue 44, item 2(b)).

    python bench/native_cpu_delegate.py [--batch 20000] [--rounds 7] [--tokens 64]

- ``add 1x4``: a program that is one cpu DelegateCall of ``x + y`` on 1x4 float32: the
  Python runtime's method call (its fastcall path, cpu/fastcall.py, where the extension
  is in use), the native delegate call from C (DelegateSet::call: the view checks, the
  per-delegate lock and ofc_execute, timed in C by the test probe's probe_bench), and the
  whole native runtime from C (``opforge-run --repeat``: set the inputs + execute);
- ``decode``: a TinyDecoder's decode step (one DelegateCall writing its KV cache in
  place): greedy tokens/s through the Python runtime and through the native delegate
  (the probe; the token's argmax in NumPy, as the Python loop does it).

The probe (tests/native_runtime/cpu_delegate_probe.cpp) gives DelegateSet an in-memory
program: the executor around it is not timed. Each figure is the best of ``--rounds``.
"""

from __future__ import annotations

import argparse
import ctypes
import sys
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "native_runtime"))


def best_ns(call, batch: int, rounds: int) -> float:
    for _ in range(min(batch, 2000)):
        call()
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter_ns()
        for _ in range(batch):
            call()
        best = min(best, (time.perf_counter_ns() - start) / batch)
    return best


def _export(model, inputs, **kwargs):
    from opforge.export import export
    from opforge.program import from_bytes, to_bytes

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return from_bytes(to_bytes(export(model, inputs, kernels="portable", backends=["cpu"], **kwargs)))


def _probe():
    import tempfile

    import test_native_cpu_delegate as T

    from opforge.native_runtime.build import build_runtime

    return T, T.build_probe(build_runtime(), Path(tempfile.mkdtemp(prefix="probe")))


def _views(T, arrays):
    views = (T.Tensor * len(arrays))()
    keep = []
    for k, a in enumerate(arrays):
        sizes = (ctypes.c_int64 * max(a.ndim, 1))(*a.shape)
        keep.append(sizes)
        views[k] = T.Tensor(a.ctypes.data, sizes, None, T._dtype_number(a.dtype), a.ndim)
    return views, keep


def tiny_call(T, lib, batch, rounds) -> None:
    import torch

    from opforge.runtime import load

    class Add(torch.nn.Module):
        def forward(self, x, y):
            return x + y

    x, y = torch.ones(1, 4), torch.ones(1, 4)
    program = _export(Add(), (x, y))
    forward = load(program).method("forward")
    xa, ya = x.numpy(), y.numpy()
    python = best_ns(lambda: forward(xa, ya), batch, rounds)
    d = program.delegates[0]
    native = T.NativeDelegate(lib, bytes(program.segments[d.segment].data), d.compile_specs, {})
    assert native.status == 0, native.error
    out = np.zeros((1, 4), np.float32)
    views, keep = _views(T, [xa, ya, out])
    c_ns = min(lib.probe_bench(native.ptr, views, 3, batch) for _ in range(rounds))
    assert out.tolist() == [[2.0] * 4]
    native.close()
    print(f"add 1x4 (one cpu DelegateCall): Python runtime call {python / 1e3:.2f} µs, "
          f"native delegate call from C {c_ns / 1e3:.3f} µs, opforge-run {_tool_us(program, xa)}")


def _tool_us(program, x) -> str:
    """opforge-run's own median and minimum per call (set inputs + execute) on ``program``."""
    import os
    import re
    import subprocess
    import tempfile

    import test_native_cpu_delegate as T

    from opforge.backends.cpu.engine import onednn_prefix
    from opforge.native_runtime.build import build_runtime
    from opforge.program import save

    with tempfile.TemporaryDirectory() as folder:
        save(program, os.path.join(folder, "p.opf"))
        np.save(os.path.join(folder, "x.npy"), x)
        env = dict(os.environ, OPFORGE_CPU_ENGINE=str(T._engine_path()),
                   LD_LIBRARY_PATH=str(onednn_prefix() / "lib"))
        out = subprocess.run([str(build_runtime().tool("opforge-run")), os.path.join(folder, "p.opf"),
                              "--input", os.path.join(folder, "x.npy"), "--input",
                              os.path.join(folder, "x.npy"), "--repeat", "100000"],
                             capture_output=True, text=True, check=True, env=env)
    match = re.search(r"median ([\d.]+) us.*min ([\d.]+) us", out.stdout)
    return f"median {match.group(1)} µs (min {match.group(2)} µs)"


def decode(T, lib, tokens: int, rounds: int) -> None:
    import torch

    from opforge.examples.decoder import TinyDecoder
    from opforge.runtime import load
    from opforge.backends.cpu import blob as B

    model = TinyDecoder(vocab=512, dim=256, heads=8, kv_heads=4, hidden=768, layers=4,
                        max_len=tokens + 1, seed=7).eval()
    program = _export(model, (torch.tensor([0]), torch.tensor([0])))

    def python_run() -> list[int]:
        token, out = 1, []
        for pos in range(tokens):
            logits = step(np.array([token]), np.array([pos]))[0]
            token = int(np.argmax(logits.reshape(-1)[-512:]))
            out.append(token)
        return out

    d = program.delegates[0]
    plan, _ = B.parse(program.segments[d.segment].data)
    native = T.NativeDelegate(lib, bytes(program.segments[d.segment].data), d.compile_specs,
                              T._named(program))
    assert native.status == 0, native.error
    ins, outs = T._call_arrays(plan, 0)
    views, keep = _views(T, [*ins, *outs])  # the arrays stay in place: views made once
    err = ctypes.create_string_buffer(1024)
    logits = outs[-1].reshape(-1)

    def native_run() -> list[int]:
        for a in ins[2:]:
            a[...] = 0
        token, out = 1, []
        for pos in range(tokens):
            ins[0][...] = token
            ins[1][...] = pos
            rc = lib.probe_call(native.ptr, views, len(ins) + len(outs), err, 1024)
            assert rc == 0, err.value
            token = int(np.argmax(logits[-512:]))
            out.append(token)
        return out

    best_py = best_native = float("inf")
    for _ in range(rounds):
        loaded = load(program)
        step = loaded.method("forward")
        start = time.perf_counter()
        want = python_run()
        best_py = min(best_py, time.perf_counter() - start)
        start = time.perf_counter()
        got = native_run()
        best_native = min(best_native, time.perf_counter() - start)
    native.close()
    same = "same tokens" if got == want else f"DIFFERENT tokens {got[:8]} vs {want[:8]}"
    print(f"decode (TinyDecoder dim 256, 4 layers, {tokens} tokens): Python runtime "
          f"{tokens / best_py:.0f} tokens/s, native delegate {tokens / best_native:.0f} tokens/s ({same})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    T, lib = _probe()
    tiny_call(T, lib, args.batch, args.rounds)
    decode(T, lib, args.tokens, args.rounds)


if __name__ == "__main__":
    main()
