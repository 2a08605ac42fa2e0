"""Differential tester for the cpu backend: random small graphs, run everywhere, compared.

    python fuzz/cpu_differential.py --seed 0 --count 1000 --jobs 2
    python fuzz/cpu_differential.py --seed 0 --only 417           # rerun (and shrink) one graph

Graph i is built from seed S+i alone (fuzz/cpu_diff/generate.py) out of the ops the
backend claims (fuzz/cpu_diff/ops.py), with parameters and buffers drawn away from their
defaults. Each graph runs in eager float64 (the reference), eager float32, the lean
runtime on portable kernels, and the cpu backend in lean and ATen mode; the tolerance and
its reasoning are in fuzz/cpu_diff/oracle.py. Outcomes:

- agreed: every runtime within tolerance (integer and bool outputs exactly equal);
- refused: the same, but the cpu backend took no node (partition rejections are fine);
- disagreement: a runtime's outputs are off (shape, dtype, values);
- error: export, load or run raised on a graph eager runs;
- unstable: eager float32 and float64 disagree on an integer output (not judged).

A disagreement or error is shrunk (fuzz/cpu_diff/shrink.py) and printed as runnable
Python with its seed; the exit status is 1 when there is any. The summary gives the
counts, the op families covered and how often, the commonest rejection reasons and the
time. Throughput (fuzz/cpu_diff/speed.py): two process-stable parts of every export are
cached per worker, and the two exports of a graph share one capture and decomposition
(--no-share runs them apart); ~0.2 s of CPU per graph, 10,000 graphs in ~35 minutes on
one core.
"""

from __future__ import annotations

import argparse
import collections
from concurrent import futures
from concurrent.futures.process import BrokenProcessPool
import json
import multiprocessing
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch loads: one core per worker

from fuzz.cpu_diff.generate import generate  # noqa: E402
from fuzz.cpu_diff.ops import include_known  # noqa: E402
from fuzz.cpu_diff.oracle import check  # noqa: E402
from fuzz.cpu_diff.repro import repro_source  # noqa: E402
from fuzz.cpu_diff.shrink import shrink  # noqa: E402
from fuzz.cpu_diff.speed import cache_export_setup, share_capture_between_exports  # noqa: E402

FINDINGS = ("disagree", "error")


def _worker_init(share: bool = True) -> None:
    import warnings

    import opforge.backends.cpu  # noqa: F401 - the backend's import cost, once per worker

    warnings.filterwarnings("ignore")
    cache_export_setup()
    if share:
        share_capture_between_exports()


def run_one(task) -> dict:
    """One graph: generate, check, shrink a finding. Plain data back to the parent."""
    seed, max_nodes, do_shrink, max_checks = task
    graph = generate(seed, max_nodes)
    outcome = check(graph)
    result = {"seed": seed, "status": outcome.status, "where": outcome.where,
              "detail": outcome.detail, "ops": [n.op for n in graph.nodes],
              "nodes": len(graph.nodes), "delegated": outcome.delegated,
              "rejected": [kind + ": " + reason for kind, reason in outcome.rejected],
              "seconds": outcome.seconds}
    if outcome.status in FINDINGS:
        small, small_outcome, checks = (shrink(graph, outcome, max_checks=max_checks)
                                        if do_shrink else (graph, outcome, 0))
        result["repro"] = repro_source(small, small_outcome, seed,
                                       f"python fuzz/cpu_differential.py --only {seed} --seed 0")
        result["shrunk_nodes"] = len(small.nodes)
        result["shrink_checks"] = checks
    return result


def _summary(results: list[dict], elapsed: float, console) -> None:
    status = collections.Counter(r["status"] for r in results)
    ops = collections.Counter(op for r in results for op in r["ops"])
    families = collections.Counter(op.split(".")[0] for r in results for op in r["ops"])
    rejected = collections.Counter(reason[:110] for r in results for reason in r["rejected"])
    partial = sum(1 for r in results if r["status"] == "agreed" and r["rejected"])
    where = collections.Counter((r["status"], r["where"]) for r in results if r["status"] in FINDINGS)
    n = len(results)
    lines = [
        f"graphs {n}  agreed {status['agreed']} (of them partly delegated {partial})  "
        f"refused {status['refused']}  disagreements {status['disagree']}  errors {status['error']}  "
        f"unstable {status['unstable']}",
        f"time {elapsed:.1f} s  ({n / elapsed if elapsed else 0:.2f} graphs/s; "
        f"mean {sum(r['seconds'] for r in results) / max(n, 1):.3f} s per graph in a worker)",
        f"nodes {sum(r['nodes'] for r in results)}  (mean {sum(r['nodes'] for r in results) / max(n, 1):.1f} per graph)",
        "op families: " + ", ".join(f"{k} {v}" for k, v in sorted(families.items(), key=lambda kv: -kv[1])),
        "ops: " + ", ".join(f"{k} {v}" for k, v in sorted(ops.items(), key=lambda kv: -kv[1])),
    ]
    if where:
        lines.append("findings by place: " + ", ".join(f"{s} at {w}: {c}" for (s, w), c in where.most_common()))
    if rejected:
        lines.append("commonest rejections:")
        lines += [f"  {c:6d}  {reason}" for reason, c in rejected.most_common(8)]
    console("\n".join(lines))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=0, help="graph i is built from seed SEED+i")
    ap.add_argument("--count", type=int, default=100, help="graphs to run")
    ap.add_argument("--only", type=int, default=None, help="run graph I alone (seed SEED+I)")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes")
    ap.add_argument("--max-nodes", type=int, default=10, help="ops per graph, at most")
    ap.add_argument("--no-shrink", action="store_true", help="print findings unshrunk")
    ap.add_argument("--no-share", action="store_true",
                    help="capture and decompose each graph once per export (slower; the plain export path)")
    ap.add_argument("--max-shrink-checks", type=int, default=300)
    ap.add_argument("--repro-dir", type=Path, default=None, help="also write each finding's repro here")
    ap.add_argument("--results", type=Path, default=None,
                    help="append one JSON line per graph here as it finishes (a long run can be read midway)")
    ap.add_argument("--plain", action="store_true", help="plain-text summary (no rich)")
    ap.add_argument("--known", action="store_true",
                    help="also generate the ops with known differences (fuzz/cpu_diff/ops.py KNOWN)")
    ap.add_argument("--summarize", type=Path, nargs="+", default=None, metavar="RESULTS",
                    help="print the summary of earlier --results files (several runs merged) and exit")
    args = ap.parse_args(argv)
    if args.summarize:
        return _summarize_files(args.summarize, _console(args.plain))
    if args.known:
        include_known()  # before the pool forks: the workers inherit it

    indices = [args.only] if args.only is not None else range(args.count)
    tasks = [(args.seed + i, args.max_nodes, not args.no_shrink, args.max_shrink_checks) for i in indices]
    console = _console(args.plain)
    start = time.monotonic()
    results = []
    if args.jobs > 1:
        stream = _pooled(tasks, args.jobs, not args.no_share)
    else:
        _worker_init(not args.no_share)
        stream = map(run_one, tasks)
    signal.signal(signal.SIGTERM, _interrupt)  # a killed run still prints its summary
    log = args.results.open("a") if args.results is not None else None
    try:
        for result in stream:
            _record(result, results, log, args, console, start, len(tasks))
    except KeyboardInterrupt:
        console(f"\ninterrupted after {len(results)} of {len(tasks)} graphs")
        stream.close() if hasattr(stream, "close") else None
    _summary(results, time.monotonic() - start, console)
    return 1 if any(r["status"] in FINDINGS for r in results) else 0


def _pooled(tasks, jobs: int, share: bool):
    """``run_one`` over ``tasks`` in ``jobs`` forked workers, results as they finish. A
    worker that dies (a crash in native code) loses no graph: the graphs it may have held
    run again one by one in a fresh worker, and the one that kills it again is an error."""
    pending = list(reversed(tasks))
    while pending:
        pool = _executor(jobs, share)
        running = {}
        try:
            while pending or running:
                while pending and len(running) < jobs * 2:
                    task = pending.pop()
                    running[pool.submit(run_one, task)] = task
                done, _ = futures.wait(running, return_when=futures.FIRST_COMPLETED)
                for future in done:
                    result = future.result()  # raises while the task is still counted running
                    del running[future]
                    yield result
        except BrokenProcessPool:
            suspects = list(running.values())
            pool.shutdown(cancel_futures=True)
            for task in suspects:
                yield _alone(task, share)
            continue
        finally:
            pool.shutdown(wait=False, cancel_futures=True)


def _executor(jobs: int, share: bool):
    return futures.ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("fork"),
                                       initializer=_worker_init, initargs=(share,))


def _alone(task, share: bool) -> dict:
    with _executor(1, share) as pool:
        try:
            return pool.submit(run_one, task).result()
        except BrokenProcessPool:
            seed = task[0]
            return {"seed": seed, "status": "error", "where": "crash",
                    "detail": "the worker process died running this graph (a crash in native code?)",
                    "ops": [n.op for n in generate(seed, task[1]).nodes], "nodes": len(generate(seed, task[1]).nodes),
                    "delegated": 0, "rejected": [], "seconds": 0.0,
                    "repro": f"# seed {seed}: the process died; rerun: python fuzz/cpu_differential.py "
                             f"--only {seed} --seed 0 --no-shrink", "shrunk_nodes": 0, "shrink_checks": 0}


def _summarize_files(paths, console) -> int:
    results = {}
    for path in paths:
        for line in path.read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                results[r["seed"]] = r  # a seed run twice counts once
    rows = list(results.values())
    ends = [r["end"] for r in rows if "end" in r]
    elapsed = max(ends) - min(r["end"] - r["seconds"] for r in rows if "end" in r) if ends else 0.0
    _summary(rows, elapsed, console)
    return 1 if any(r["status"] in FINDINGS for r in rows) else 0


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def _record(result, results, log, args, console, start, total) -> None:
    results.append(result)
    if log is not None:
        log.write(json.dumps({**{k: v for k, v in result.items() if k != "repro"}, "end": time.time()}) + "\n")
        log.flush()
    if result["status"] in FINDINGS:
        console(f"\n=== seed {result['seed']}: {result['status']} at {result['where']}: "
                f"{result['detail']}\n    shrunk from {result['nodes']} to {result['shrunk_nodes']} "
                f"nodes in {result['shrink_checks']} checks\n\n{result['repro']}")
        if args.repro_dir is not None:
            args.repro_dir.mkdir(parents=True, exist_ok=True)
            (args.repro_dir / f"seed_{result['seed']}.py").write_text(result["repro"])
    if len(results) % 100 == 0:
        status = collections.Counter(r["status"] for r in results)
        print(f"[{len(results)}/{total}] {time.monotonic() - start:.0f} s {dict(status)}",
              file=sys.stderr, flush=True)


def _console(plain: bool):
    if not plain:
        try:
            from rich.console import Console

            rich_console = Console(highlight=False, soft_wrap=True)
            return lambda text: rich_console.print(text, markup=False)
        except ImportError:
            pass
    return lambda text: print(text, flush=True)


if __name__ == "__main__":
    sys.exit(main())
