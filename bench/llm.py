"""Language-model generation: prefill and decode tokens/s of opforge beside torch eager and
ONNX Runtime, at 1 and 2 threads, for a tiny decoder and a 125M-parameter one.

    bench/.venv-peers/bin/python bench/llm.py                      # both configs (~25 min)
    bench/.venv-peers/bin/python bench/llm.py --configs tiny --rounds 1 --repeats 3

Steps: one export process per (config, runtime) → interleaved rounds of measuring workers
(one process per config × runtime × threads × round, order shuffled each round) → a
profile of the lean runtime's prefill and decode per op → bench/results/llm.jsonl and
llm.md. What each number means is in bench/README.md ("Language-model generation").
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import random
import shlex
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from harness import THREAD_VARIABLES  # noqa: E402
from llm_models import CONFIGS, NEW_TOKENS, PROMPT_TOKENS  # noqa: E402
from llm_report import markdown  # noqa: E402
from machine import describe_machine  # noqa: E402
from run import snapshot_opforge  # noqa: E402

RUNTIMES = ("opforge-lean", "opforge-cpu", "eager", "ort")
EXPORTED = ("opforge-lean", "opforge-cpu", "ort")


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--runtimes", nargs="+", default=list(RUNTIMES), choices=RUNTIMES)
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds (2)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="generations per worker after the warm-up (3)")
    parser.add_argument("--new-tokens", type=int, default=NEW_TOKENS)
    parser.add_argument("--profile-steps", type=int, default=32,
                        help="decode steps the lean profile traces (32; 0: no profile)")
    parser.add_argument("--live", action="store_true",
                        help="run this checkout's opforge/ as it is (first on the workers' "
                             "PYTHONPATH), not a snapshot of its last commit")
    parser.add_argument("--workdir", type=pathlib.Path, default=HERE / "work" / "llm")
    parser.add_argument("--out", type=pathlib.Path, default=HERE / "results")
    return parser.parse_args(argv)


class Workers:
    def __init__(self, workdir: pathlib.Path, opforge_path: str | None, log) -> None:
        self.workdir, self.opforge_path, self.log = workdir, opforge_path, log
        self.events: list[dict] = []

    def run(self, spec: dict, threads: int = 1, timeout: float = 1800.0) -> list[dict]:
        spec = {"workdir": str(self.workdir), "threads": threads, **spec}
        env = dict(os.environ)
        env.update({name: str(threads) for name in THREAD_VARIABLES})
        env["PYTHONPATH"] = os.pathsep.join(p for p in (self.opforge_path, str(HERE)) if p)
        env.setdefault("PYTHONWARNINGS", "ignore")
        env.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
        self.log.write(f"\n=== {json.dumps(spec)}\n")
        self.log.flush()
        start = time.perf_counter()
        try:
            done = subprocess.run([sys.executable, str(HERE / "llm_worker.py")],
                                  input=json.dumps(spec), text=True, capture_output=True,
                                  env=env, timeout=timeout, cwd=self.workdir)
            self.log.write(done.stderr)
            lines = [json.loads(line) for line in done.stdout.splitlines()
                     if line.startswith("{")]
            if done.returncode and not any(e.get("event") == "error" for e in lines):
                lines.append({"event": "error", "spec": spec, "ok": False,
                              "error": f"exit {done.returncode}: {done.stderr[-500:]}"})
        except subprocess.TimeoutExpired:
            lines = [{"event": "error", "spec": spec, "ok": False,
                      "error": f"timed out after {timeout:.0f} s"}]
        for event in lines:
            event["wall_s"] = time.perf_counter() - start
            if event.get("event") == "error":
                say(f"  ! {spec['mode']} {spec.get('config')} {spec.get('runtime')}: "
                    f"{event['error'][:400]}")
        self.events.extend(lines)
        return lines


def _dirty() -> bool:
    # tracked files only: the results this run is about to replace are not a change
    done = subprocess.run(["git", "-C", str(HERE.parent), "status", "--porcelain",
                           "--untracked-files=no", "--", "opforge", "bench"],
                          capture_output=True, text=True)
    return bool(done.stdout.strip())


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def main(argv=None) -> int:
    args = parse_args(argv)
    started, load_start = time.perf_counter(), os.getloadavg()[0]
    args.workdir = args.workdir.resolve()
    args.workdir.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    machine = describe_machine(HERE.parent)
    # --live: this checkout first on the workers' PYTHONPATH (without it they imported
    # whatever opforge the interpreter has installed: another worktree's editable install)
    snapshot = str(HERE.parent) if args.live else snapshot_opforge(args.workdir)
    with open(args.workdir / "workers.log", "w") as log:
        workers = Workers(args.workdir, snapshot, log)
        for config in args.configs:
            for runtime in (r for r in args.runtimes if r in EXPORTED):
                say(f"export {config} for {runtime}")
                workers.run({"mode": "prepare", "config": config, "runtime": runtime})
        cells = [(c, r, t) for c in args.configs for r in args.runtimes for t in args.threads]
        rng = random.Random(0)
        for round_ in range(args.rounds):
            order = list(cells)
            rng.shuffle(order)
            start = time.perf_counter()
            for config, runtime, threads in order:
                workers.run({"mode": "measure", "config": config, "runtime": runtime,
                             "round": round_, "repeats": args.repeats,
                             "new_tokens": args.new_tokens}, threads)
            say(f"round {round_ + 1}/{args.rounds}: {len(order)} workers in "
                f"{time.perf_counter() - start:.0f} s (load {os.getloadavg()[0]:.2f})")
        if "opforge-lean" in args.runtimes and args.profile_steps > 0:
            for config in args.configs:
                say(f"profile {config} on opforge-lean")
                workers.run({"mode": "profile", "config": config, "runtime": "opforge-lean",
                             "steps": args.profile_steps}, 1)
    setup = {"machine": machine, "configs": {c: CONFIGS[c] for c in args.configs},
             "prompt_tokens": PROMPT_TOKENS, "new_tokens": args.new_tokens,
             "rounds": args.rounds, "repeats": args.repeats, "threads": args.threads,
             "opforge_source": (f"the working tree at commit {machine['opforge_commit']}"
                                + (", with uncommitted changes" if _dirty() else "")
                                + " (--live)") if args.live else
             f"a snapshot of commit {machine['opforge_commit']}",
             "load_start": load_start, "load_end": os.getloadavg()[0],
             "wall_s": time.perf_counter() - started,
             "command": "bench/llm.py " + shlex.join(sys.argv[1:] if argv is None else argv)}
    with open(args.out / "llm.jsonl", "w") as out:
        out.write(json.dumps({"event": "setup", **setup}) + "\n")
        for event in workers.events:
            out.write(json.dumps(event) + "\n")
    (args.out / "llm.md").write_text(markdown(setup, workers.events))
    say(f"llm: done in {setup['wall_s'] / 60:.1f} min → {args.out / 'llm.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
