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

    python bench/native_cpu_delegate.py --generate base [--write]

- ``--generate CONFIG``: instead, decode tokens/s of bench/llm.py's ``CONFIG`` decoder
  (``base``: 125M parameters) exported with the cpu backend, from ``opforge-generate`` (no
  Python) against the Python cpu path (``opforge.runtime.generate``, executor='lean') and
  the native binding (executor='native'): one process each at 1 thread on one pinned core,
  interleaved over ``--rounds`` (3 by default here), each generating ``--repeat`` times and
  reporting its median; start-up (process, load, verification) apart. ``--write`` records
  the table in bench/results/native_generate.md with the machine.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "native_runtime"))
sys.path.insert(0, str(ROOT / "bench"))


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



# --- generation: opforge-generate against the Python cpu path --------------------------------

_PY_WORKER = r"""
import json, statistics, sys, time
t0 = time.perf_counter()
from opforge.runtime import load
from opforge.runtime.generate import Generator
path, executor, repeat, new = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
prompt = json.loads(sys.argv[5])
generator = Generator(load(path, executor=executor))
ready = time.perf_counter() - t0
runs, cpu = [], []
for _ in range(repeat):
    marks = []  # CPU time at the first new token (the prefill's) and at the end
    runs.append(generator.generate(prompt, new, on_token=lambda t: marks.append(time.process_time())))
    cpu.append((runs[-1].decode_steps, time.process_time() - marks[0]))
print(json.dumps({"ready_s": ready, "tokens": list(runs[0].tokens),
                  "decode": [r.decode_tokens_per_s for r in runs],
                  "decode_cpu": statistics.median(s / c for s, c in cpu),
                  "prefill": [r.prefill_tokens_per_s for r in runs]}))
"""


def _decoder_program(config: str) -> Path:
    """bench/llm.py's cpu program of ``config`` (a dynamic prefill and a one-token decode,
    delegated to the cpu backend), exported once into bench/work/."""
    import torch

    from llm_models import build, prompt
    from opforge.export import export
    from opforge.program import save

    path = ROOT / "bench" / "work" / "native_generate" / f"{config}_cpu.opf"
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    model = build(config)
    seq = torch.export.Dim("seq", min=1, max=model.max_len)
    example = (torch.tensor(prompt(config)[:3]), torch.arange(3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = export(None, methods={"prefill": (model, example, ({0: seq}, {0: seq})),
                                        "decode": (model, (torch.tensor([0]), torch.tensor([0])))},
                         kernels="portable", backends=["cpu"])
    save(program, str(path) + ".part")
    os.replace(str(path) + ".part", path)
    return path


def _pinned(env: dict) -> list[str]:
    cpu = sorted(os.sched_getaffinity(0))[-1]
    env.update({name: "1" for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                                       "OPFORGE_NUM_THREADS")})
    return ["taskset", "-c", str(cpu)]


def generation(config: str, new_tokens: int, repeat: int, rounds: int) -> list[str]:
    """Decode tokens/s of ``config``'s cpu program: opforge-generate (C, no Python) against
    the Python cpu path (opforge.runtime.generate on executor='lean') and the native binding
    (executor='native'), each in its own process at 1 thread on one pinned core, interleaved
    over ``rounds``; each process generates ``repeat`` times from a fresh state and reports
    its median (start-up apart: interpreter or process start, load, first call setup)."""
    import json
    import subprocess

    from llm_models import prompt
    from opforge.backends.cpu import engine
    from opforge.backends.cpu.engine import onednn_prefix
    from opforge.native_runtime.build import build_runtime

    path = _decoder_program(config)
    ids = prompt(config)
    tool = build_runtime().tool("opforge-generate")
    env = dict(os.environ, OPFORGE_CPU_ENGINE=engine.library()._name,
               LD_LIBRARY_PATH=str(onednn_prefix() / "lib"), PYTHONWARNINGS="ignore")
    pin = _pinned(env)
    results: dict[str, list] = {"opforge-generate": [], "python lean": [], "python native": []}
    for _ in range(rounds):
        for label in results:
            start = time.perf_counter()
            if label == "opforge-generate":
                out = subprocess.run([*pin, str(tool), str(path), "--tokens", ",".join(map(str, ids)),
                                      "--max-new-tokens", str(new_tokens), "--repeat", str(repeat), "--json"],
                                     capture_output=True, text=True, env=env, check=True)
                wall = time.perf_counter() - start
                j = json.loads(out.stdout)
                row = {"decode": j["decode_tokens_per_s"], "prefill": j["prefill_tokens_per_s"],
                       "decode_cpu": j["decode_steps"] / j["decode_cpu_seconds"],
                       "startup": wall - j["generation_seconds"], "tokens": j["tokens"]}
            else:
                executor = label.split()[1]
                out = subprocess.run([*pin, sys.executable, "-c", _PY_WORKER, str(path), executor,
                                      str(repeat), str(new_tokens), json.dumps(ids)],
                                     capture_output=True, text=True, env=env, check=True)
                j = json.loads(out.stdout.splitlines()[-1])
                row = {"decode": statistics.median(j["decode"]), "prefill": statistics.median(j["prefill"]),
                       "decode_cpu": j["decode_cpu"], "startup": j["ready_s"], "tokens": j["tokens"]}
            results[label].append(row)
            print(f"  {label}: decode {row['decode']:.2f} tokens/s ({row['decode_cpu']:.2f} per CPU-s), prefill {row['prefill']:.1f} tokens/s, "
                  f"start-up {row['startup']:.2f} s", flush=True)
    python = results["python lean"]
    want = python[0]["tokens"]
    lines = ["| runtime | decode tokens/s (wall) | vs Python, per round | decode tokens per CPU-second | "
             "vs Python | prefill tokens/s | start-up s | same tokens |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for label, rows in results.items():
        decode = statistics.median(r["decode"] for r in rows)
        # ratios within a round (its processes ran back to back) over rounds: steadier than
        # a ratio of medians when the machine's load swings between rounds
        wall_ratio = statistics.median(r["decode"] / p["decode"] for r, p in zip(rows, python))
        cpu = statistics.median(r["decode_cpu"] for r in rows)
        cpu_ratio = statistics.median(r["decode_cpu"] / p["decode_cpu"] for r, p in zip(rows, python))
        same = all(r["tokens"] == want for r in rows)
        lines.append(f"| {label} | {decode:.2f} | {wall_ratio:.3f} | {cpu:.2f} | {cpu_ratio:.3f} | "
                     f"{statistics.median(r['prefill'] for r in rows):.1f} | "
                     f"{statistics.median(r['startup'] for r in rows):.2f} | {'yes' if same else '**NO**'} |")
    return lines


def write_generation(args) -> None:
    import datetime

    from llm_models import PROMPT_TOKENS
    from machine import describe_machine

    rounds = args.rounds if "--rounds" in sys.argv else 3
    lines = generation(args.generate, args.new_tokens, args.repeat, rounds)
    machine = describe_machine(ROOT)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    text = [f"# Decode from C: opforge-generate against the Python cpu path ({stamp})", "",
            f"Machine: {machine['cpu']}, {machine['cores']} cores (shared), load average "
            f"{machine['load_average'][0]:.1f}; opforge {machine['opforge_commit']}. "
            f"1 thread (OMP/OPFORGE_NUM_THREADS=1), pinned to one core with taskset.", "",
            f"bench/llm.py's `{args.generate}` decoder exported with `backends=['cpu']` (a dynamic "
            f"prefill and a one-token decode method), a {PROMPT_TOKENS}-token prompt, "
            f"{args.new_tokens} greedy tokens. One process per runtime and round ({rounds} rounds, "
            f"interleaved); each process generates {args.repeat} times from a fresh state and "
            "reports its median; the table gives the median over rounds (ratios: the median of "
            "each round's ratio). CPU-seconds are the process's CPU time over the decode calls "
            "(steadier than wall time on a shared machine). Start-up: for "
            "opforge-generate the process's wall time less its generations (exec, load, verify, "
            "method instances); for Python the interpreter's imports, load and Generator.", "",
            *lines, "", "Command: `python bench/native_cpu_delegate.py --generate "
            f"{args.generate} --new-tokens {args.new_tokens} --repeat {args.repeat} --write`"]
    print("\n".join(text))
    if args.write:
        (ROOT / "bench" / "results" / "native_generate.md").write_text("\n".join(text) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--generate", metavar="CONFIG", help="bench/llm.py's config: tiny or base")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    if args.generate:
        write_generation(args)
        return
    T, lib = _probe()
    tiny_call(T, lib, args.batch, args.rounds)
    decode(T, lib, args.tokens, args.rounds)


if __name__ == "__main__":
    main()
