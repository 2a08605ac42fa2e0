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
reset; the live state is read back. The same calls then run on the lean runtime, in a
second, unsanitized worker (``native_exec_sides.py``: only the runtime under test pays for
the sanitizers; both workers live as long as no case kills them).

Outcomes: ran, refused (an ``OpforgeError`` other than an internal error) or a finding: the
worker killed (an ASan/UBSan report, with its first runtime frame, or any signal), a hang
(no answer within ``--timeout``), a leak (LeakSanitizer, asked every ``--leak-every`` cases
and after the last, in an allocation made by libopforge_runtime; the case that leaked is
in that window: replay it with ``--leak-every 1``), an ``InternalError`` or any other exception,
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
``lean_stricter``* (seen so far: an embedding whose out's dtype is not the weight's, which
NumPy's ``take`` refuses and the C++ kernel converts, as both runtimes' other kernels do;
a bool where convolution takes an int, which the C++ reader takes as 0/1 as Python's bool
is an int and the lean binder refuses). One refused a program the other loaded:
``native_earlier`` (the native
loader refuses at load what the lean one refuses per call: every kernel's written
arguments checked against constants, as the lean loader checks native kernels'),
``by_design_int64_bounds`` (native_program_fuzz's documented difference) or
``load_disagree``*. ``lean_finding``*: the lean runtime's own finding (exec_fuzz's part;
seen so far: a dynamic method's raw ValueError when an input's static dimension is off).
Fixed, with regression tests in tests/native_runtime/test_native_exec_fuzz_findings.py: the
``differ`` of cases 3420, 64571 and 89703 (seed 0, 2026-12-06), the lean rsqrt into an
integer out taking its reciprocal after rounding.

Case n of a seed is the n-th mutation of one random sequence, so a run can be split in
chunks (``--start-at``) and one case replayed alone (``--only N``: its outcome and comparison
printed, its file saved to --crash-dir), on the same code (the seeds include exports of the
working tree's exporter):

    python fuzz/native_exec_fuzz.py --count 100000 --crash-dir /tmp/nx
    python fuzz/native_exec_fuzz.py --count 25000 --start-at 25000 --crash-dir /tmp/nx
    python fuzz/native_exec_fuzz.py --only 3420
    python fuzz/native_exec_fuzz.py --replay /tmp/nx/differ-0-3420.opf   # the saved file
"""

from __future__ import annotations

import argparse
import collections
import multiprocessing as mp
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

import opforge.program as P  # noqa: E402

import cpu_blob_asan  # noqa: E402
import exec_fuzz as EF  # noqa: E402
from native_exec_sides import (  # noqa: E402
    lean_worker, native_worker, symbolic_definitions,
)


def _tally(reason: str) -> str:
    """A refusal's kind, for counting: the error type and the subject, numbers blanked."""
    kind, _, text = reason.partition(": ")
    body = text.split("`: ", 1)[-1].split("`: ", 1)[-1].split(" — ")[0]
    return kind + ": " + re.sub(r"'[^']*'|\d+", "#", body)[:70]


def sanitized_environment(log_dir: Path, library: Path | None = None) -> dict[str, str]:
    """The worker's environment: libasan preloaded, the sanitizer build of the runtime, every
    Python allocation through malloc (so LeakSanitizer sees what holds the runtime's handles),
    ASan's limits in place of RLIMIT_AS (its shadow memory reserves terabytes)."""
    from opforge.native_runtime.build import build_runtime
    from opforge.runtime.native_capi import LIBRARY_ENV

    from opforge.backends.cpu.engine import SANITIZE_ENV

    env = cpu_blob_asan.environment(log_dir)
    del env[SANITIZE_ENV]  # the runtime's sanitizer build; the cpu engine as installed
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
    """UBSan's first runtime error or ASan's summary (cpu_blob_asan.verdict) for ``pid``,
    from the sanitizers' log or the worker's stderr; else the end of either."""
    texts = [path.read_text(errors="replace") for path in
             (log_dir / f"asan.{pid}", log_dir / f"stderr.{pid}") if path.exists()]
    for text in texts:
        ub = re.search(r"(\S+:\d+:\d+: runtime error: [^\n]*)", text)
        if ub:
            return "UBSan: " + ub.group(1)
    return cpu_blob_asan.verdict(log_dir, pid) or next(
        (text[-600:] for text in texts if text.strip()), None)


class _Spawned(EF.Pool):
    """A spawned worker ``target(conn, *args)`` (``env`` added to its environment) that
    answers a batch of cases one message per case, restarted after a crash or a hang.

    Batches, because a round trip per case costs two wake-ups of the worker and two of the
    supervisor, and on a loaded machine each waits for a time slice: the handoffs, not the
    cases, set the pace. The worker answers each case as soon as it is done, so a crash or
    a hang is still pinned to one case: the first unanswered one."""

    def __init__(self, target, args: tuple, env: dict[str, str] | None = None) -> None:
        self.target, self.args, self.env = target, args, env or {}
        self._start()

    def _start(self) -> None:
        context = mp.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process = context.Process(target=self.target, args=(child,) + self.args,
                                       daemon=True)
        saved = dict(os.environ)
        os.environ.update(self.env)  # read by the spawned interpreter at exec only
        try:
            self.process.start()
        finally:
            os.environ.clear()
            os.environ.update(saved)

    def _failure(self, timeout: float, closed: bool) -> str:
        """The worker stopped answering: its death (``closed``: its end of the pipe closed;
        the sanitizer may still be writing its report) or a hang (killed); a new worker."""
        if closed:
            self.process.join(120)
        hung = self.process.is_alive()
        if hung:
            self.process.kill()
        self.process.join()
        code = self.process.exitcode
        self._start()
        if hung:
            return f"finding: hang (no answer in {timeout:g} s)"
        return f"finding: worker died (exit code {code}, signal {-code if code < 0 else 0})"

    def _ends_worker(self, answer) -> bool:
        return False

    def run_batch(self, items: list, timeout: float) -> list:
        """One answer per item: the worker's message, or a finding string (the worker died
        or gave no answer within ``timeout`` seconds of the previous one) for the item it
        was on, after which a new worker takes the rest."""
        answers: list = []
        while len(answers) < len(items):
            self.conn.send(items[len(answers):])
            while len(answers) < len(items):
                answer = closed = None
                if self.conn.poll(timeout):
                    try:
                        answer = self.conn.recv()
                    except EOFError:
                        closed = True
                if answer is None:
                    answers.append(self._failure(timeout, bool(closed)))
                    break
                answers.append(answer)
                if self._ends_worker(answer):
                    self.process.join(60)
                    self.close()
                    self._start()
                    break
        return answers


class NativePool(_Spawned):
    """The sanitized worker (native_exec_sides.native_worker)."""

    def __init__(self, library: str, seeds: list[bytes], log_dir: Path, leak_every: int,
                 env: dict[str, str]) -> None:
        self.log_dir = log_dir
        super().__init__(native_worker, (library, str(log_dir), leak_every, seeds), env)

    def _failure(self, timeout: float, closed: bool) -> str:
        pid = self.process.pid
        outcome = super()._failure(timeout, closed)
        if "worker died" in outcome:
            outcome += f" — {verdict(self.log_dir, pid) or 'no sanitizer report'}"
        return outcome

    def _ends_worker(self, answer) -> bool:
        return answer[0].startswith("finding: leak")  # the worker has stopped after it

    def answers(self, cases: list, timeout: float) -> list[tuple[str, object]]:
        """native_side's (outcome, payload) per (data, seed, definitions); a finding and
        None where the worker died (with the sanitizer's report) or hung."""
        return [a if isinstance(a, tuple) else (a, None) for a in self.run_batch(cases, timeout)]

    def leak_check(self, timeout: float) -> str:
        """LeakSanitizer asked now (the cases since the last check): 'ran' or a finding."""
        self.conn.send([])
        if self.conn.poll(timeout):
            try:
                return self.conn.recv()[0]
            except EOFError:
                pass
        return self._failure(timeout, not self.process.is_alive())

    def ask(self, data: bytes, seed: int, timeout: float) -> tuple[str, object]:
        """One case's (outcome, payload)."""
        return self.answers([(data, seed, symbolic_definitions(data))], timeout)[0]


class Checker:
    """Both workers: ``check(cases)`` gives each (data, seed) its (outcome, comparison)."""

    def __init__(self, library: str, seeds: list[bytes], log_dir: Path, leak_every: int,
                 env: dict[str, str], timeout: float) -> None:
        self.timeout = timeout
        self.native = NativePool(library, seeds, log_dir, leak_every, env)
        self.lean = _Spawned(lean_worker, (library, seeds))

    def check(self, cases: list[tuple[bytes, int]]) -> list[tuple[str, str | None]]:
        """Per case (outcome, comparison): outcome 'ran', 'refused: <reason>' or 'finding:
        <what>'; comparison None (nothing to compare) or one of the docstring's kinds with
        a detail."""
        results: list = [None] * len(cases)
        asked = []
        for k, (data, seed) in enumerate(cases):
            try:
                asked.append((k, (data, seed, symbolic_definitions(data))))
            except Exception as e:  # noqa: BLE001 -- opforge.program's reader raised
                results[k] = (f"finding: opforge.program.from_bytes raised "
                              f"{type(e).__name__}: {e}"[:400], None)
        native = self.native.answers([case for _, case in asked], self.timeout)
        lean_cases, lean_at = [], []
        for (k, case), (outcome, payload) in zip(asked, native):
            results[k] = (outcome, None)
            if payload is not None:
                lean_cases.append(case + (outcome, payload))
                lean_at.append(k)
        for k, answer in zip(lean_at, self.lean.run_batch(lean_cases, self.timeout)):
            if isinstance(answer, str):  # the lean worker died or hung: its own finding
                answer = ("lean_finding: " + answer[len("finding: "):],)
            results[k] = (results[k][0], answer[0])
        return results

    def close(self) -> None:
        self.native.close()
        self.lean.close()


def fuzz(count: int, seed: int, crash_dir: Path, timeout: float, workdir: Path,
         leak_every: int = 1000, report=print, start_at: int = 0,
         runtime: Path | None = None, only: bool = False, batch: int = 50) -> dict:
    """Run cases ``start_at`` .. ``start_at + count - 1`` of seed ``seed``; the tallies.
    ``only``: report the one case's outcome and comparison, and save it whatever they are;
    ``batch``: cases per message to the workers."""
    library = EF.build_example_library(workdir)
    seeds = EF.exported_seeds(library) + EF.native_seeds() + EF.dynamic_seeds()
    decoded = [P.from_bytes(s) for s in seeds]
    log_dir = workdir / "sanitizer-logs"
    checker = Checker(library, seeds, log_dir, leak_every,
                      sanitized_environment(log_dir, runtime), timeout)
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

    def tally(n: int, data: bytes, outcome: str, comparison: str | None) -> None:
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
        if only:
            save("case", n, data, f"{outcome}\n{comparison}")
        if (n + 1 - start_at) % 1000 == 0:
            rate = (n + 1 - start_at) / (time.perf_counter() - start)
            report(f"  {n + 1 - start_at} cases ({rate:.1f}/s): {dict(stats)}")

    pending: list[tuple[bytes, int]] = []
    try:
        for n in range(start_at + count):
            data = EF.mutate(rng, seeds, decoded)
            if n >= start_at:
                pending.append((data, n))
            if len(pending) == batch or (pending and n == start_at + count - 1):
                for (data, m), result in zip(pending, checker.check(pending)):
                    tally(m, data, *result)
                pending = []
        if leak_every:  # the last cases since the worker's last check
            leak = checker.native.leak_check(timeout)
            if leak.startswith("finding"):
                stats["finding"] += 1
                findings.append(f"after #{start_at + count - 1}: {leak}")
                report(f"FINDING after the last case: {leak[:300]}")
    finally:
        checker.close()
    total = time.perf_counter() - start
    report(f"[native] cases {start_at}..{start_at + count - 1} (seed {seed}, {total:.0f} s, "
           f"{count / total:.1f}/s): {dict(stats)}")
    for reason, k in reasons.most_common(10):
        report(f"  {k:7d}  {reason}")
    return {"stats": dict(stats), "findings": findings, "seconds": total}


def replay(paths: list[Path], timeout: float, workdir: Path, runtime: Path | None = None,
           report=print) -> list[tuple[str, str | None]]:
    """Saved cases again (``<kind>-<seed>-<n>.opf``: their inputs drawn from seed n, as in
    the run that saved them), whatever the mutator now makes of n; each reported."""
    library = EF.build_example_library(workdir)
    log_dir = workdir / "sanitizer-logs"
    checker = Checker(library, [], log_dir, 1, sanitized_environment(log_dir, runtime), timeout)
    try:
        cases = [(path.read_bytes(), int(path.stem.rsplit("-", 1)[-1])) for path in paths]
        results = checker.check(cases)
    finally:
        checker.close()
    for path, (outcome, comparison) in zip(paths, results):
        report(f"{path.name}: {outcome[:300]}\n    {comparison}")
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--start-at", type=int, default=0,
                        help="skip this many cases of the seed's sequence (run in chunks)")
    parser.add_argument("--only", type=int, default=None, metavar="N",
                        help="run case N alone (--start-at N --count 1) and report it")
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="seconds per case and worker (ASan is slow, the machine shared)")
    parser.add_argument("--batch", type=int, default=50,
                        help="cases per message to the workers (answered one by one)")
    parser.add_argument("--leak-every", type=int, default=1000,
                        help="ask LeakSanitizer after this many cases and at the end (0: "
                             "never); a leak names the window, --leak-every 1 its case")
    parser.add_argument("--runtime", type=Path, default=None,
                        help="a sanitizer build's libopforge_runtime.so (default: "
                             "build_runtime(sanitize=True))")
    parser.add_argument("--crash-dir", type=Path,
                        default=Path(tempfile.gettempdir()) / "opforge-native-exec-fuzz")
    parser.add_argument("--replay", type=Path, nargs="+", default=None, metavar="FILE",
                        help="run saved cases (<kind>-<seed>-<n>.opf) instead, LeakSanitizer "
                             "asked after each")
    args = parser.parse_args()
    if args.replay:
        with tempfile.TemporaryDirectory() as tmp:
            results = replay(args.replay, args.timeout, Path(tmp), args.runtime)
        return 1 if any(o.startswith("finding") or (c or "").startswith("differ:")
                        for o, c in results) else 0
    start_at, count = (args.only, 1) if args.only is not None else (args.start_at, args.count)
    with tempfile.TemporaryDirectory() as tmp:
        result = fuzz(count, args.seed, args.crash_dir, args.timeout, Path(tmp),
                      args.leak_every, start_at=start_at, runtime=args.runtime,
                      only=args.only is not None, batch=args.batch)
    stats = result["stats"]
    bad = stats.get("finding", 0) + stats.get("differ", 0)
    print(f"findings: {stats.get('finding', 0)}, differ: {stats.get('differ', 0)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
