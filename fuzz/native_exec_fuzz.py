"""The execution fuzzer (``exec_fuzz.py``) against the native C++ runtime, under ASan+UBSan,
with the lean runtime alongside as the reference.

    python fuzz/native_exec_fuzz.py --count 20000                 # fixed seed
    python fuzz/native_exec_fuzz.py --count 25000 --seed 3 --crash-dir /tmp/native-exec

Inputs are exec_fuzz's (the same seeds and mutators: operand indices, outputs onto
constants, shapes, dtypes, arena sizes, placements, kernel parameters, operator names,
outputs aliasing inputs; symbol ranges, size expressions, guards, state slots, growing and
splat flags; byte-level mutations). Each case is loaded with
``opforge.runtime.load(data, executor="native")`` from the sanitizer build
(``build_runtime(sanitize=True)``, selected by ``$OPFORGE_RUNTIME_LIBRARY`` in a worker that
preloads libasan), bound, and every method called with random inputs at random sizes (a
dynamic method's symbols drawn up to one past each bound), twice, then again after a state
reset; the live state is read back. The same calls then run on the lean runtime.

Outcomes: ran, refused (an ``OpforgeError`` other than an internal error) or a finding: the
worker killed (an ASan/UBSan report, with its first runtime frame, or any signal), a hang
(no answer within ``--timeout``), a leak (LeakSanitizer, asked every ``--leak-every`` cases,
in an allocation made by libopforge_runtime), an ``InternalError`` or any other exception,
or an allocation failure behind the memory limit. Findings are saved to ``--crash-dir`` and
make the exit status 1.

Compared with the lean runtime, counted and reported (the kinds marked * saved too):
both ran a call and the outputs are identical (``exact``: the same kernel, or the same
arithmetic) or equal within rtol 1e-4 / atol 1e-5 times the output's scale (``close``:
NumPy and the portable kernels round and accumulate differently), or else ``differ``* (a
bug in one of them: exit status 1) or ``differ_unspecified`` (the program makes its result
unspecified: two arena tensors alive at once share bytes, or a tensor is read before
anything wrote it, so each runtime's order of reads and writes, and where it keeps inputs,
decides the bytes). One refused a call the other ran: ``native_stricter`` (the portable
kernels refuse dtype mixes, out shapes and parameters NumPy lets through) or
``lean_stricter``*. One refused a program the other loaded: ``native_earlier`` (the native
loader refuses at load what the lean one refuses per call: every kernel's written
arguments checked against constants, as the lean loader checks native kernels'),
``by_design_int64_bounds`` (native_program_fuzz's documented difference) or
``load_disagree``*. ``lean_finding``*: the lean runtime's own finding (exec_fuzz's part).

Run 100,000 cases in chunks, e.g. four of 25,000 (two at a time on two cores):

    python fuzz/native_exec_fuzz.py --count 25000 --start-at 0 --crash-dir /tmp/nx
    python fuzz/native_exec_fuzz.py --count 25000 --start-at 25000 --crash-dir /tmp/nx
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import math
import os
import random
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "fuzz"))

import numpy as np  # noqa: E402
import warnings  # noqa: E402

import opforge.program as P  # noqa: E402
from opforge.errors import InternalError, OpforgeError  # noqa: E402

import cpu_blob_asan  # noqa: E402
import exec_fuzz as EF  # noqa: E402
import native_program_fuzz as NF  # noqa: E402

MAX_MEMORY = 1 << 30  # the load memory limit of both runtimes (bytes per method instance)
MAX_INPUT_BYTES = 256 << 20  # a case whose inputs at their upper bound need more is not run
RTOL, ATOL = 1e-4, 1e-5  # float outputs of NumPy and the portable kernels (see the docstring)


# --- the worker's side -------------------------------------------------------------------------

def _reason(error: Exception) -> str:
    return f"{type(error).__name__}: {error}"[:1200]


def _tally(reason: str) -> str:
    """A refusal's kind, for counting: the error type and the subject, numbers blanked."""
    kind, _, text = reason.partition(": ")
    body = text.split("`: ", 1)[-1].split("`: ", 1)[-1].split(" — ")[0]
    return kind + ": " + re.sub(r"'[^']*'|\d+", "#", body)[:70]


def _attempt(call):
    """('ok', value), ('refused', reason) or ('finding', what)."""
    try:
        return "ok", call()
    except InternalError as e:
        return "finding", f"InternalError: {e}"[:400]
    except OpforgeError as e:
        text = str(e)
        if "an allocation failed" in text or isinstance(e.__cause__, MemoryError):
            return "finding", f"allocation failure behind the limit: {text}"[:400]
        return "refused", _reason(e)
    except MemoryError as e:
        return "refused", f"MemoryError: {e}"[:80]  # NumPy's own allocation (lean side)
    except Exception as e:  # noqa: BLE001 -- anything else is a finding
        return "finding", f"{type(e).__name__}: {e}"[:400]


class _Shim:
    """What ``dynamic_shapes`` reads of a method: its definition and its inputs' specs
    (value index, dtype, shape at the upper bound)."""

    def __init__(self, definition: P.Method, specs) -> None:
        self._def = definition
        self.inputs = [type(s)(index, s.dtype, s.shape) for index, s in
                       zip(definition.inputs, specs)]


def _plan_calls(method, definition, rng: np.random.Generator) -> list[list]:
    """Three calls' inputs (the third after a state reset), drawn once for both runtimes."""
    dynamic = definition is not None and bool(definition.symbols)
    shim = _Shim(definition, method.inputs) if dynamic else method
    return [EF._inputs(shim, rng, dynamic) for _ in range(3)]


def _outputs(values) -> list:
    return [np.array(v, copy=True) if isinstance(v, np.ndarray) else v for v in values]


def _run_calls(loaded, calls_per_method: dict) -> tuple[list, str | None]:
    """Every method's calls on one runtime: a list of (method, call, status, value), and a
    finding (or None)."""
    record = []
    for name, calls in calls_per_method.items():
        status, method = _attempt(lambda: loaded.method(name))
        if status != "ok":
            record.append((name, -1, status, method))
            if status == "finding":
                return record, method
            continue
        for k, inputs in enumerate(calls):
            if k == 2 and loaded.state_names:
                status, value = _attempt(loaded.reset_state)
                if status == "finding":
                    return record, value
            status, value = _attempt(lambda: _outputs(method(*inputs)))
            record.append((name, k, status, value))
            if status == "finding":
                return record, value
        for state in loaded.state_names:
            status, value = _attempt(lambda: loaded.read_state(state))
            if status == "finding":
                return record, value
    return record, None


def _compare(a, b) -> str:
    """'exact', 'close' or 'differ: ...' for one call's native and lean outputs."""
    if len(a) != len(b):
        return f"differ: {len(a)} outputs against {len(b)}"
    verdict = "exact"
    for i, (x, y) in enumerate(zip(a, b)):
        if not isinstance(x, np.ndarray) or not isinstance(y, np.ndarray):
            if x == y or (isinstance(x, float) and isinstance(y, float) and math.isnan(x)
                          and math.isnan(y)):
                continue
            return f"differ: output {i}: {x!r} against {y!r}"
        if x.shape != y.shape or x.dtype != y.dtype:
            return f"differ: output {i}: {x.dtype}{x.shape} against {y.dtype}{y.shape}"
        if np.array_equal(x, y, equal_nan=x.dtype.kind in "fc"):
            continue
        if x.dtype.kind not in "fc":
            return f"differ: output {i}: {int(np.sum(x != y))} of {x.size} elements"
        finite = np.isfinite(y)
        scale = float(np.max(np.abs(y[finite]), initial=1.0))
        with np.errstate(all="ignore"):
            if not np.allclose(x, y, rtol=RTOL, atol=ATOL * max(scale, 1.0), equal_nan=True):
                worst = float(np.nanmax(np.abs(x.astype(np.float64) - y)))
                return f"differ: output {i}: max |native - lean| {worst:g} (scale {scale:g})"
        verdict = "close"
    return verdict


def _touches(method: P.Method) -> dict[int, list[int]]:
    """Value index: the instructions reading or writing it (a list's items through it)."""
    out: dict[int, list[int]] = {}
    for k, ins in enumerate(method.instructions):
        if type(ins) is P.Move:
            used = [ins.src, ins.dst]
        else:
            used = list(getattr(ins, "args", ()) or ())
        for v in list(used):
            if 0 <= v < len(method.values):
                used += list(getattr(method.values[v], "items", ()) or ())
        for v in used:
            out.setdefault(v, []).append(k)
    return out


def aliased(method: P.Method) -> bool:
    """Whether a kernel's out is also one of its inputs, or two arena tensors whose lifetimes
    overlap share bytes (a placement no planner makes): what each runtime computes then
    depends on its order of reads and writes and on whether it reads an input from the
    caller's buffer or the arena, so outputs may differ."""
    state = {slot.value for slot in method.state}
    for ins in method.instructions:  # an out that is also an input (in place), but a state's
        args = getattr(ins, "args", None)  # update (a KV cache's index_put) as exported
        if type(ins) is P.KernelCall and args and args[-1] in args[:-1] and args[-1] not in state:
            return True
    touches = _touches(method)
    end = len(method.instructions)
    spans = []
    for v, value in enumerate(method.values):
        if type(value) is not P.TensorValue or type(value.storage) is not P.ArenaStorage:
            continue
        at = touches.get(v, [])
        first = -1 if v in method.inputs else min(at, default=end)
        last = end if v in method.outputs or v in {s.value for s in method.state} \
            else max(at, default=-1)
        try:
            nbytes = value.dtype.itemsize * math.prod(value.sizes)
        except Exception:  # noqa: BLE001 -- an odd dtype: its size unknown, assume aliasing
            return True
        start = value.storage.offset
        spans.append((value.storage.mem_id, start, start + nbytes, first, last, v))
    spans.sort()
    for i, (mem, lo, hi, first, last, _) in enumerate(spans):
        for mem2, lo2, hi2, first2, last2, _ in spans[i + 1:]:
            if mem2 != mem or lo2 >= hi:
                break
            if lo2 < hi and lo < hi2 and first <= last2 and first2 <= last:
                return True
    return False


def _refused_at_load(reason: str, lean, data: bytes, seed: int) -> str:
    """A program the native runtime refuses at load and the lean one loads: 'native_earlier'
    when the lean runtime refuses every method's calls (the native loader checks at load
    what the lean runtime checks per call: outputs in constants, kernel arguments), else
    'load_disagree'."""
    if "a constant tensor, where the kernel writes" in reason:
        return "native_earlier: " + reason  # loader.py's rule, for every kernel's outputs
    if "leaves int64 on the way" in reason and NF.intermediate_overflow(data):
        return "by_design_int64_bounds: " + reason  # native_program_fuzz's documented one
    rng = np.random.default_rng(seed)
    calls = {}
    for m in lean.program.methods:
        got, method = _attempt(lambda: lean.method(m.name))
        if got == "ok":
            calls[m.name] = _plan_calls(method, m, rng)[:1]
    ran, _ = _run_calls(lean, calls)
    if any(s == "ok" for _, _, s, _ in ran):
        return "load_disagree: native refuses " + reason
    return "native_earlier: " + reason


def reads_unwritten(method: P.Method) -> bool:
    """Whether an arena tensor that is no input and no state is first used other than as
    a kernel's output (the trailing tensor arguments of an out variant, the first one
    excepted) or a Move's destination: a read of bytes nothing wrote, which hold whatever
    the runtime left there (the lean runtime copies inputs into the arena, the native one
    may read them from the caller's buffer)."""
    seen = set(method.inputs) | {s.value for s in method.state}

    def tensor(v: int) -> bool:
        return 0 <= v < len(method.values) and type(method.values[v]) in (
            P.TensorValue, P.TensorListValue)

    code = method.instructions
    last_written = {}  # value: the last instruction whose last argument it is
    for i, ins in enumerate(code):
        if getattr(ins, "args", None):
            last_written[ins.args[-1]] = i
    for i, ins in enumerate(code):
        if type(ins) is P.Move:
            reads, writes = [ins.src], [ins.dst]
        else:
            args = list(getattr(ins, "args", ()) or ())
            k = len(args)
            while k > 1 and tensor(args[k - 1]):
                k -= 1
            # the last argument is written; the trailing tensors before it too, unless a
            # later instruction writes them (then this one reads them first)
            writes = [v for j, v in enumerate(args[k:], k)
                      if j == len(args) - 1 or last_written.get(v, -1) <= i]
            reads = list(args[:k]) + [v for v in args[k:] if v not in writes]
        for v in reads:
            if v in seen or not 0 <= v < len(method.values):
                continue
            value = method.values[v]
            if type(value) is P.TensorValue and type(value.storage) is P.ArenaStorage:
                return True
        seen.update(writes)
    return False


def run_native_case(data: bytes, library: str, seed: int = 0) -> tuple[str, str | None]:
    """(outcome, comparison): outcome 'ran', 'refused: <reason>' or 'finding: <what>';
    comparison None (nothing to compare) or exact / close / differ / call_disagree /
    load_disagree with a detail."""
    from opforge.runtime import load

    status, native = _attempt(lambda: load(data, executor="native", kernels=[library],
                                           max_memory=MAX_MEMORY))
    if status == "finding":
        return "finding: " + native, None
    lean_status, lean = _attempt(lambda: load(data, kernels=[library], max_memory=MAX_MEMORY))
    if status == "refused":
        if lean_status == "ok":
            return "refused: " + native, _refused_at_load(native, lean, data, seed)
        return "refused: " + native, None
    if lean_status != "ok":
        definition = None
        try:
            definition = {m.name: m for m in P.from_bytes(data).methods}
        except OpforgeError:
            pass
    else:
        definition = {m.name: m for m in lean.program.methods}
    rng = np.random.default_rng(seed)
    calls = {}
    for name in native.method_names:
        got, method = _attempt(lambda: native.method(name))
        if got != "ok":
            if got == "finding":
                return "finding: " + method, None
            continue
        total = sum(np.dtype(s.dtype).itemsize * math.prod(s.shape)
                    for s in method.inputs if s.is_tensor)
        if total > MAX_INPUT_BYTES:
            return "refused: inputs over 256 MiB (not run)", None
        calls[name] = _plan_calls(method, (definition or {}).get(name), rng)
    ran, finding = _run_calls(native, calls)
    if finding is not None:
        return "finding: " + finding, None
    refused = [v for _, _, s, v in ran if s == "refused"]
    outcome = "ran" if not refused else "refused: " + refused[0]
    if lean_status != "ok":
        return outcome, "load_disagree: lean refuses " + lean
    reference, finding = _run_calls(lean, calls)
    if finding is not None:  # the lean runtime's own finding: exec_fuzz's business, noted
        return outcome, "lean_finding: " + finding[:200]
    worst = None
    for (name, k, s, v), (_, _, ls, lv) in zip(ran, reference):
        if (s == "ok") != (ls == "ok"):
            tag = "lean_stricter" if s == "ok" else "native_stricter"
            return outcome, (f"{tag}: {name} call {k}: native "
                             f"{'ran' if s == 'ok' else v}, lean {'ran' if ls == 'ok' else lv}")
        if s == "ok":
            verdict = _compare(v, lv)
            if verdict.startswith("differ"):
                m = (definition or {}).get(name)
                if m is not None and (aliased(m) or reads_unwritten(m)):
                    return outcome, f"differ_unspecified: {verdict[8:]} ({name} call {k})"
                return outcome, f"{verdict} ({name} call {k})"
            worst = "close" if verdict == "close" or worst == "close" else "exact"
    return outcome, worst


def _leaks(log_dir: Path) -> str | None:
    """Ask LeakSanitizer now; the first leak whose allocation stack passes through
    libopforge_runtime (Python's and NumPy's own are not ours), or None."""
    check = getattr(ctypes.CDLL(None), "__lsan_do_recoverable_leak_check", None)
    if check is None or not check():
        return None
    log = log_dir / f"asan.{os.getpid()}"
    text = log.read_text(errors="replace") if log.exists() else ""
    for block in re.split(r"\n(?=(?:Direct|Indirect) leak of )", text):
        if block.startswith(("Direct leak", "Indirect leak")) and ("libopforge_runtime" in block or "native_runtime/" in block):
            return "leak: " + " | ".join(line.strip() for line in block.splitlines()[:8])[:900]
    return None


def native_worker(conn, library: str, log_dir: str, leak_every: int, seeds: list[bytes]) -> None:
    warnings.simplefilter("ignore")  # NumPy's overflow and NaN warnings of the lean side
    for seed in seeds:  # warm up: lazy imports, NumPy's first use
        run_native_case(seed, library)
    log = Path(log_dir)
    done = 0
    while True:
        case = conn.recv()
        if case is None:
            return
        data, case_seed = case
        outcome, comparison = run_native_case(data, library, case_seed)
        done += 1
        if leak_every and done % leak_every == 0 and not outcome.startswith("finding"):
            leak = _leaks(log)
            if leak:
                outcome = "finding: " + leak
        conn.send((outcome, comparison))


# --- the supervisor's side ---------------------------------------------------------------------

def sanitized_environment(log_dir: Path, library: Path | None = None) -> dict[str, str]:
    """The worker's environment: libasan preloaded, the sanitizer build of the runtime, every
    Python allocation through malloc (so LeakSanitizer sees what holds the runtime's handles),
    ASan's limits in place of RLIMIT_AS (its shadow memory reserves terabytes)."""
    from opforge.native_runtime.build import build_runtime
    from opforge.runtime.native_capi import LIBRARY_ENV

    env = cpu_blob_asan.environment(log_dir)
    env["LD_PRELOAD"] = env["LD_PRELOAD"].replace(" ", ":")
    env["ASAN_OPTIONS"] = env["ASAN_OPTIONS"].replace("detect_leaks=0", "detect_leaks=1") \
        .replace("hard_rss_limit_mb=4096", "hard_rss_limit_mb=3072") \
        .replace("max_allocation_size_mb=4096", "max_allocation_size_mb=2048") + \
        ":leak_check_at_exit=0"
    env["UBSAN_OPTIONS"] = f"print_stacktrace=1:halt_on_error=1:log_path={log_dir / 'asan'}"
    env["PYTHONMALLOC"] = "malloc"
    env[LIBRARY_ENV] = str(library or build_runtime(sanitize=True).runtime_library)
    env["OMP_NUM_THREADS"] = "1"
    return env


def verdict(log_dir: Path, pid: int) -> str | None:
    """ASan's summary (cpu_blob_asan.verdict) or UBSan's first runtime error for ``pid``."""
    path = log_dir / f"asan.{pid}"
    if not path.exists():
        return None
    text = path.read_text(errors="replace")
    ub = re.search(r"(\S+:\d+:\d+: runtime error: [^\n]*)", text)
    if ub:
        return "UBSan: " + ub.group(1)
    return cpu_blob_asan.verdict(log_dir, pid) or text[-600:]


class NativePool(EF.Pool):
    """exec_fuzz's worker pool (restart after a crash or a hang) with the sanitized worker."""

    def __init__(self, library: str, seeds: list[bytes], log_dir: Path, leak_every: int,
                 env: dict[str, str]) -> None:
        self.log_dir, self.leak_every, self.env = log_dir, leak_every, env
        super().__init__("native", library, seeds)

    def _start(self) -> None:
        import multiprocessing as mp

        context = mp.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process = context.Process(
            target=native_worker,
            args=(child, self.library, str(self.log_dir), self.leak_every, self.seeds), daemon=True)
        saved = dict(os.environ)
        os.environ.update(self.env)  # read by the spawned interpreter at exec only
        try:
            self.process.start()
        finally:
            os.environ.clear()
            os.environ.update(saved)

    def ask(self, data: bytes, seed: int, timeout: float) -> tuple[str, str | None]:
        pid = self.process.pid
        outcome = self.run((data, seed), timeout)
        if isinstance(outcome, tuple):
            if outcome[0].startswith("finding: leak"):
                self.close()  # the next check would report the same leak again
                self._start()
            return outcome
        if "worker died" in outcome:
            outcome += f" — {verdict(self.log_dir, pid) or 'no sanitizer report'}"
        return outcome, None


def fuzz(count: int, seed: int, crash_dir: Path, timeout: float, workdir: Path,
         leak_every: int = 250, report=print, start_at: int = 0,
         runtime: Path | None = None) -> dict:
    """Run cases ``start_at`` .. ``start_at + count - 1`` of seed ``seed``; the tallies."""
    library = EF.build_example_library(workdir)
    seeds = EF.exported_seeds(library) + EF.native_seeds() + EF.dynamic_seeds()
    decoded = [P.from_bytes(s) for s in seeds]
    log_dir = workdir / "sanitizer-logs"
    pool = NativePool(library, seeds, log_dir, leak_every,
                      sanitized_environment(log_dir, runtime))
    rng = random.Random(seed)
    stats: collections.Counter[str] = collections.Counter()
    reasons: collections.Counter[str] = collections.Counter()
    findings: list[str] = []
    start = time.perf_counter()

    def save(kind: str, n: int, data: bytes, detail: str) -> None:
        findings.append(f"#{n} {kind}: {detail}")
        crash_dir.mkdir(parents=True, exist_ok=True)
        (crash_dir / f"{kind}-{seed}-{n}.opf").write_bytes(data)
        (crash_dir / f"{kind}-{seed}-{n}.txt").write_text(detail)
        report(f"{kind.upper()} #{n}: {detail[:300]}")

    try:
        for n in range(start_at + count):
            data = EF.mutate(rng, seeds, decoded)
            if n < start_at:
                continue
            outcome, comparison = pool.ask(data, n, timeout)
            kind = outcome.split(":", 1)[0]
            stats[kind] += 1
            if kind == "refused":
                reasons[_tally(outcome[len("refused: "):])] += 1
            elif kind == "finding":
                save("finding", n, data, outcome[len("finding: "):])
            if comparison:
                tag = comparison.split(":", 1)[0]
                stats[tag] += 1
                if tag in ("differ", "lean_stricter", "load_disagree", "lean_finding") or (
                        stats[tag] <= 20 and tag not in ("exact", "close")):  # a few to look at
                    save(tag, n, data, comparison)
            if (n + 1 - start_at) % 1000 == 0:
                rate = (n + 1 - start_at) / (time.perf_counter() - start)
                report(f"  {n + 1 - start_at} cases ({rate:.1f}/s): {dict(stats)}")
    finally:
        pool.close()
    total = time.perf_counter() - start
    report(f"[native] cases {start_at}..{start_at + count - 1} (seed {seed}, {total:.0f} s, "
           f"{count / total:.1f}/s): {dict(stats)}")
    for reason, k in reasons.most_common(10):
        report(f"  {k:7d}  {reason}")
    return {"stats": dict(stats), "findings": findings}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--start-at", type=int, default=0,
                        help="skip this many cases of the seed's sequence (run in chunks)")
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="seconds per case (ASan is slow, and the machine may be shared)")
    parser.add_argument("--leak-every", type=int, default=250,
                        help="ask LeakSanitizer after this many cases (0: never)")
    parser.add_argument("--runtime", type=Path, default=None,
                        help="a sanitizer build's libopforge_runtime.so (default: "
                             "build_runtime(sanitize=True))")
    parser.add_argument("--crash-dir", type=Path,
                        default=Path(tempfile.gettempdir()) / "opforge-native-exec-fuzz")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        result = fuzz(args.count, args.seed, args.crash_dir, args.timeout, Path(tmp),
                      args.leak_every, start_at=args.start_at, runtime=args.runtime)
    stats = result["stats"]
    bad = stats.get("finding", 0) + stats.get("differ", 0)
    print(f"findings: {stats.get('finding', 0)}, differ: {stats.get('differ', 0)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
