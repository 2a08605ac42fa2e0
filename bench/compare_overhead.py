"""What debug handles and capturing cost on the normal path (issue 27): nothing, measured.

    python bench/compare_overhead.py --tree /path/to/opforge-before --tree .   # A/B
    python bench/compare_overhead.py                                          # this tree only

For each tree (a checkout of opforge: ``PYTHONPATH`` points at it), a worker process
exports the same models and measures, with capture off:

- ``call lean chain50``: one call of a method of 50 tiny adds (per-instruction overhead);
- ``call lean mlp``: a 12-node chain (two linears, elementwise ops) on the lean runtime;
- ``call aten mlp``: the same program in ATen mode;
- ``call cpu mlp``: the same model delegated to the cpu backend (one engine call);
- ``load chain400``: ``load(bytes)`` + ``.method()`` of a 400-instruction program (the
  loader verifies the debug table when the program has one: the new tree's default);
- ``call lean mlp, capture on``: ``Capture.run`` per call (only where it exists).

Each figure is the median of ``--rounds`` × ``--repeats`` batches (a batch times
``--batch`` calls). Workers of the trees alternate round by round, so drift on a shared
machine hits both alike. Prints one table and, with ``--json``, the raw medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path


def _worker(repeats: int, batch: int) -> dict:
    import torch

    from opforge.export import export
    from opforge.program import to_bytes
    from opforge.runtime import load

    class Chain(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.fc1, self.fc2 = torch.nn.Linear(16, 16), torch.nn.Linear(16, 16)

        def forward(self, x):
            y = torch.sigmoid(torch.relu(self.fc1(x)) * 0.5 + 1.0)
            y = torch.abs(self.fc2(torch.tanh(y - 0.25))) * 2.0
            return torch.exp(-y)

    class Adds(torch.nn.Module):
        def __init__(self, n: int) -> None:
            super().__init__()
            self.n = n

        def forward(self, x):
            for _ in range(self.n):
                x = x + 1.0
            return x

    def per_call(fn, *args) -> float:
        for _ in range(20):
            fn(*args)
        samples = []
        for _ in range(repeats):
            start = time.perf_counter_ns()
            for _ in range(batch):
                fn(*args)
            samples.append((time.perf_counter_ns() - start) / batch)
        return statistics.median(samples)

    x = torch.randn(4, 16)
    xs = x.numpy()
    tiny = torch.randn(1, 4)
    results = {}
    chain = export(Chain(), (x,))
    adds = export(Adds(50), (tiny,))
    results["call lean chain50"] = per_call(load(adds).method(), tiny.numpy())
    results["call lean mlp"] = per_call(load(chain).method(), xs)
    results["call aten mlp"] = per_call(load(chain, mode="aten").method(), xs)
    try:
        cpu = export(Chain(), (x,), backends=["cpu"])
        results["call cpu mlp"] = per_call(load(cpu).method(), xs)
    except Exception as e:  # noqa: BLE001 - no cpu backend here: the row says so
        print(f"cpu: {e}", file=sys.stderr)
    big = to_bytes(export(Adds(400), (tiny,)))
    results["load chain400"] = per_call(lambda: load(big).method())
    results["program bytes chain400"] = float(len(big))
    try:
        from opforge.runtime import Capture
    except ImportError:
        return results
    capture = Capture(load(chain), "forward")
    results["call lean mlp, capture on"] = per_call(lambda: capture.run([xs]))
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", default=[],
                        help="an opforge checkout to measure (repeatable; default: this one)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(_worker(args.repeats, args.batch)))
        return 0
    trees = [str(Path(t).resolve()) for t in args.tree] or [str(Path(__file__).resolve().parents[1])]
    rounds: dict[str, list[dict]] = {t: [] for t in trees}
    for _ in range(args.rounds):
        for tree in trees:
            env = {**os.environ, "PYTHONPATH": tree}
            proc = subprocess.run(
                [sys.executable, __file__, "--worker", "--repeats", str(args.repeats),
                 "--batch", str(args.batch)], env=env, cwd=tree, capture_output=True,
                text=True, check=False)
            if proc.returncode:
                print(proc.stderr, file=sys.stderr)
                return 1
            rounds[tree].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    medians = {t: {k: statistics.median(r[k] for r in rs if k in r)
                   for k in dict.fromkeys(k for r in rs for k in r)} for t, rs in rounds.items()}
    if args.json:
        print(json.dumps(medians, indent=2))
    rows = list(dict.fromkeys(k for m in medians.values() for k in m))
    print("| measure | " + " | ".join(trees) + (" | change |" if len(trees) == 2 else " |"))
    print("| --- " * (len(trees) + 1 + (len(trees) == 2)) + "|")
    for key in rows:
        cells = []
        for t in trees:
            v = medians[t].get(key)
            cells.append("n/a" if v is None else (f"{v:.0f} B" if "bytes" in key else f"{v / 1e3:.2f} µs"))
        change = ""
        if len(trees) == 2 and all(key in medians[t] for t in trees):
            a, b = medians[trees[0]][key], medians[trees[1]][key]
            change = f" {100 * (b - a) / a:+.1f}% |"
        print(f"| {key} | " + " | ".join(cells) + " |" + change)
    return 0


if __name__ == "__main__":
    sys.exit(main())
