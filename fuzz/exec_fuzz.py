"""On-demand fuzzer for *running* hostile programs: load, bind and call them, with native
kernels loaded, in lean and ATen mode.

    python fuzz/exec_fuzz.py --count 100000                  # both modes, fixed seed
    python fuzz/exec_fuzz.py --count 20000 --mode lean --seed 3

``program_fuzz.py`` proves the reader and verifier; this one goes on to what a program can
make the runtime do. Seeds are real exports (the bundled custom-op model, whose program
calls the example native library, and a conv/pool/softmax model on portable kernels) plus
small hand-built native programs. Each input is a field-targeted mutation of a seed, made
on the decoded dataclasses and written without the verifier, or a byte-level mutation:

* operand indices: a kernel argument pointed at another value (a constant, a scalar, an
  input, an index out of range), an output pointed at a constant;
* shapes and dtypes of tensors, arena sizes and tensor offsets;
* kernel parameters: int and int-list values (padding, stride, dilation, dims) set to
  interesting integers (0, -1, 2**31, 2**40, ...), scalars to NaN/inf;
* operator names: swapped for another op of the program or one that touches files
  (``aten::from_file``, ``aten::save``) or another out overload;
* dynamic shapes and state (``exec_fuzz_dynamic.py``): symbol ranges, size expressions,
  guards, state slots, growing flags and splat packings of the bundled decoder and the
  version-3/4/5 samples, called at random sizes up to one past each bound, twice and
  again after a state reset.

Every case runs in a worker process (spawned, address space capped), so a crash is seen
rather than suffered. An outcome is one of: ran, rejected (an ``OpforgeError``), or a
finding: any other exception, a ``MemoryError`` (raw or as a kernel error's cause), a file
opened while the case ran (an audit hook watches ``open``), the worker killed by a signal
(a crash), or no answer within ``--timeout`` seconds (a hang). Findings are written to
``--crash-dir`` and make the exit status 1.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import math
import multiprocessing as mp
import os
import random
import re
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

import opforge.program as P  # noqa: E402
from opforge.errors import KernelError, OpforgeError  # noqa: E402
from opforge.program._sample import unverified_bytes  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from program_fuzz import mutate as byte_mutation  # noqa: E402
from exec_fuzz_dynamic import (  # noqa: E402
    dynamic_seeds, dynamic_shapes, mutate_dynamic, run_dynamic,
)

INTS = [0, 1, 2, 3, -1, -2, 7, 64, 255, 2**16, 2**20, 2**31 - 1, 2**31, 2**32, 2**40, 2**48,
        2**62, 2**63 - 1, -(2**31), -(2**63)]
FLOATS = [0.0, -0.0, 1.0, -1.0, 1e30, -1e30, 1e-45, math.inf, -math.inf, math.nan]
HOSTILE_OPS = [("aten::from_file", "out"), ("aten::save", ""), ("aten::_print", ""),
               ("aten::empty", "memory_format"), ("aten::full", "out"), ("aten::arange", "out"),
               ("aten::as_strided_copy", "out"), ("aten::index_put", "out"),
               ("my_ops::mul4", "out"), ("my_ops::minmax", "out"), ("my_ops::mul3", "out")]
MAX_WORKER_BYTES = 6 << 30  # the worker's address-space cap: a memory bomb fails, not swaps
MAX_RSS_GROWTH = 2 << 30  # a case that grows the worker by more is a finding


# --- seeds --------------------------------------------------------------------------------

def build_example_library(cache: Path) -> str:
    from opforge.native import build_library
    from opforge.examples.my_ops import manifest_path

    sources = sorted((manifest_path().parent / "kernels").glob("*.cpp"))
    out = cache / "libmy_ops.so"
    return str(build_library(manifest_path(), sources, out, cache_root=cache / "cache").path)


def exported_seeds(library: str) -> list[bytes]:
    """Programs exported from real models (needs torch); [] without torch."""
    try:
        import torch
        from torch import nn
    except ImportError:
        return []
    from opforge.examples.custom_model import custom_op_model
    from opforge.export import export

    model, inputs = custom_op_model()
    seeds = [P.to_bytes(export(model, inputs, kernels=["portable", library]))]

    class Small(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3, padding=1, dilation=1)
            self.pool = nn.MaxPool2d(2, padding=1)
            self.norm = nn.BatchNorm2d(4)

        def forward(self, x):
            y = self.pool(torch.relu(self.norm(self.conv(x))))
            return torch.softmax(y.flatten(1), -1), nn.functional.avg_pool2d(y, 2, ceil_mode=True)

    small = Small().eval()
    seeds.append(P.to_bytes(export(small, (torch.randn(1, 3, 8, 8),), kernels=["portable"])))
    return seeds


def native_seeds() -> list[bytes]:
    """Hand-built programs over the example library's ops (no torch needed)."""
    f32 = P.ScalarType.FLOAT32
    x = P.TensorValue(f32, (4, 6), storage=P.ArenaStorage(0, 0))
    y = P.TensorValue(f32, (4, 6), storage=P.ArenaStorage(0, 128))
    lo = P.TensorValue(f32, (4,), storage=P.ArenaStorage(0, 256))
    hi = P.TensorValue(f32, (4,), storage=P.ArenaStorage(0, 320))
    s = P.TensorValue(f32, (4,), storage=P.ArenaStorage(0, 384))
    c = P.TensorValue(f32, (4, 6), storage=P.ConstantStorage(0, 0))
    values = (x, y, lo, hi, s, c, P.IntValue(1), P.DoubleValue(0.5), P.IntListValue((1,)),
              P.BoolValue(False))
    code = (P.KernelCall(0, (0, 1)), P.KernelCall(1, (1, 6, 2, 3)), P.KernelCall(2, (2, 3)),
            P.KernelCall(3, (1, 7, 8, 9, 4)), P.KernelCall(4, (5, 1)))
    ops = (P.Operator("my_ops::mul3", "out"), P.Operator("my_ops::minmax", "out"),
           P.Operator("my_ops::mul4", "out"), P.Operator("my_ops::scaled_sum", "out"),
           P.Operator("aten::relu", "out"))
    method = P.Method("forward", values, (0,), (1, 2, 3, 4), code, ops, P.MemoryPlan((448,)))
    weights = P.Segment(np.linspace(-2, 2, 24, dtype=np.float32))
    return [P.to_bytes(P.Program(methods=(method,), segments=(weights,)))]


# --- field-targeted mutations -------------------------------------------------------------

def _tensor_indices(values) -> list[int]:
    return [i for i, v in enumerate(values) if type(v) is P.TensorValue]


def mutate_fields(rng: random.Random, program: P.Program) -> bytes:
    """One field of one method changed; written without the verifier."""
    methods = list(program.methods)
    if not methods:
        return unverified_bytes(program)
    at = rng.randrange(len(methods))
    m = methods[at]
    values, code, ops = list(m.values), list(m.instructions), list(m.operators)
    plan = list(m.memory_plan.arena_sizes)
    calls = [i for i, ins in enumerate(code) if type(ins) is P.KernelCall and ins.args]
    tensors = _tensor_indices(values)
    constants = [i for i in tensors if type(values[i].storage) is P.ConstantStorage]
    choice = rng.randrange(9)
    if choice == 0 and calls:  # an operand index anywhere
        i = rng.choice(calls)
        args = list(code[i].args)
        args[rng.randrange(len(args))] = rng.choice(
            [rng.randrange(len(values) + 2), rng.choice(INTS) % (2**32)])
        code[i] = P.KernelCall(code[i].op, tuple(args))
    elif choice == 1 and calls:  # an output (the last argument) onto a constant
        i = rng.choice(calls)
        args = list(code[i].args)
        args[-1] = rng.choice(constants) if constants else rng.randrange(len(values))
        code[i] = P.KernelCall(code[i].op, tuple(args))
    elif choice == 2 and tensors:  # a shape
        i = rng.choice(tensors)
        v = values[i]
        sizes = list(v.sizes) or [1]
        mode = rng.randrange(4)
        if mode == 0:
            sizes[rng.randrange(len(sizes))] = rng.choice([0, 1, 2, 5, 64, 2**20, 2**22])
        elif mode == 1:
            sizes = sizes[:-1]
        elif mode == 2:
            sizes = sizes + [rng.choice([1, 2, 3])]
        else:
            sizes = list(reversed(sizes))
        values[i] = dataclasses.replace(v, sizes=tuple(sizes), dim_order=None)
    elif choice == 3 and tensors:  # a dtype
        i = rng.choice(tensors)
        dtype = rng.choice([P.ScalarType.FLOAT64, P.ScalarType.INT64, P.ScalarType.INT8,
                            P.ScalarType.BOOL, P.ScalarType.FLOAT16, P.ScalarType.INT32])
        values[i] = dataclasses.replace(values[i], dtype=dtype)
    elif choice == 4:  # arena sizes
        if plan:
            plan[rng.randrange(len(plan))] = rng.choice(
                [0, 1, 63, 64, 3 << 30, 2**40, 2**48, plan[0] * 2, max(plan[0] - 64, 0)])
        else:
            plan = [rng.choice([64, 2**40])]
    elif choice == 5 and tensors:  # a placement
        i = rng.choice(tensors)
        v = values[i]
        if type(v.storage) is P.ArenaStorage:
            offset = rng.choice([0, 64, v.storage.offset + 64, 2**31, 2**40])
            values[i] = dataclasses.replace(v, storage=P.ArenaStorage(v.storage.mem_id, offset))
    elif choice == 6:  # kernel parameters: int / int-list / double values
        scalars = [i for i, v in enumerate(values)
                   if type(v) in (P.IntValue, P.IntListValue, P.DoubleValue)]
        if scalars:
            i = rng.choice(scalars)
            v = values[i]
            if type(v) is P.IntValue:
                values[i] = P.IntValue(rng.choice(INTS))
            elif type(v) is P.DoubleValue:
                values[i] = P.DoubleValue(rng.choice(FLOATS))
            else:
                items = list(v.values) or [0]
                if rng.random() < 0.8:
                    items[rng.randrange(len(items))] = rng.choice(INTS)
                else:
                    items = [rng.choice(INTS) for _ in range(rng.randint(0, 5))]
                values[i] = P.IntListValue(tuple(items))
    elif choice == 7 and ops:  # an operator name
        i = rng.randrange(len(ops))
        name, overload = rng.choice(HOSTILE_OPS + [(o.name, o.overload) for o in ops])
        if all(o.key != f"{name}.{overload}" if overload else name for o in ops):
            ops[i] = P.Operator(name, overload)
    elif choice == 8 and m.inputs and m.outputs:  # an output aliasing an input
        outs = list(m.outputs)
        outs[rng.randrange(len(outs))] = rng.choice(list(m.inputs) + tensors)
        m = dataclasses.replace(m, outputs=tuple(outs))
    methods[at] = dataclasses.replace(m, values=tuple(values), instructions=tuple(code),
                                      operators=tuple(ops), memory_plan=P.MemoryPlan(tuple(plan)))
    return unverified_bytes(dataclasses.replace(program, methods=tuple(methods)))


def mutate(rng: random.Random, seeds: list[bytes], decoded: list[P.Program]) -> bytes:
    if rng.random() < 0.75:
        program = decoded[rng.randrange(len(decoded))]
        dynamic = any(m.symbols or m.state for m in program.methods)
        try:
            if dynamic and rng.random() < 0.5:
                return mutate_dynamic(rng, program)
            return mutate_fields(rng, program)
        except (OpforgeError, ValueError, TypeError):
            pass  # a mutation the dataclasses refuse on construction: fall back to bytes
    return byte_mutation(rng, seeds)


# --- the worker ------------------------------------------------------------------------------

def _inputs(method, rng: np.random.Generator, dynamic: bool = False) -> list:
    out = []
    shapes = dynamic_shapes(rng, method) if dynamic else [s.shape for s in method.inputs]
    for spec, shape in zip(method.inputs, shapes):
        if not spec.is_tensor:
            out.append(spec.dtype(rng.integers(-3, 4)))
        elif np.dtype(spec.dtype).kind == "f":
            out.append(rng.standard_normal(shape).astype(spec.dtype))
        elif np.dtype(spec.dtype).kind == "b":
            out.append(rng.random(shape) < 0.5)
        else:
            out.append(rng.integers(-3, 4, shape).astype(spec.dtype))
    return out


def run_case(data: bytes, mode: str, library: str, watch: dict) -> str:
    """'ran', 'rejected: <reason>' or 'finding: <what>'."""
    from opforge.runtime import load

    watch["opened"] = []
    watch["active"] = True
    try:
        loaded = load(data, mode=mode, kernels=[library])
        rng = np.random.default_rng(0)
        for name in loaded.method_names:
            method = loaded.method(name)
            # the inputs' bytes at their (upper-bound) shapes, before any is drawn
            total = sum(np.dtype(s.dtype).itemsize * math.prod(s.shape)
                        for s in method.inputs if s.is_tensor)
            if total > 1 << 30:
                return "rejected: inputs over 1 GiB (not run)"
            if method._dynamic or loaded.state_names:  # sizes per call; state carries
                run_dynamic(loaded, method, lambda: _inputs(method, rng, method._dynamic))
            else:
                method(*_inputs(method, rng))
    except MemoryError as e:
        return f"finding: raw MemoryError: {e}"
    except KernelError as e:
        if isinstance(e.__cause__, MemoryError):
            return f"finding: MemoryError inside a kernel: {e}"[:300]
        return "rejected: " + _reason(e)
    except OpforgeError as e:
        return "rejected: " + _reason(e)
    except Exception as e:  # noqa: BLE001 -- anything else is a finding
        return f"finding: {type(e).__name__}: {e}"[:300]
    finally:
        watch["active"] = False
    if watch["opened"]:
        return f"finding: opened {watch['opened'][:3]}"
    return "ran"


def _reason(error: Exception) -> str:
    body = str(error).split("`: ", 1)[-1].split(" — ")[0]
    return type(error).__name__ + ": " + re.sub(r"'[^']*'|\d+", "#", body)[:60]


def worker(conn, mode: str, library: str, quiet: bool, seeds: list[bytes]) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MAX_WORKER_BYTES, MAX_WORKER_BYTES))
    if quiet:  # torch's C++ warnings (an out resized) would drown the report
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
    watch = {"active": False, "opened": []}
    # the library, and the page map LoadedProgram.state_memory() reads (this process's own)
    allowed = {library, "/proc/self/pagemap"}
    # Python's own reads are not the program's doing: lazy imports of modules and the
    # source lines a traceback quotes, under the installation, the venv or opforge itself.
    code_roots = tuple({str(Path(p).resolve()) + os.sep for p in
                        (sys.prefix, sys.base_prefix, Path(P.__file__).parents[1])})

    def audit(event, args):
        if not watch["active"] or event != "open" or not args or args[0] is None:
            return
        path = str(args[0])
        if path in allowed:
            return
        resolved = os.path.realpath(path) if isinstance(args[0], (str, bytes, os.PathLike)) \
            else path
        if resolved.startswith(code_roots) and resolved.endswith((".py", ".pyc", ".so")):
            return
        watch["opened"].append(path)

    sys.addaudithook(audit)
    if mode == "aten":
        import opforge.kernels.aten  # noqa: F401 -- torch imported before the first case
    for seed in seeds:  # warm up, unwatched: what torch and NumPy read once on first use
        run_case(seed, mode, library, watch)
    while True:
        case = conn.recv()
        if case is None:
            return
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        outcome = run_case(case, mode, library, watch)
        grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
        if grown > MAX_RSS_GROWTH and not outcome.startswith("finding"):
            outcome = f"finding: the case grew the process by {grown >> 20} MiB"
        conn.send(outcome)


class Pool:
    """One spawned worker per mode, restarted after a crash or a hang."""

    def __init__(self, mode: str, library: str, seeds: list[bytes], quiet: bool = True) -> None:
        self.mode, self.library, self.seeds, self.quiet = mode, library, seeds, quiet
        self._start()

    def _start(self) -> None:
        # spawn, not fork: a parent that has run torch has OpenMP worker threads, and a
        # forked child's first parallel region then waits for them forever (seen under
        # pytest, where earlier tests ran torch ops).
        context = mp.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process = context.Process(
            target=worker, args=(child, self.mode, self.library, self.quiet, self.seeds),
            daemon=True)
        self.process.start()

    def run(self, data: bytes, timeout: float) -> str:
        self.conn.send(data)
        if self.conn.poll(timeout):
            try:
                return self.conn.recv()
            except EOFError:
                pass
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
            self._start()
            return f"finding: hang (no answer in {timeout:g} s)"
        self.process.join()
        code = self.process.exitcode
        self._start()
        return f"finding: worker died (exit code {code}, signal {-code if code < 0 else 0})"

    def close(self) -> None:
        try:
            self.conn.send(None)
        except (BrokenPipeError, OSError):
            pass
        self.process.join(5)
        if self.process.is_alive():
            self.process.kill()


def fuzz(count: int, seed: int, modes: list[str], crash_dir: Path, timeout: float,
         workdir: Path, report=print) -> int:
    """Run ``count`` mutated programs in each mode; returns the number of findings."""
    library = build_example_library(workdir)
    seeds = exported_seeds(library) + native_seeds() + dynamic_seeds()
    decoded = [P.from_bytes(s) for s in seeds]
    findings = 0
    for mode in modes:
        pool = Pool(mode, library, seeds)
        rng = random.Random(seed)
        stats: collections.Counter[str] = collections.Counter()
        reasons: collections.Counter[str] = collections.Counter()
        start = time.perf_counter()
        try:
            for n in range(count):
                data = mutate(rng, seeds, decoded)
                outcome = pool.run(data, timeout)
                kind = outcome.split(":", 1)[0]
                stats[kind] += 1
                if kind == "rejected":
                    reasons[outcome[len("rejected: "):]] += 1
                elif kind == "finding":
                    findings += 1
                    crash_dir.mkdir(parents=True, exist_ok=True)
                    (crash_dir / f"{mode}-{seed}-{n}.opf").write_bytes(data)
                    report(f"FINDING #{n} ({mode}): {outcome}")
        finally:
            pool.close()
        total = time.perf_counter() - start
        report(f"[{mode}] inputs: {count} (seed {seed}, {total:.1f} s, {count / total:.0f}/s) — "
               f"ran {stats['ran']}, rejected {stats['rejected']}, findings {stats['finding']}")
        for reason, k in reasons.most_common(10):
            report(f"  {k:7d}  {reason}")
    return findings


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=100_000, help="inputs per mode")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--mode", choices=["lean", "aten", "both"], default="both")
    parser.add_argument("--timeout", type=float, default=20.0, help="seconds per input")
    parser.add_argument("--crash-dir", type=Path,
                        default=Path(tempfile.gettempdir()) / "opforge-exec-fuzz")
    args = parser.parse_args()
    modes = ["lean", "aten"] if args.mode == "both" else [args.mode]
    with tempfile.TemporaryDirectory() as tmp:
        findings = fuzz(args.count, args.seed, modes, args.crash_dir, args.timeout, Path(tmp))
    print(f"findings: {findings}")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
