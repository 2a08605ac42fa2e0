"""opforge against torch eager, ONNX Runtime and ExecuTorch, measured in one run.

    bench/.venv-peers/bin/python bench/run.py            # the full suite
    bench/.venv-peers/bin/python bench/run.py --quick    # 1 round, fewer runs
    bench/.venv-peers/bin/python bench/run.py --models mlp cnn --runtimes opforge-lean ort

Steps, in order: eager reference outputs → one export process per runtime → interleaved
rounds of measuring workers (one process per workload × runtime × round) → micro-
benchmarks → bench/results/latest.jsonl, latest.md and ratios.png. See bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shlex
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from harness import Harness  # noqa: E402
from machine import describe_machine  # noqa: E402
from micro import micro_markdown, run_micro  # noqa: E402
from report import (  # noqa: E402
    BASELINE, TOLERANCE, failed_cells, markdown, ratio_chart, summarize_measurements,
)
from quantized_workloads import is_quantized  # noqa: E402
from quantized_workloads import tolerance as quantized_tolerance  # noqa: E402
from runtimes import RUNTIMES  # noqa: E402
from workloads import MAIN, WORKLOADS  # noqa: E402


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="development mode: 1 round, 20 runs, 3 import repeats")
    parser.add_argument("--models", nargs="+", default=list(MAIN), choices=list(WORKLOADS),
                        metavar="NAME", help=f"workloads of the main table (default: {' '.join(MAIN)})")
    parser.add_argument("--runtimes", nargs="+", default=list(RUNTIMES), choices=list(RUNTIMES),
                        metavar="NAME", help=f"runtimes (default: {' '.join(RUNTIMES)})")
    parser.add_argument("--threads", type=int, default=2, help="threads for every runtime (2)")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (3; --quick: 1)")
    parser.add_argument("--runs", type=int, help="timed runs per worker (50; --quick: 20)")
    parser.add_argument("--tolerance", type=float, default=TOLERANCE,
                        help=f"largest max abs error against eager before a (workload, "
                             f"runtime) is failed ({TOLERANCE:g}); any failed: exit status 1")
    parser.add_argument("--no-micro", action="store_true", help="skip the microbenchmarks")
    parser.add_argument("--micro-only", action="store_true", help="only the microbenchmarks")
    parser.add_argument("--live", action="store_true",
                        help="run the checkout's opforge as it is now, instead of a snapshot of "
                             "its last commit (others keep editing the checkout during a run)")
    parser.add_argument("--workdir", type=pathlib.Path, default=HERE / "work",
                        help="exported files and worker logs (bench/work, git-ignored)")
    parser.add_argument("--out", type=pathlib.Path, default=HERE / "results",
                        help="where latest.jsonl, latest.md and ratios.png go")
    args = parser.parse_args(argv)
    args.workdir, args.out = args.workdir.resolve(), args.out.resolve()
    args.rounds = args.rounds or (1 if args.quick else 3)
    args.runs = args.runs or (20 if args.quick else 50)
    args.import_repeats = 3 if args.quick else 7
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    load_start = os.getloadavg()[0]
    args.workdir.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    machine = describe_machine(HERE.parent)
    # --live: this checkout first on the workers' PYTHONPATH (without it they imported
    # whatever opforge the interpreter has installed: another worktree's editable install)
    snapshot = str(HERE.parent) if args.live else snapshot_opforge(args.workdir)
    machine["opforge_source"] = "working tree (--live)" if args.live else \
        f"snapshot of commit {machine['opforge_commit']}"
    with open(args.workdir / "workers.log", "w") as log:
        harness = Harness(args.workdir, args.threads, log, opforge_path=snapshot)
        harness.say(f"bench: {machine['cpu']}, {machine['cores']} cores, threads={args.threads}, "
                    f"rounds={args.rounds}, runs={args.runs}")
        table: dict = {}
        tolerances: dict[str, float] = {}
        if not args.micro_only:
            prepared = harness.prepare(args.models, args.runtimes)
            pairs = [(w, r) for w in args.models for r in args.runtimes]
            measured = harness.measure(pairs, args.rounds, args.runs)
            tolerances = quantized_tolerances(args.workdir, args.models)
            table = summarize_measurements(measured, prepared, args.tolerance, tolerances)
        micro = {}
        if not args.no_micro:
            micro = run_micro(harness, rounds=args.rounds, runs=args.runs,
                              repeats=args.import_repeats, runtimes=args.runtimes)

    setup = {"machine": machine, "threads": args.threads, "rounds": args.rounds,
             "runs": args.runs, "tolerance": args.tolerance, "tolerances": tolerances,
             "load_start": load_start, "load_end": os.getloadavg()[0],
             "wall_s": time.perf_counter() - started,
             "command": "bench/run.py " + shlex.join(sys.argv[1:] if argv is None else argv)}
    write_results(args, setup, table, micro, harness.events)
    harness.say(f"bench: done in {setup['wall_s'] / 60:.1f} min → {args.out}/latest.md")
    wrong = failed_cells(table)
    for workload, runtime, reason in wrong:
        harness.say(f"  FAILED {workload} on {runtime}: {reason}")
    return 1 if wrong else 0


def quantized_tolerances(workdir: pathlib.Path, workloads: list[str]) -> dict[str, float]:
    """The tolerance of each quantized workload, from its eager reference outputs."""
    import numpy as np
    found = {}
    for name in workloads:
        io = workdir / name / "io.npz"
        if is_quantized(name) and io.exists():
            with np.load(io) as arrays:
                outputs = sorted(k for k in arrays.files if k.startswith("out"))
                found[name] = quantized_tolerance([arrays[k] for k in outputs],
                                                  [arrays["float" + k[3:]] for k in outputs])
    return found


def snapshot_opforge(workdir: pathlib.Path) -> str:
    """Extract the last commit's ``opforge/`` package into the workdir and return the folder
    to put first on the workers' PYTHONPATH: a run then measures one version of opforge
    from start to end, even while other engineers edit the shared checkout."""
    commit = subprocess.run(["git", "-C", str(HERE.parent), "rev-parse", "HEAD"],
                            capture_output=True, text=True, check=True).stdout.strip()
    target = workdir / f"opforge-{commit[:12]}"
    if not (target / "opforge" / "__init__.py").exists():
        target.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "-C", str(HERE.parent), "archive", commit, "opforge"],
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
    install_engine(target / "opforge" / "backends" / "cpu")
    return str(target)


def install_engine(cpu_dir: pathlib.Path) -> None:
    """Compile the snapshot's cpu engine and its call extension into its ``_engine`` folder,
    as ``pip install`` does: the workers then load installed ones, as a user's process does,
    instead of compiling on first use into the build cache (which imports the toolchain
    modules and adds their resident memory, ~8 MB, to opforge-cpu's peak). Without a
    compiler, oneDNN's or Python's headers the workers still fall back to that."""
    import importlib.util

    import numpy

    def load(name: str):
        spec = importlib.util.spec_from_file_location(f"_snapshot_{name}", cpu_dir / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    module = load("engine_build")
    try:
        module.build(cpu_dir / module.INSTALL_FOLDER, cpu_dir=cpu_dir)
    except module.EngineBuildError as e:
        print(f"note: the snapshot's cpu engine is compiled on first use instead ({e})",
              file=sys.stderr)
    if not (cpu_dir / "fastcall.py").is_file():  # a commit from before the extension
        return
    fastcall = load("fastcall")
    try:
        fastcall.build(cpu_dir / module.INSTALL_FOLDER, numpy.get_include(), numpy.__version__)
    except fastcall.FastcallBuildError as e:
        print(f"note: the snapshot's call extension is compiled on first use instead ({e})",
              file=sys.stderr)


def write_results(args: argparse.Namespace, setup: dict, table: dict, micro: dict,
                  events: list[dict]) -> None:
    # Raw samples stay in the (git-ignored) workdir; the committed lines keep their count,
    # so the results folder stays small text while nothing measured is lost.
    with open(args.workdir / "samples.jsonl", "w") as raw:
        for event in events:
            raw.write(json.dumps(event) + "\n")
    with open(args.out / "latest.jsonl", "w") as out:
        out.write(json.dumps({"event": "setup", **setup}) + "\n")
        for event in events:
            if "samples_s" in event:
                event = {**event, "samples_s": len(event["samples_s"])}
                event["samples"] = event.pop("samples_s")
            out.write(json.dumps(event) + "\n")
        for workload, cells in table.items():
            for runtime, cell in cells.items():
                out.write(json.dumps({"event": "summary", "workload": workload,
                                      "runtime": runtime, **cell}) + "\n")
        if micro:
            out.write(json.dumps({"event": "micro", **micro}) + "\n")
    workloads = [w for w in args.models if w in table]
    runtimes = list(args.runtimes)
    text = markdown(table, workloads, runtimes, setup, micro_markdown(micro, table) if micro else [])
    (args.out / "latest.md").write_text(text)
    if table and BASELINE in runtimes and len(runtimes) > 1:
        try:
            ratio_chart(table, workloads, runtimes, args.out / "ratios.png")
        except ImportError:  # matplotlib is in bench/.venv-peers, not in opforge's own venv
            print("bench: no matplotlib here; ratios.png not drawn (the tables are written)")
    if not args.quick and args.out == HERE / "results" and table and micro:
        update_readme(text)


def update_readme(text: str) -> None:
    """A full run with the default output also refreshes the results in bench/README.md,
    between its two markers, so the README never shows numbers from an older run."""
    readme = HERE / "README.md"
    begin, end = "<!-- results:begin -->", "<!-- results:end -->"
    current = readme.read_text() if readme.exists() else ""
    if begin not in current or end not in current:
        return
    body = text.split("\n", 1)[1].replace("\n### ", "\n#### ").replace("\n## ", "\n### ")
    head, rest = current.split(begin, 1)
    readme.write_text(f"{head}{begin}\n{body.strip()}\n{end}{rest.split(end, 1)[1]}")


if __name__ == "__main__":
    sys.exit(main())
