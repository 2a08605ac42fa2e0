"""Running workers: the environment they share, one subprocess per spec, interleaved rounds.

Every worker gets the same thread environment (OMP/OPENBLAS/MKL/... = ``threads``), so no
runtime gets more cores than another; each runtime also sets its own intra-op count to
``threads`` (see runtimes/). Worker stderr goes to one log file, stdout is JSON lines.
"""

from __future__ import annotations

import json
import os
import pathlib
import random
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Iterable, TextIO

__all__ = ["Harness", "THREAD_VARIABLES"]

HERE = pathlib.Path(__file__).resolve().parent
WORKER = HERE / "worker.py"

# OPFORGE_NUM_THREADS: the lean runtime's own elementwise threads (off by default), so
# opforge gets the thread count every peer gets, as ORT's intra-op pool and XNNPACK's do.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                    "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS", "OPFORGE_NUM_THREADS")


@dataclass
class Harness:
    workdir: pathlib.Path
    threads: int
    log: TextIO
    timeout_s: float = 900.0
    python: str = sys.executable
    verbose: bool = True
    opforge_path: str | None = None  # a snapshot of opforge to run instead of the checkout
    events: list[dict] = field(default_factory=list)

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update({name: str(self.threads) for name in THREAD_VARIABLES})
        env["PYTHONPATH"] = os.pathsep.join(p for p in (self.opforge_path, str(HERE)) if p)
        env.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
        env.setdefault("PYTHONWARNINGS", "ignore")
        return env

    def say(self, text: str) -> None:
        if self.verbose:
            print(text, file=sys.stderr, flush=True)

    def worker(self, spec: dict) -> list[dict]:
        """Run one worker on ``spec``; its JSON lines (an ``error`` event if it died)."""
        spec = {"workdir": str(self.workdir), "threads": self.threads, **spec}
        self.log.write(f"\n=== {json.dumps(spec)}\n")
        self.log.flush()
        try:
            done = subprocess.run([self.python, str(WORKER)], input=json.dumps(spec), text=True,
                                  capture_output=True, env=self.env(), timeout=self.timeout_s,
                                  cwd=self.workdir)
        except subprocess.TimeoutExpired:
            lines = [{"event": "error", "spec": spec, "ok": False,
                      "error": f"worker timed out after {self.timeout_s:.0f} s"}]
        else:
            self.log.write(done.stderr)
            lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
            if done.returncode != 0 and not any(e.get("event") == "crash" for e in lines):
                lines.append({"event": "error", "spec": spec, "ok": False,
                              "error": f"worker exited with {done.returncode}: "
                                       f"{done.stderr.strip()[-500:]}"})
        for event in lines:
            if event.get("event") in ("crash", "error"):
                self.say(f"  ! {spec.get('mode')} {spec.get('runtime', '')} "
                         f"{spec.get('workload', '')}: {event.get('error')}")
        self.events.extend(lines)
        return lines

    def prepare(self, workloads: Iterable[str], runtimes: Iterable[str]) -> dict[tuple[str, str], dict]:
        """Reference outputs (eager) for every workload, then one export process per runtime."""
        workloads = list(workloads)
        self.say(f"reference outputs for {len(workloads)} workloads")
        self.worker({"mode": "reference", "workloads": workloads})
        prepared = {}
        for name in runtimes:
            self.say(f"export for {name}")
            for event in self.worker({"mode": "prepare", "runtime": name, "workloads": workloads}):
                if event.get("event") == "prepared":
                    prepared[(event["workload"], event["runtime"])] = event
                    if not event["ok"]:
                        self.say(f"  ! {name} {event['workload']}: {event['error'][:300]}")
        return prepared

    def measure(self, pairs: list[tuple[str, str]], rounds: int, runs: int, *,
                warmup: int = 10, seed: int = 0) -> dict[tuple[str, str], list[dict]]:
        """Each (workload, runtime) once per round, in a fresh process; the order is shuffled
        every round, so slow drifts of the shared machine spread over all configurations."""
        results: dict[tuple[str, str], list[dict]] = {pair: [] for pair in pairs}
        rng = random.Random(seed)
        for r in range(rounds):
            order = list(pairs)
            rng.shuffle(order)
            start = time.perf_counter()
            for workload, runtime in order:
                spec = {"mode": "measure", "runtime": runtime, "workload": workload,
                        "round": r, "runs": runs, "warmup": warmup}
                for event in self.worker(spec):
                    if event.get("event") == "measure":
                        results[(workload, runtime)].append(event)
            self.say(f"round {r + 1}/{rounds}: {len(order)} configurations in "
                     f"{time.perf_counter() - start:.0f} s (load average {os.getloadavg()[0]:.2f})")
        return results
