"""Structure-aware fuzzer for the cpu backend's delegate blobs and its native engine.

    python fuzz/cpu_blob_fuzz.py --count 20000 --seed 0 --jobs 1 --timeout 10
    python fuzz/cpu_blob_fuzz.py --replay CRASH_DIR/crash-....json   # one saved case again
    python fuzz/cpu_blob_fuzz.py --minimize-dir CRASH_DIR            # shrink saved findings
    python fuzz/cpu_blob_fuzz.py --count 5000 --asan ASAN_DIR        # engine under ASan
    PYTHONPATH=../branch python fuzz/cpu_blob_fuzz.py ...             # another opforge

Seeds are real programs exported with ``backends=["cpu"]`` (``cpu_blob_seeds.py``; every op
kind the engine has, a kernel-ABI custom op, an op-package op, 8a8w-quantized models),
cached on disk. Each case mutates fields of one delegate's parsed plan
(``cpu_blob_mutate.py``), writes the blob and the program again (checksums recomputed),
and a worker process loads it with ``opforge.runtime.load`` and calls every method twice
with inputs of the right shapes and dtypes.

Outcome classes:

    ok        loaded and ran
    refused   an OpforgeError (BackendError, ProgramError, ...): the clean way to say no
    crash     the worker died from a signal (which one is recorded)
    hang      no answer within --timeout seconds (the worker is killed and restarted)
    raw       any other exception type (InternalError included)
    memory    a MemoryError that no opforge error wraps (the worker's address space is
              capped with RLIMIT_AS, so a memory bomb fails instead of swapping)
    opened    the case made opforge open a file (an audit hook watches "open" events while
              a case loads and runs; what loading the unmutated seeds opens is allowed)

Everything but ok/refused is a finding: written to --crash-dir as ``<name>.program`` (the
program bytes) and ``<name>.json`` (seed, case number, mutations, outcome, the kernel
libraries it loads with), deduplicated in the report by (class, op kind, mutated field),
and the exit status is 1. A case is reproducible from (--seed, case number) alone: its
random generator is seeded with both. After the campaign the smallest case of each class
is shrunk to the plan fields it needs (``cpu_blob_minimize``; ``min-*`` files) and the
report groups the classes by that culprit. A crash that does not happen again in a fresh
worker was set up by an earlier case (memory it corrupted): ``--asan`` finds that case.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import re
import sys
import tempfile
import time
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(_HERE))
try:  # an opforge on PYTHONPATH (a branch under test) wins over this checkout
    import opforge  # noqa: F401
except ImportError:
    sys.path.append(str(_HERE.parent))

from cpu_blob_worker import Worker, run_once  # noqa: E402

CLASSES = ("ok", "refused", "crash", "hang", "raw", "memory", "opened")
FINDINGS = ("crash", "hang", "raw", "memory", "opened")


@dataclass
class Result:
    n: int
    seed: str
    mutations: list
    outcome: str
    detail: str


@dataclass
class Report:
    counts: collections.Counter = field(default_factory=collections.Counter)
    reasons: collections.Counter = field(default_factory=collections.Counter)
    findings: dict = field(default_factory=dict)  # dedupe key -> (count, first Result, path)
    finding_cases: dict = field(default_factory=dict)  # case number -> (class, detail)
    first_data: dict = field(default_factory=dict)  # dedupe key -> its smallest case's bytes
    minimized: list = field(default_factory=list)  # (culprit key, dedupe keys, lines, path)
    seeds: list = field(default_factory=list)  # the campaign's seeds and trusted packages
    trusted: list = field(default_factory=list)
    elapsed: float = 0.0

    def add(self, r: Result, crash_dir: Path | None, campaign_seed: int, data: bytes,
            kernels: list[str]) -> None:
        self.counts[r.outcome] += 1
        if r.outcome == "refused":
            self.reasons[reason(r.detail)] += 1
        if r.outcome not in FINDINGS:
            return
        self.finding_cases[r.n] = (r.outcome, r.detail)
        m = r.mutations[0] if r.mutations else None
        key = (r.outcome, m.op_kind if m else "-", m.field if m else "-")
        path = None
        if crash_dir is not None:
            path = save_case(crash_dir, campaign_seed, r, data, kernels)
        count, first, first_path = self.findings.get(key, (0, r, path))
        if key not in self.first_data or len(data) < len(self.first_data[key]):
            first, first_path = r, path  # the smallest program of the class: shrunk, kept
            self.first_data[key] = data
        self.findings[key] = (count + 1, first, first_path)


def reason(detail: str) -> str:
    """A refusal's subject with numbers and quoted names blanked (for the top-reasons table):
    the innermost message, without the load call, the delegate and the op it names."""
    body = detail.split(": ", 1)[-1]
    body = body.split(" refused: ", 1)[-1].split("`: ", 1)[-1].split(" — ")[0]
    body = re.sub(r"^(cpu backend( blob)?: )?((ops|tensors)\[\d+\]( \([^)]*\))?:? ?)?", "", body)
    return re.sub(r"'[^']*'|\"[^\"]*\"|-?\d+(\.\d+)?", "#", body)[:70]


def save_case(crash_dir: Path, campaign_seed: int, r: Result, data: bytes,
              kernels: list[str]) -> Path:
    crash_dir.mkdir(parents=True, exist_ok=True)
    name = f"{r.outcome}-{r.seed}-s{campaign_seed}-n{r.n}"
    (crash_dir / f"{name}.program").write_bytes(data)
    (crash_dir / f"{name}.json").write_text(json.dumps({
        "outcome": r.outcome, "detail": r.detail, "seed_program": r.seed,
        "campaign_seed": campaign_seed, "case": r.n, "program": f"{name}.program",
        "kernels": kernels, "mutations": [vars(m) for m in r.mutations]}, indent=1))
    return crash_dir / f"{name}.json"


def case_rng(campaign_seed: int, n: int) -> random.Random:
    return random.Random(f"cpu-blob-{campaign_seed}-{n}")


def campaign(count: int, seed: int, jobs: int, timeout: float, crash_dir: Path | None,
             plant: dict[int, str] | None = None, progress=None, log=print,
             cache_root: Path | None = None, only: list[str] | None = None) -> Report:
    """Run ``count`` mutated programs; ``plant`` maps case numbers to "crash", "hang",
    "raw", "memory" or "open" (the oracle's self-test: the worker kills itself with
    SIGSEGV, sleeps, or misbehaves in ``run_case`` on those cases)."""
    from cpu_blob_mutate import Mutation, ParsedSeed, mutate
    from cpu_blob_seeds import CACHE_ROOT, load_seeds

    seeds, trusted = load_seeds(cache_root or CACHE_ROOT, log=log)
    if only:
        seeds = [s for s in seeds if s.name in only]
    if os.environ.get("OPFORGE_OP_PACKAGES") is None:
        os.environ["OPFORGE_OP_PACKAGES"] = os.pathsep.join(trusted)  # the worker inherits it
    parsed = [ParsedSeed.of(s.name, s.data) for s in seeds]
    kernels = {s.name: list(s.kernels) for s in seeds}
    raw = {s.name: s.data for s in seeds}
    warm = [(s.data, list(s.kernels)) for s in seeds]
    workers = [Worker(warm, trusted) for _ in range(max(1, jobs))]
    report = Report(seeds=seeds, trusted=trusted)
    pending: dict[int, tuple[bytes, Result]] = {}
    start = time.monotonic()
    n_next = 0
    try:
        while n_next < count or pending:
            for w in workers:
                if w.job is None and n_next < count:
                    rng = case_rng(seed, n_next)
                    s = parsed[rng.randrange(len(parsed))]
                    data, mutations = mutate(rng, s)
                    if (plant or {}).get(n_next):  # an unmutated seed: it loads, then misbehaves
                        data = raw[s.name]
                        mutations = [Mutation("planted", "-", plant[n_next])]
                    pending[n_next] = (data, Result(n_next, s.name, mutations, "", ""))
                    w.send(n_next, data, kernels[s.name], (plant or {}).get(n_next))
                    n_next += 1
            busy = [w for w in workers if w.job is not None]
            ready = wait([w.conn for w in busy] + [w.process.sentinel for w in busy],
                         timeout=0.5)
            now = time.monotonic()
            for w in busy:
                n, started = w.job
                if w.conn in ready or w.process.sentinel in ready:
                    outcome, detail = w.answer()
                elif now - started > timeout:
                    outcome, detail = w.kill(timeout)
                else:
                    continue
                w.job = None
                data, r = pending.pop(n)
                r.outcome, r.detail = outcome, detail
                report.add(r, crash_dir, seed, data, kernels[r.seed])
                if outcome in FINDINGS:
                    log(f"\nFINDING case {n} ({r.seed}): {outcome}: {detail[:160]}\n"
                        f"  mutations: {'; '.join(map(str, r.mutations))[:300]}")
            done = sum(report.counts.values())
            if progress and (done % 50 == 0 or done == count):
                progress(done, count, report, time.monotonic() - start)
    finally:
        for w in workers:
            w.close()
    report.elapsed = time.monotonic() - start
    return report


def minimize_findings(report: Report, timeout: float, crash_dir: Path | None,
                      log=print) -> None:
    """Shrink the first case of every finding class to its culprit fields (see
    ``cpu_blob_minimize``) and group the classes by culprit in ``report.minimized``."""
    from cpu_blob_minimize import minimize, same_failure
    from cpu_blob_mutate import ParsedSeed
    seeds, trusted = report.seeds, report.trusted
    by_name = {s.name: s for s in seeds}
    w = Worker([(s.data, list(s.kernels)) for s in seeds], trusted)
    groups: dict = {}
    try:
        for key, (count, r, path) in sorted(report.findings.items()):
            seed = by_name[r.seed]
            kernels = list(seed.kernels)
            target = (r.outcome, r.detail)
            data = report.first_data[key]
            if r.mutations and r.mutations[0].field == "planted":
                continue
            # a corrupted heap does not always abort: three tries before "did not reproduce"
            if not any(same_failure(run_once(w, data, kernels, timeout), target)
                       for _ in range(3)):
                keys, lines, _ = groups.setdefault((f"{r.outcome} (did not reproduce)", "-", "-"),
                                                   ([], [], None))
                keys.append(key)
                lines.append(f"{key}: case #{r.n} {r.seed}: {r.detail[:60]} ({path})")
                continue
            small, units, lines = minimize(ParsedSeed.of(seed.name, seed.data), data, target,
                                           lambda b: run_once(w, b, kernels, timeout))
            culprit = (r.outcome + (" " + r.detail.split(":")[0] if r.outcome in ("crash", "raw")
                                    else ""),
                       ",".join(sorted({k for u in units for k in u.kinds})) or "-",
                       ",".join(sorted({f for u in units for f in u.fields})))
            saved = None
            if crash_dir is not None:
                crash_dir.mkdir(parents=True, exist_ok=True)
                name = f"min-{r.outcome}-{r.seed}-n{r.n}"
                (crash_dir / f"{name}.program").write_bytes(small)
                saved = crash_dir / f"{name}.json"
                saved.write_text(json.dumps({
                    "outcome": r.outcome, "detail": r.detail, "seed_program": r.seed,
                    "case": r.n, "program": f"{name}.program", "kernels": kernels,
                    "mutations": [vars(m) for m in r.mutations], "culprit": lines}, indent=1))
            keys, _, first = groups.setdefault(culprit, ([], lines, saved))
            keys.append(key)
            log(f"minimized {key}: {culprit} ({len(small)} bytes)")
    finally:
        w.close()
    report.minimized = [(k, keys, lines, path) for k, (keys, lines, path) in sorted(groups.items())]


# --- output -------------------------------------------------------------------------------

def progress_line(done: int, count: int, report: Report, elapsed: float) -> None:
    rate = done / elapsed if elapsed else 0.0
    c = report.counts
    sys.stderr.write(f"\r{done}/{count} cases, {rate:.1f}/s — ok {c['ok']} refused {c['refused']} "
                     f"findings {sum(c[k] for k in FINDINGS)}   ")
    sys.stderr.flush()


def print_report(report: Report, count: int, seed: int, out=print) -> None:
    total = sum(report.counts.values())
    rate = total / report.elapsed if report.elapsed else 0.0
    out(f"\ncases: {total} (seed {seed}, {report.elapsed:.1f} s, {rate:.1f} cases/s)")
    out(f"{'class':<10}{'cases':>8}")
    for k in CLASSES:
        out(f"{k:<10}{report.counts[k]:>8}")
    if report.findings:
        out("\nfindings, deduplicated by (class, op kind, mutated field):")
        out(f"{'class':<8}{'op kind':<22}{'field':<20}{'cases':>6}  smallest case / detail")
        for (cls, kind, fld), (k, r, path) in sorted(report.findings.items()):
            out(f"{cls:<8}{kind[:21]:<22}{fld[:19]:<20}{k:>6}  #{r.n} {r.seed}: {r.detail[:90]}")
            if path:
                out(f"{'':<56}{path}")
    if report.minimized:
        out("\nminimized findings, deduplicated by culprit (class, op kinds, fields that must "
            "stay mutated):")
        for (cls, kinds, fields), keys, lines, path in report.minimized:
            out(f"- {cls} | {kinds} | {fields}  ({len(keys)} raw classes)")
            for line in lines[:8]:
                out(f"    {line}")
            if path:
                out(f"    reproduce: python fuzz/cpu_blob_fuzz.py --replay {path}")
    out("\ntop rejection reasons:")
    for text, k in report.reasons.most_common(15):
        out(f"{k:8d}  {text}")


def report_from_dir(crash_dir: Path) -> Report:
    """The findings a campaign saved in ``crash_dir``, as a report (to shrink them later)."""
    from cpu_blob_mutate import Mutation
    from cpu_blob_seeds import load_seeds

    seeds, trusted = load_seeds()
    report = Report(seeds=seeds, trusted=trusted)
    for path in sorted(crash_dir.glob("*.json")):
        if path.name.startswith("min-"):
            continue
        meta = json.loads(path.read_text())
        r = Result(meta["case"], meta["seed_program"], [Mutation(**m) for m in meta["mutations"]],
                   meta["outcome"], meta["detail"])
        report.add(r, None, meta["campaign_seed"], path.with_name(meta["program"]).read_bytes(),
                   meta["kernels"])
        key = next(k for k, v in report.findings.items() if v[1] is r) \
            if any(v[1] is r for v in report.findings.values()) else None
        if key is not None:
            report.findings[key] = (report.findings[key][0], r, path)
    return report


def replay_cases(paths: list[Path], timeout: float) -> dict[str, tuple[str, str]]:
    """Each saved case (its .json) run in one worker (restarted after a crash): name ->
    (class, detail). Kernel libraries a case names that are not here (saved on another
    machine, or from another cache entry) are taken from this cache's seed of that name."""
    from cpu_blob_seeds import CACHE_ROOT, load_seeds

    seeds, trusted = load_seeds()
    trusted = trusted + [str(CACHE_ROOT)]  # op packages of a case saved from another entry
    os.environ.setdefault("OPFORGE_OP_PACKAGES", os.pathsep.join(trusted))
    w = Worker([(s.data, list(s.kernels)) for s in seeds], trusted)  # warm-up: see worker()
    out = {}
    try:
        for path in paths:
            meta = json.loads(path.with_suffix(".json").read_text())
            data = path.with_name(meta["program"]).read_bytes()
            kernels = meta["kernels"]
            if not all(Path(k).exists() for k in kernels):
                kernels = next((list(s.kernels) for s in seeds if s.name == meta["seed_program"]), [])
            out[path.stem] = run_once(w, data, kernels, timeout)
    finally:
        w.close()
    return out


def replay(path: Path, timeout: float) -> int:
    """Run one saved case (its .json), or every case in a folder, and print the outcomes."""
    paths = sorted(path.glob("*.json")) if path.is_dir() else [path.with_suffix(".json")]
    failed = 0
    for p, (outcome, detail) in zip(paths, replay_cases(paths, timeout).values()):
        meta = json.loads(p.read_text())
        print(f"{p.stem}: {outcome}: {detail}")
        print("  mutations: " + "; ".join(f"{m['field']} [{m['op_kind']}] {m['detail']}"
                                          for m in meta["mutations"]))
        for line in meta.get("culprit", []):
            print(f"  culprit: {line}")
        failed += outcome in FINDINGS
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=1000, help="cases to run")
    parser.add_argument("--seed", type=int, default=0, help="campaign seed")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds per case (a hang)")
    parser.add_argument("--crash-dir", type=Path,
                        default=Path(tempfile.gettempdir()) / "opforge-cpu-blob-fuzz")
    parser.add_argument("--seeds", help="comma-separated seed names to use (default: all)")
    parser.add_argument("--replay", type=Path, help="run one saved case (or every case in a folder) again")
    parser.add_argument("--asan", type=Path, metavar="DIR",
                        help="run the workers under AddressSanitizer (reports into DIR)")
    parser.add_argument("--minimize-dir", type=Path,
                        help="shrink the findings a campaign saved in this folder (into it)")
    parser.add_argument("--no-minimize", action="store_true",
                        help="skip shrinking each finding class to its culprit fields")
    parser.add_argument("--plant", action="append", default=[], metavar="N:WHAT",
                        help="(oracle self-test) make the worker crash, hang, raise (raw), "
                             "exhaust memory or open a file on case N")
    args = parser.parse_args(argv)
    if args.asan:
        Worker.asan_dir = args.asan.resolve()
    if args.replay:
        return replay(args.replay, args.timeout)
    if args.minimize_dir:
        report = report_from_dir(args.minimize_dir)
        minimize_findings(report, args.timeout, args.minimize_dir,
                          log=lambda s: print(s, file=sys.stderr))
        print_report(report, 0, -1)
        return 1 if report.findings else 0
    plant = {int(n): what for n, what in (p.split(":") for p in args.plant)}
    report = campaign(args.count, args.seed, args.jobs, args.timeout, args.crash_dir, plant,
                      progress=progress_line, log=lambda s: print(s, file=sys.stderr),
                      only=args.seeds.split(",") if args.seeds else None)
    if report.findings and not args.no_minimize:
        minimize_findings(report, args.timeout, args.crash_dir,
                          log=lambda s: print(s, file=sys.stderr))
    print_report(report, args.count, args.seed)
    return 1 if any(report.counts[k] for k in FINDINGS) else 0


if __name__ == "__main__":
    sys.exit(main())
