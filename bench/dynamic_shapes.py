"""What a dynamic shape costs the lean runtime: repeated calls, rebinding, memory growth.

    python bench/dynamic_shapes.py                  # the checkout (torch, rich)
    python bench/dynamic_shapes.py --baseline main  # and main, same run

Two zoo models, each exported twice with the portable kernels (as bench/run.py exports
them): static at its example shape, and with one dynamic dimension — ``transformer_layer``
with a dynamic sequence (seq in [1, 64], example 2×16×64), ``mlp`` with a dynamic batch
(batch in [1, 64], example 4×64). Exporting needs torch and runs in a child process; the
measuring workers never import torch. Every worker runs at 1 thread (OMP/OPENBLAS/MKL and
``OPFORGE_NUM_THREADS`` = 1, ``load(num_threads=1)``). Per model, per worker:

a. ``static``: the static program's call at the example shape;
b. ``repeated``: the dynamic program's call at the example shape, over and over (ratio to
   a; the issue's target is ≤ 1.1×);
c. ``rebind``: the time of a call at a shape *not* in the method's binding cache minus a
   repeated call at that shape. Misses are forced by cycling through
   ``Method.SHAPE_CACHE_SIZE + 1`` distinct sizes around the example's on one instance
   (least recently used eviction: every call misses); a second instance calls each of
   those sizes three times in a row and its third call is the repeated call;
d. memory: the growth of the traced Python heap (tracemalloc) and of the resident set
   (VmRSS) over 10,000 calls at the repeated shape, after 100 warm-up calls.

a, b and c take turns sample by sample (each sample times a batch of calls), so a slow
phase of the shared machine hits all of them alike; a worker per opforge tree and round,
trees alternating (``--baseline REF`` measures a snapshot of that git ref's ``opforge/``
in the same run). Medians pool all rounds. Writes bench/results/dynamic_shapes.md.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
MODELS = {  # name: (dynamic input dimension, symbol, example size, min, max)
    "transformer_layer": (1, "seq", 16, 1, 64),
    "mlp": (0, "batch", 4, 1, 64),
}
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                    "OPFORGE_NUM_THREADS")


# --- export (child process, torch) ------------------------------------------------------

def export_models(workdir: pathlib.Path) -> None:
    import torch  # noqa: F401
    from torch.export import Dim

    from opforge.examples.zoo import ZOO
    from opforge.export import export
    from opforge.program import save

    for name, (dim, symbol, _, low, high) in MODELS.items():
        model, inputs = ZOO[name]()
        save(export(model, inputs, kernels="portable"), workdir / f"{name}-static.opf")
        dynamic = ({dim: Dim(symbol, min=low, max=high)},)
        save(export(model, inputs, kernels="portable", dynamic_shapes=dynamic),
             workdir / f"{name}-dynamic.opf")
        import numpy as np
        np.save(workdir / f"{name}-input.npy", inputs[0].numpy())


# --- measuring worker (no torch) ----------------------------------------------------------

def _rss_kib() -> int:
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return -1


def measure(workdir: pathlib.Path, name: str, samples: int) -> dict:
    import tracemalloc

    import numpy as np

    from opforge.runtime import load
    from opforge.runtime.method import Method

    dim, _, example, low, high = MODELS[name]
    x = np.load(workdir / f"{name}-input.npy")
    static = load(workdir / f"{name}-static.opf", num_threads=1).method("forward")
    dynamic_program = load(workdir / f"{name}-dynamic.opf", num_threads=1)
    repeated, cycling, hits = (dynamic_program.method("forward") for _ in range(3))

    count = Method.SHAPE_CACHE_SIZE + 1
    first = max(low, min(example - count // 2, high - count + 1))
    sizes = list(range(first, first + count))

    def at(n: int) -> np.ndarray:
        shape = list(x.shape)
        shape[dim] = n
        return np.random.default_rng(n).standard_normal(shape).astype(x.dtype)

    inputs = {n: at(n) for n in sizes}
    np.testing.assert_allclose(repeated(x)[0], static(x)[0], rtol=1e-5, atol=1e-5)
    for n in sizes:  # a rebound call gives what a fresh instance gives at that size
        np.testing.assert_allclose(cycling(inputs[n])[0],
                                   dynamic_program.method("forward")(inputs[n])[0])

    clock = time.perf_counter_ns
    times: dict[str, list[float]] = {"static": [], "repeated": [], "miss": [], "hit": []}
    batch = 20
    position = 0
    for _ in range(samples):
        t0 = clock()
        for _ in range(batch):
            static(x)
        t1 = clock()
        for _ in range(batch):
            repeated(x)
        t2 = clock()
        miss = 0
        for _ in range(batch):  # every call is a miss: one more size than the cache holds
            a = inputs[sizes[position % count]]
            position += 1
            s = clock()
            cycling(a)
            miss += clock() - s
        hit = 0
        for _ in range(batch // 2):  # the same sizes, each a repeated call on its instance
            a = inputs[sizes[position % count]]
            position += 1
            hits(a)
            hits(a)
            s = clock()
            hits(a)
            hit += clock() - s
        times["static"].append((t1 - t0) / batch)
        times["repeated"].append((t2 - t1) / batch)
        times["miss"].append(miss / batch)
        times["hit"].append(hit / (batch // 2))

    for _ in range(100):
        repeated(x)
    rss = _rss_kib()
    tracemalloc.start()
    traced = tracemalloc.get_traced_memory()[0]
    for _ in range(10_000):
        repeated(x)
    traced = tracemalloc.get_traced_memory()[0] - traced
    tracemalloc.stop()
    return {"model": name, "sizes": sizes, "samples_ns": times,
            "traced_growth_bytes": traced, "rss_growth_kib": _rss_kib() - rss,
            "instructions": len(repeated.instructions)}


def worker(workdir: pathlib.Path, samples: int) -> None:
    for name in MODELS:
        print(json.dumps(measure(workdir, name, samples)), flush=True)


# --- orchestration ------------------------------------------------------------------------

def snapshot(ref: str, workdir: pathlib.Path) -> str:
    """``opforge/`` of git ref ``ref`` in a folder of its own (a PYTHONPATH entry)."""
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", ref], capture_output=True,
                            text=True, check=True).stdout.strip()
    target = workdir / f"opforge-{commit[:12]}"
    if not target.exists():
        target.mkdir(parents=True)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit, "opforge"],
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
    return str(target)


def run_worker(tree: str, workdir: pathlib.Path, samples: int) -> list[dict]:
    env = dict(os.environ, PYTHONPATH=tree, PYTHONWARNINGS="ignore")
    env.update({v: "1" for v in THREAD_VARIABLES})
    done = subprocess.run([sys.executable, __file__, "--worker", "--workdir", str(workdir),
                           "--samples", str(samples)], env=env, capture_output=True,
                          text=True, check=False)
    if done.returncode:
        raise SystemExit(f"bench/dynamic_shapes.py: worker for {tree} failed:\n{done.stderr}")
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def summarize(results: list[dict]) -> dict:
    import numpy as np

    pooled: dict[str, list[float]] = {}
    for result in results:
        for key, values in result["samples_ns"].items():
            pooled.setdefault(key, []).extend(values)
    med = {key: float(np.median(v)) / 1e3 for key, v in pooled.items()}
    return {"static_us": med["static"], "repeated_us": med["repeated"],
            "ratio": med["repeated"] / med["static"], "miss_us": med["miss"],
            "hit_us": med["hit"], "rebind_us": med["miss"] - med["hit"],
            "traced_growth_bytes": max(r["traced_growth_bytes"] for r in results),
            "rss_growth_kib": max(r["rss_growth_kib"] for r in results),
            "sizes": results[0]["sizes"], "instructions": results[0]["instructions"],
            "samples": len(pooled["static"])}


def report(rows: dict, args: argparse.Namespace, started: float) -> str:
    from rich.console import Console
    from rich.table import Table

    header = ["model", "tree", "static", "dynamic, repeated shape", "ratio (≤ 1.1×)",
              "call at a new shape", "rebinding (target ≤ 50 µs)", "traced heap / RSS growth"]
    table = Table(*header, title="dynamic shapes, lean runtime, 1 thread (medians)")
    lines = ["# Dynamic shapes: repeated calls, rebinding, memory", "",
             f"Written by `bench/dynamic_shapes.py {' '.join(sys.argv[1:])}` on "
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: {args.rounds} rounds × "
             f"{args.samples} samples per tree, 1 thread, load average "
             f"{os.getloadavg()[0]:.2f} at the end, {time.perf_counter() - started:.0f} s. "
             "See bench/README.md (Dynamic shapes) for the method.", "",
             "| " + " | ".join(header) + " |", "|" + " --- |" * 2 + " ---: |" * 6]
    for (model, tree), s in rows.items():
        dim, symbol, example, low, high = MODELS[model]
        label = f"{model} ({symbol} {example} in [{low}, {high}], {s['instructions']} instr.)"
        cells = [label, tree, f"{s['static_us']:.1f} µs", f"{s['repeated_us']:.1f} µs",
                 f"{s['ratio']:.3f}×", f"{s['miss_us']:.1f} µs", f"{s['rebind_us']:.1f} µs",
                 f"{s['traced_growth_bytes']} B / {s['rss_growth_kib']} KiB"]
        table.add_row(*cells)
        lines.append("| " + " | ".join(cells) + " |")
    sizes = {m: s["sizes"] for (m, _), s in rows.items()}
    lines += ["", "Rebinding = a call at a shape not in the 16-shape binding cache (forced by "
              "cycling through 17 sizes, "
              + "; ".join(f"{m}: {v[0]}..{v[-1]}" for m, v in sizes.items())
              + ") minus a repeated call at the same sizes. Memory: growth over 10,000 calls "
              "at the example shape after 100 warm-up calls.", ""]
    Console(width=200).print(table)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", metavar="REF",
                        help="also measure this git ref's opforge (a snapshot), same run")
    parser.add_argument("--rounds", type=int, default=3, help="workers per tree (3)")
    parser.add_argument("--samples", type=int, default=100, help="samples per worker (100)")
    parser.add_argument("--workdir", type=pathlib.Path, default=HERE / "work" / "dynamic_shapes")
    parser.add_argument("--out", type=pathlib.Path,
                        default=HERE / "results" / "dynamic_shapes.md")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--export", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.workdir = args.workdir.resolve()
    if args.worker:
        worker(args.workdir, args.samples)
        return 0
    if args.export:
        export_models(args.workdir)
        return 0
    started = time.perf_counter()
    args.workdir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONWARNINGS="ignore")
    subprocess.run([sys.executable, __file__, "--export", "--workdir", str(args.workdir)],
                   env=env, check=True)
    trees = {"checkout": str(ROOT)}
    if args.baseline:
        trees[args.baseline] = snapshot(args.baseline, args.workdir)
    results: dict = {}
    for r in range(args.rounds):
        for label, tree in (trees.items() if r % 2 == 0 else reversed(trees.items())):
            for result in run_worker(tree, args.workdir, args.samples):
                results.setdefault((result["model"], label), []).append(result)
        print(f"round {r + 1}/{args.rounds} (load average {os.getloadavg()[0]:.2f})",
              file=sys.stderr, flush=True)
    rows = {key: summarize(value) for key, value in sorted(results.items())}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report(rows, args, started) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
