"""Microbenchmarks: what a runtime costs apart from the kernels.

- per call: ``tiny_add`` (one add of two 1×4 tensors) from the main table;
- per instruction: chains of N tiny adds, N in CHAIN_LENGTHS; the least-squares slope of
  median time over N is the cost of one more instruction, the intercept the fixed cost;
- cold import: a fresh ``python -c "import M"`` per sample, the median of several (both
  the import as timed inside the process and the whole process's wall time);
- peak resident memory running the MLP: from the main suite's workers (VmHWM
  after the timed runs, beside the peak right after the imports);
- a program with ~100 MB of weights: load time and VmRSS right after load, after the first
  run and after ten more (constants are memory-mapped: RSS grows only as they are read);
- native build time, cold vs cached, when ``opforge.native`` exists.

Run by run.py (``--micro-only`` runs just these).
"""

from __future__ import annotations

import importlib.util
import json
import statistics
import subprocess
import time

from harness import Harness
from report import fmt_time
from stats import fit_line
from workloads import CHAIN_LENGTHS

__all__ = ["run_micro", "micro_markdown", "IMPORTS"]

IMPORTS = {
    "python (nothing)": None,
    "numpy": "numpy",
    "opforge lean runtime": "opforge.runtime",
    "onnxruntime": "onnxruntime",
    "torch": "torch",
    "executorch pybindings": "executorch.extension.pybindings.portable_lib",
}

CHAIN_RUNTIMES = ("opforge-lean", "opforge-aten", "opforge-cpu", "eager", "ort", "et-portable", "et-xnnpack")
BIG_RUNTIMES = ("opforge-lean", "opforge-cpu", "ort", "et-xnnpack")


def per_instruction(h: Harness, runtimes: list[str], rounds: int, runs: int) -> dict:
    chains = [f"chain_{n}" for n in CHAIN_LENGTHS]
    h.prepare(chains, runtimes)
    measured = h.measure([(c, r) for c in chains for r in runtimes], rounds, runs, seed=1)
    fits = {}
    for runtime in runtimes:
        points = []
        for n, chain in zip(CHAIN_LENGTHS, chains):
            ok = [e for e in measured[(chain, runtime)] if e.get("ok")]
            if ok:
                points.append((n, statistics.median(s for e in ok for s in e["samples_s"])))
        if len(points) >= 2:
            slope, intercept = fit_line([p[0] for p in points], [p[1] for p in points])
            fits[runtime] = {"per_instruction_s": slope, "intercept_s": intercept,
                             "points": points}
        else:
            fits[runtime] = {"error": "fewer than two chain lengths measured"}
    return fits


def import_times(h: Harness, repeats: int) -> dict:
    code = ("import time, json; t = time.perf_counter(); {stmt}; "
            "print(json.dumps(time.perf_counter() - t))")
    results = {}
    for label, module in IMPORTS.items():
        stmt = f"import {module}" if module else "pass"
        inside, wall = [], []
        for _ in range(repeats):
            start = time.perf_counter()
            # cwd: not the checkout, whose opforge/ would shadow the snapshot on sys.path
            done = subprocess.run([h.python, "-c", code.format(stmt=stmt)], capture_output=True,
                                  text=True, env=h.env(), cwd=h.workdir)
            wall.append(time.perf_counter() - start)
            if done.returncode != 0:
                results[label] = {"error": done.stderr.strip().splitlines()[-1][:300]}
                break
            inside.append(json.loads(done.stdout.strip().splitlines()[-1]))
        else:
            results[label] = {"module": module, "import_s": statistics.median(inside),
                              "process_s": statistics.median(wall), "repeats": repeats}
    return results


def big_program(h: Harness, runtimes: list[str], repeats: int) -> dict:
    h.prepare(["big_mlp"], runtimes)
    results = {}
    for runtime in runtimes:
        events = []
        for _ in range(repeats):
            events += [e for e in h.worker({"mode": "bigload", "runtime": runtime,
                                            "workload": "big_mlp", "runs": 10})
                       if e.get("event") == "bigload"]
        if not events:
            results[runtime] = {"error": "bigload worker failed (see workers.log)"}
            continue
        keys = [k for k, v in events[0].items() if isinstance(v, float)]
        results[runtime] = {k: statistics.median(e[k] for e in events) for k in keys}
        results[runtime]["torch_imported"] = events[0]["torch_imported"]
    return results


def native_build(h: Harness, repeats: int) -> dict:
    if importlib.util.find_spec("opforge.native") is None:
        return {"skipped": "opforge.native does not exist in this checkout"}
    events = []
    for _ in range(repeats):
        events += [e for e in h.worker({"mode": "build"}) if e.get("event") == "build"]
    cold = [e["seconds"] for e in events if e["kind"] == "cold"]
    warm = [e["seconds"] for e in events if e["kind"] == "warm" and e["cached"]]
    if not cold:
        return {"skipped": "the build failed (see bench/work/workers.log)"}
    return {"cold_s": statistics.median(cold), "warm_s": statistics.median(warm) if warm else None,
            "cold_samples": len(cold), "warm_samples": len(warm), "kernels": events[0]["kernels"],
            "sources": events[0]["sources"]}


def run_micro(h: Harness, *, rounds: int, runs: int, repeats: int,
              runtimes: list[str]) -> dict:
    chain_runtimes = [r for r in CHAIN_RUNTIMES if r in runtimes]
    big_runtimes = [r for r in BIG_RUNTIMES if r in runtimes]
    h.say("micro: per-instruction chains")
    chains = per_instruction(h, chain_runtimes, rounds, runs)
    h.say("micro: cold imports")
    imports = import_times(h, repeats)
    h.say("micro: ~100 MB program")
    big = big_program(h, big_runtimes, max(1, repeats // 2))
    h.say("micro: native build, cold and cached")
    build = native_build(h, 1 if repeats < 5 else 2)
    return {"per_instruction": chains, "imports": imports, "big_program": big,
            "native_build": build}


def micro_markdown(micro: dict, table: dict) -> list[str]:
    lines = ["## Microbenchmarks", ""]

    tiny = table.get("tiny_add", {})
    mlp = table.get("mlp", {})
    chains = micro.get("per_instruction", {})
    runtimes = list(dict.fromkeys([*tiny, *chains, *mlp]))
    lines += ["### Per call, per instruction, peak memory", "",
              "Per call: median of `tiny_add` (one add of two 1×4 tensors). Per instruction: "
              f"least-squares slope over chains of N adds, N = {', '.join(map(str, CHAIN_LENGTHS))} "
              "(intercept = fixed cost of the chain program). Peak RSS: VmHWM (peak resident set) of the worker "
              "running the MLP, after its imports → after all runs.", "",
              "| runtime | per call | per instruction | chain intercept | peak RSS on mlp (after imports → peak) |",
              "| --- | ---: | ---: | ---: | ---: |"]
    for runtime in runtimes:
        call = tiny.get(runtime, {})
        fit = chains.get(runtime, {})
        rss = mlp.get(runtime, {})
        lines.append("| " + " | ".join([
            runtime,
            fmt_time(call["median_s"]) if call.get("ok") else "n/a",
            fmt_time(fit["per_instruction_s"]) if "per_instruction_s" in fit else "n/a",
            fmt_time(fit["intercept_s"]) if "intercept_s" in fit else "n/a",
            f"{rss['rss_imported_mb']:.0f} → {rss['peak_rss_mb']:.0f} MB" if rss.get("ok") else "n/a",
        ]) + " |")
    lines.append("")

    allocating = {w: c for w, cells in table.items() for r, c in cells.items()
                  if r == "opforge-lean" and "alloc_peak_bytes" in c}
    if allocating:
        lines += ["### Allocations per steady-state call (opforge lean)", "",
                  "tracemalloc over 20 calls with `views=True` (outputs are views of the arena, "
                  "so only what the runtime and its kernels allocate shows; the default call "
                  "adds one copy per output): the highest transient peak above the baseline, "
                  "and the bytes still held afterwards. Worst of all rounds.", "",
                  "| workload | transient peak | retained |", "| --- | ---: | ---: |"]
        lines += [f"| {w} | {c['alloc_peak_bytes']:,} B | {c['alloc_retained_bytes']:,} B |"
                  for w, c in allocating.items()]
        lines.append("")

    imports = micro.get("imports", {})
    if imports:
        lines += ["### Cold import", "",
                  "A fresh `python -c \"import M\"` per sample; median of the samples. "
                  "'in process' times the import statement; 'process' is the whole interpreter "
                  "run (start-up + import + exit).", "",
                  "| import | in process | process wall |", "| --- | ---: | ---: |"]
        for label, r in imports.items():
            if "error" in r:
                lines.append(f"| {label} | failed: {r['error']} | |")
            else:
                lines.append(f"| {label} (`{r['module'] or 'pass'}`) | {fmt_time(r['import_s'])} | "
                             f"{fmt_time(r['process_s'])} |")
        lines.append("")

    big = micro.get("big_program", {})
    if big:
        lines += ["### A program with ~100 MB of weights (six 2048×2048 Linear layers)", "",
                  "VmRSS of the worker: before load → right after load → after the first run → "
                  "after ten more runs.", "",
                  "| runtime | file | load | first run | steady run | RSS before → loaded → first run → runs | torch imported |",
                  "| --- | ---: | ---: | ---: | ---: | --- | --- |"]
        for runtime, r in big.items():
            if "error" in r:
                lines.append(f"| {runtime} | failed: {r['error']} | | | | | |")
                continue
            lines.append(
                f"| {runtime} | {r['file_mb']:.0f} MB | {fmt_time(r['load_s'])} | "
                f"{fmt_time(r['first_run_s'])} | {fmt_time(r['median_run_s'])} | "
                f"{r['rss_before_load_mb']:.0f} → {r['rss_after_load_mb']:.0f} → "
                f"{r['rss_after_first_run_mb']:.0f} → {r['rss_after_runs_mb']:.0f} MB | "
                f"{r['torch_imported']} |")
        lines.append("")

    build = micro.get("native_build", {})
    if build.get("skipped"):
        lines += ["### Native build", "", f"- skipped: {build['skipped']}", ""]
    elif build:
        lines += ["### Native build", "",
                  f"`opforge.native.build_library` on the bundled example (opforge/examples: "
                  f"{build['sources']} C++ sources, {build['kernels']} kernels), median of "
                  f"{build['cold_samples']} cold build(s) into an empty cache and "
                  f"{build['warm_samples']} cache hit(s).", "",
                  f"- cold: {fmt_time(build['cold_s'])}", f"- warm (cache hit): {fmt_time(build['warm_s'])}", ""]
    return lines
