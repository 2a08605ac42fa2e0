"""Where the opforge lean runtime spends its time: the profile behind the benchmark figures.

    bench/.venv-peers/bin/python bench/hotspots.py [--models mlp tiny_add chain_128 ...]

Needs the programs run.py exported (bench/work/<workload>/opforge-lean.opf; missing ones
are exported first, in a separate process). The profiling itself runs here, in a process
that never imports torch. For each workload:

1. A breakdown of one call (medians of many): the public call ``forward(*inputs)``; the
   same with ``views=True`` (no output copies); the bare bound-instruction loop
   (``for fn, args in forward._bound: fn(*args)``, a private attribute read here on
   purpose); and, for one-instruction programs, the NumPy ufunc the kernel wraps, called
   directly. The differences are input handling, output copies, kernel-wrapper overhead.
2. The runtime's own tracer (``Method.run(..., tracer=Tracer())``): time per op.
3. cProfile over many calls: the Python functions with the most time of their own.

Writes bench/results/hotspots.md.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pathlib
import pstats
import sys
import time

# The same thread settings as run.py's workers, before NumPy loads its BLAS.
for _variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_variable, "2")

import numpy as np  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

DEFAULT = ("tiny_add", "chain_128", "mlp", "cnn", "transformer_layer", "eltwise_chain", "gpt_decoder")


def interleaved_medians(fns: dict, min_total_s: float = 0.6, samples: int = 41) -> dict:
    """Median seconds per call of each function; the functions take turns batch by batch,
    so a slow phase of the shared machine hits all of them alike."""
    inner = {}
    for name, fn in fns.items():
        fn()
        start, calls = time.perf_counter(), 0
        while time.perf_counter() - start < 0.03:
            fn()
            calls += 1
        per = (time.perf_counter() - start) / calls
        inner[name] = max(1, int(min_total_s / len(fns) / samples / per))
    times: dict = {name: [] for name in fns}
    for _ in range(samples):
        for name, fn in fns.items():
            n = inner[name]
            t0 = time.perf_counter_ns()
            for _ in range(n):
                fn()
            times[name].append((time.perf_counter_ns() - t0) / n / 1e9)
    return {name: float(np.median(t)) for name, t in times.items()}


def us(seconds: float) -> str:
    return f"{seconds * 1e6:,.1f} µs"


def profile_workload(name: str, workdir: pathlib.Path, lines: list[str]) -> None:
    from opforge.runtime import Tracer, load
    from worker import load_io

    inputs, _ = load_io(str(workdir), name)
    forward = load(workdir / name / "opforge-lean.opf", mode="lean").method("forward")
    # Private attributes, read here on purpose: the bound (fn, args) pairs and the inputs'
    # arena slots. The bare loop still copies the inputs in (planned memory may reuse an
    # input's slot once it is dead), but skips the public call's checks and output copies.
    bound = forward._bound  # noqa: SLF001
    slots = [forward._values.get(spec.index) for spec in forward.inputs]  # noqa: SLF001
    copyto = np.copyto

    def bare():
        for slot, given in zip(slots, inputs):
            copyto(slot, given)
        for fn, args in bound:
            fn(*args)

    fns = {"call": lambda: forward(*inputs), "views": lambda: forward(*inputs, views=True),
           "loop": bare}
    ops = {key for _, key in forward.instructions}
    if ops == {"aten::add.out"}:
        fn, args = bound[0]
        # The bound pair: the portable kernel with (self, other, alpha, out), or whatever
        # its bind-time specialisation returned, e.g. np.add with (a, b, out).
        a, b, out = args[0], args[1], args[-1]
        fns["kernel"] = lambda: fn(*args)
        fns["raw"] = lambda: np.add(a, b, out=out)
    t = interleaved_medians(fns)
    call, views, loop = t["call"], t["views"], t["loop"]
    n = len(bound)
    lines += [f"### {name}: {n} instruction(s)", "",
              "| what | per call | per instruction |", "| --- | ---: | ---: |",
              f"| `forward(*inputs)` (public call) | {us(call)} | {us(call / n)} |",
              f"| `forward(*inputs, views=True)` (no output copy) | {us(views)} | |",
              f"| bare loop: copy inputs in, `for fn, args in bound: fn(*args)` | {us(loop)} | {us(loop / n)} |",
              f"| → input checks (call with views − bare loop) | {us(views - loop)} | |",
              f"| → output copies | {us(call - views)} | |"]
    if "kernel" in t:
        raw, kernel = t["raw"], t["kernel"]
        lines += [f"| the bound `add.out` pair alone, `fn(*args)` (fn = `{getattr(fn, '__name__', fn)}`) | {us(kernel)} | |",
                  f"| `np.add(a, b, out=out)`, what it wraps | {us(raw)} | |",
                  f"| → kernel wrapper overhead (promotion, errstate, checks) | {us(kernel - raw)} | |",
                  f"| → executor loop overhead per instruction | | {us(loop / n - kernel)} |"]
    lines.append("")

    tracer = Tracer()
    runs = max(3, min(200, int(0.5 / max(call, 1e-6))))
    for _ in range(runs):
        forward.run(inputs, tracer=tracer)
    summary = tracer.summary()
    total_ns = sum(s.total_ns for s in summary)
    lines += [f"Tracer over {runs} calls (instruction time only; the tracer's clock reads add "
              "~0.1 µs each):", "", "| op | calls/run | mean | share |", "| --- | ---: | ---: | ---: |"]
    for s in summary[:8]:
        lines.append(f"| {s.op} | {s.calls // runs} | {s.mean_us:,.1f} µs | "
                     f"{100 * s.total_ns / total_ns:.0f}% |")
    lines.append("")

    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(runs):
        forward(*inputs)
    profiler.disable()
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    stats.sort_stats("tottime")
    rows = []
    for (file, line, func), (cc, nc, tt, ct, _) in sorted(stats.stats.items(),
                                                           key=lambda kv: -kv[1][2])[:10]:
        where = pathlib.Path(file).name if file != "~" else ""
        rows.append(f"| `{func}` {where}:{line} | {nc // runs} | {tt / runs * 1e6:,.1f} µs | "
                    f"{ct / runs * 1e6:,.1f} µs |")
    lines += [f"cProfile over {runs} calls (per call; cProfile inflates Python-level costs, "
              "compare rows with each other, not with the timings above):", "",
              "| function | calls/run | own time | cumulative |", "| --- | ---: | ---: | ---: |",
              *rows, ""]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(DEFAULT))
    parser.add_argument("--workdir", type=pathlib.Path, default=HERE / "work")
    parser.add_argument("--out", type=pathlib.Path, default=HERE / "results" / "hotspots.md")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)

    missing = [m for m in args.models if not (args.workdir / m / "opforge-lean.opf").exists()
               or not (args.workdir / m / "io.npz").exists()]
    if missing:
        from harness import Harness
        with open(args.workdir / "hotspots-workers.log", "w") as log:
            Harness(args.workdir, args.threads, log).prepare(missing, ["opforge-lean"])

    lines = ["# Where the opforge lean runtime spends its time", "",
             "Written by `bench/hotspots.py` (single process, no torch imported; medians of "
             "many calls). See bench/README.md for how to read it.", ""]
    for name in args.models:
        print(f"hotspots: {name}", file=sys.stderr, flush=True)
        try:
            profile_workload(name, args.workdir, lines)
        except Exception as error:  # one failing workload must not lose the others
            lines += [f"### {name}", "", f"failed: {type(error).__name__}: {error}", ""]
    lines.append(f"torch imported while profiling: {'torch' in sys.modules}")
    args.out.write_text("\n".join(lines) + "\n")
    print(f"hotspots: wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
