"""Turn measurements into the summary, the markdown report and the ratio chart."""

from __future__ import annotations

import math
import pathlib
from typing import Iterable

from stats import geomean, summarize

__all__ = ["summarize_measurements", "failed_cells", "markdown", "ratio_chart", "fmt_time",
           "BASELINE", "TOLERANCE"]

BASELINE = "opforge-lean"
# The second ratio table, when the run has it: the cpu backend against every other runtime
# (the performance issue's targets are ratios to it).
CPU_BASELINE = "opforge-cpu"
# The largest absolute difference from eager's outputs a runtime may show on any checked
# call (the models' float32 outputs are of order 1; the largest error in
# results/latest.md, et-xnnpack on gpt_decoder, is 1.0e-4). A cell beyond it is *failed*:
# its times stay in the results but count in no ratio or geomean, the tables say
# "failed", and bench/run.py exits with status 1.
TOLERANCE = 1e-3


def summarize_measurements(measured: dict[tuple[str, str], list[dict]],
                           prepared: dict[tuple[str, str], dict],
                           tolerance: float = TOLERANCE,
                           tolerances: dict[str, float] | None = None) -> dict[str, dict[str, dict]]:
    """``{workload: {runtime: cell}}``; a cell pools every round's samples. A measured cell
    whose ``max_abs_error`` is above its workload's tolerance (``tolerances[workload]``,
    else ``tolerance``; or nan) gets ``failed`` (the reason) and ``ok`` False."""
    table: dict[str, dict[str, dict]] = {}
    for (workload, runtime), events in measured.items():
        limit = (tolerances or {}).get(workload, tolerance)
        ok = [e for e in events if e.get("ok")]
        cell: dict = {"ok": bool(ok), "rounds": len(ok)}
        prep = prepared.get((workload, runtime), {})
        if "export_s" in prep:
            cell["export_s"] = prep["export_s"]
            cell["artifact_bytes"] = prep["artifact_bytes"]
        if ok:
            cell.update(summarize([s for e in ok for s in e["samples_s"]]))
            cell["round_medians_s"] = [e["median_s"] for e in ok]
            cell["max_abs_error"] = max(e["max_abs_error"] for e in ok)
            cell["peak_rss_mb"] = max(e["peak_rss_mb"] for e in ok)
            cell["rss_imported_mb"] = max(e["rss_imported_mb"] for e in ok)
            cell["import_s"] = sorted(e["import_s"] for e in ok)[len(ok) // 2]
            cell["load_s"] = sorted(e["load_s"] for e in ok)[len(ok) // 2]
            cell["torch_imported"] = any(e["torch_imported"] for e in ok)
            cell["thread_pool"] = ok[0].get("thread_pool")
            if all("alloc_peak_bytes" in e for e in ok):
                cell["alloc_peak_bytes"] = max(e["alloc_peak_bytes"] for e in ok)
                cell["alloc_retained_bytes"] = max(e["alloc_retained_bytes"] for e in ok)
        else:
            errors = [e.get("error", "") for e in events] or [prep.get("error", "not measured")]
            cell["error"] = prep.get("error") or errors[0]
        if ok:
            cell["tolerance"] = limit
        if ok and not cell["max_abs_error"] <= limit:  # nan fails too
            cell["ok"] = False
            cell["failed"] = (f"output differs from eager: max abs error "
                              f"{cell['max_abs_error']:.1e} > tolerance {limit:.1e}")
        table.setdefault(workload, {})[runtime] = cell
    return table


def failed_cells(table: dict) -> list[tuple[str, str, str]]:
    """``(workload, runtime, reason)`` of every cell whose output was wrong."""
    return [(w, r, cell["failed"]) for w, cells in table.items() for r, cell in cells.items()
            if "failed" in cell]


def fmt_time(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "—"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds:.3g} s"


def _ratio(table: dict, workload: str, runtime: str, baseline: str = BASELINE) -> float | None:
    base, cell = table[workload].get(baseline, {}), table[workload].get(runtime, {})
    if base.get("ok") and cell.get("ok"):
        return cell["median_s"] / base["median_s"]
    return None


def _row(cells: Iterable[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _grid(title: str, note: str, workloads: list[str], runtimes: list[str], table: dict, cell_text,
          extra_rows: list[list[str]] = ()) -> list[str]:
    lines = [f"### {title}", "", note, "", _row(["workload", *runtimes]),
             _row(["---", *(["---:"] * len(runtimes))])]
    for workload in workloads:
        lines.append(_row([workload, *(cell_text(workload, r, table[workload].get(r, {}))
                                       for r in runtimes)]))
    lines += [_row(row) for row in extra_rows]
    return lines + [""]


def _ratio_grid(table: dict, workloads: list[str], runtimes: list[str], baseline: str) -> list[str]:
    def ratio(workload, runtime, cell):
        value = _ratio(table, workload, runtime, baseline)
        return "n/a" if value is None else f"{value:.2f}×"

    geo = ["**geomean**"]
    for runtime in runtimes:
        values = [_ratio(table, w, runtime, baseline) for w in workloads]
        geo.append(f"**{geomean([v for v in values if v]):.2f}×**" if any(values) else "n/a")
    name = baseline.replace("-", " ")
    return _grid(f"Ratio: runtime's median / {name}'s median",
                 f"Above 1×: {name} is that many times faster; below 1×: the other is faster.",
                 workloads, runtimes, table, ratio, [geo])


def markdown(table: dict, workloads: list[str], runtimes: list[str], setup: dict,
             micro_lines: list[str]) -> str:
    machine = setup["machine"]
    tolerance = setup.get("tolerance", TOLERANCE)
    versions = ", ".join(f"{k} {v}" for k, v in machine["versions"].items())
    lines = [
        "# opforge benchmarks: latest results", "",
        f"- Machine: {machine['cpu']}, {machine['cores']} cores, {machine['memory_gib']} GiB, "
        f"Linux {machine['kernel']}, Python {machine['python']}; shared with other jobs "
        f"(load average at start {setup['load_start']:.2f}, at end {setup['load_end']:.2f}).",
        f"- Versions: {versions}; opforge commit {machine['opforge_commit']} "
        f"({machine.get('opforge_source', 'working tree')}).",
        f"- Method: {setup['threads']} thread(s) for every runtime; each (workload, runtime) in "
        f"its own process, {setup['rounds']} interleaved round(s) × {setup['runs']} timed runs "
        "after warm-up; samples of all rounds pooled. Command: "
        f"`{setup['command']}`; took {setup['wall_s'] / 60:.1f} min.", "",
    ]

    def latency(workload, runtime, cell):
        if "failed" in cell:
            return f"**failed** ({fmt_time(cell['median_s'])})"
        if not cell.get("ok"):
            return "n/a"
        return f"{fmt_time(cell['median_s'])} ({fmt_time(cell['p10_s'])}–{fmt_time(cell['p90_s'])})"

    lines += _grid("Median latency per call (p10–p90)", "Lower is better.",
                   workloads, runtimes, table, latency)

    for baseline in (BASELINE, CPU_BASELINE):
        if baseline == CPU_BASELINE and baseline not in runtimes:
            continue
        lines += _ratio_grid(table, workloads, runtimes, baseline)

    def error(workload, runtime, cell):
        if "max_abs_error" not in cell:
            return "n/a"
        return f"{cell['max_abs_error']:.1e}" + (" **failed**" if "failed" in cell else "")

    own = {w: t for w, t in setup.get("tolerances", {}).items() if w in workloads}
    note = (f"Over every checked call of every round. Above {tolerance:.0e} the run "
            "is failed: its times count in no ratio.")
    if own:
        note += (" Quantized workloads are checked against eager's run of the quantized "
                 "model with their own tolerance (twice the largest difference quantization "
                 "itself makes between that model and the float one, "
                 "bench/quantized_workloads.py): "
                 + ", ".join(f"{w} {t:.2g}" for w, t in own.items()) + ".")
    lines += _grid("Max abs error against eager", note, workloads, runtimes, table, error)

    def export(workload, runtime, cell):
        if runtime == "eager":
            return "— (none)"
        return f"{cell['export_s']:.2f} s" if "export_s" in cell else "n/a"

    lines += _grid("Export time", "torch model → the runtime's file, one export per model after "
                   "one untimed warm-up export in the same process.", workloads, runtimes, table, export)

    wrong = [(w, r, reason) for w, r, reason in failed_cells(table) if w in workloads]
    if wrong:
        lines += ["### Failed: output differs from eager", ""]
        lines += [f"- **{w} on {r}**: {reason}" for w, r, reason in wrong] + [""]
    failures = [(w, r, table[w][r]["error"]) for w in workloads for r in runtimes
                if not table[w].get(r, {}).get("ok") and "error" in table[w].get(r, {})]
    if failures:
        lines += ["### Not measured", ""]
        lines += [f"- {w} on {r}: {e.splitlines()[0][:300]}" for w, r, e in failures] + [""]
    return "\n".join(lines + micro_lines) + "\n"


def ratio_chart(table: dict, workloads: list[str], runtimes: list[str], path: pathlib.Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    peers = [r for r in runtimes if r != BASELINE]
    fig, ax = plt.subplots(figsize=(9, 3.6), dpi=80)
    width = 0.8 / max(len(peers), 1)
    for k, runtime in enumerate(peers):
        xs, ys = [], []
        for i, workload in enumerate(workloads):
            value = _ratio(table, workload, runtime)
            if value:
                xs.append(i + (k - (len(peers) - 1) / 2) * width)
                ys.append(value)
        ax.bar(xs, ys, width, label=runtime)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_yscale("log")
    ax.set_xticks(range(len(workloads)), workloads, rotation=20, fontsize=8)
    ax.set_ylabel("peer time / opforge lean time")
    ax.set_title("Above 1: opforge lean is faster (log scale)", fontsize=9)
    ax.legend(fontsize=7, ncols=len(peers), loc="upper center", bbox_to_anchor=(0.5, -0.22))
    fig.tight_layout()
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)
