"""How a comparison is shown: a table, JSON for scripts, a self-contained HTML plot.

The table has one row per node result of the reference (graph order) and one column per
run: SQNR in dB and the relative error, red where the run leaves its tolerance, with the
first such node marked; below it, per run, the first divergent node with its model source
line. The HTML page plots per-node SQNR along the graph for every run (inline SVG, no
script, nothing fetched) above the same table.
"""

from __future__ import annotations

import html
import json
import math

from opforge.compare.api import Comparison, NodeRow

__all__ = ["print_comparison", "to_json", "to_html", "summary_lines", "clipping_line"]

SQNR_CAP = 150.0  # dB: where an exact match (inf) is drawn
_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")


def _sqnr_text(v: float) -> str:
    return "exact" if v == math.inf else f"{v:.1f} dB"


def _cell(row: NodeRow, run: str, first: NodeRow | None) -> tuple[str, bool]:
    error = row.errors.get(run)
    if error is None:
        return "—", True
    text = f"{_sqnr_text(error.sqnr)} {error.rel:.1e}"
    if error.note:
        text = error.note
    if first is row:
        text += " ◀ first"
    return text, error.within


def summary_lines(result: Comparison) -> list[str]:
    """One line per run: where it first leaves its tolerance, or that it never does."""
    lines = []
    for run in result.runs:
        observed = sum(1 for row in result.rows if row.errors.get(run.name) is not None)
        first = result.first_divergence(run.name)
        if first is None:
            lines.append(f"{run.name}: within tolerance ({run.tolerance.describe()}) at all "
                         f"{observed} observed node(s)")
            continue
        e = first.errors[run.name]
        where = f" — {first.source}" if first.source else ""
        lines.append(f"{run.name}: first leaves tolerance at node #{first.index} "
                     f"`{first.label}` ({first.op}){where} — max abs {e.max_abs:.3g}, rel "
                     f"{e.rel:.3g}, SQNR {_sqnr_text(e.sqnr)}" + (f" ({e.note})" if e.note else ""))
    return lines


def print_comparison(console, result: Comparison, *, rows: str = "all") -> None:
    """The table (``rows``: ``all``, or ``diverged``: only rows some run is out on) and the
    summary, on a rich console."""
    from rich.table import Table

    firsts = {r.name: result.first_divergence(r.name) for r in result.runs}
    table = Table(title=f"per-node error against the reference ({result.reference}): "
                        "SQNR and relative error", title_justify="left")
    table.add_column("#", justify="right")
    table.add_column("node")
    table.add_column("op")
    for run in result.runs:
        table.add_column(run.name)
    for row in result.rows:
        cells = [_cell(row, r.name, firsts[r.name]) for r in result.runs]
        if rows == "diverged" and all(ok for _, ok in cells):
            continue
        table.add_row(str(row.index), row.label, row.op,
                      *[text if ok else f"[red]{text}[/red]" for text, ok in cells])
    console.print(table)
    for run, line in zip(result.runs, summary_lines(result)):
        mark = "[green]✓[/green]" if firsts[run.name] is None else "[red]✗[/red]"
        console.print(f"{mark} {line}", soft_wrap=True, highlight=False)
        for key, text in run.integers.items() if firsts[run.name] is not None else ():
            if key == (firsts[run.name].name, firsts[run.name].item):
                console.print(f"    integer tensor there: {text}", highlight=False)
        line = clipping_line(result, run)
        if line:
            console.print(f"    {line}", soft_wrap=True, highlight=False)


def clipping_line(result: Comparison, run) -> str:
    """For a quantized run: the nodes whose values went past their integer range (the
    calibration did not show such values), the worst first; '' when none did."""
    clipped = getattr(run, "clipped", {})
    if not clipped:
        return ""
    rows = {(row.name, row.item): row for row in result.rows}
    worst = sorted(clipped.items(), key=lambda kv: -kv[1][2])
    named = [f"#{rows[k].index} `{rows[k].label}` ({c}/{n}, {r:.3g}x)"
             for k, (c, n, r) in worst[:5] if k in rows]
    more = f" and {len(worst) - 5} more" if len(worst) > 5 else ""
    return (f"values past the calibrated range (clipped) at {len(clipped)} node(s): "
            f"{', '.join(named)}{more} — clipping costs the whole excess, not a rounding "
            "step — fix: calibrate on more representative inputs, or widen the ranges "
            "(QuantConfig(act_headroom=...))")


def to_json(result: Comparison) -> str:
    return json.dumps(result.as_dict(), indent=2)


def to_html(result: Comparison, *, title: str = "opforge compare") -> str:
    """A self-contained page: per-node SQNR along the graph for each run, and the table."""
    width, height, pad = 960, 360, 48
    n = max(len(result.rows), 2)
    lo = min([0.0] + [max(e.sqnr, -20.0) for row in result.rows for e in row.errors.values()
                      if e is not None and math.isfinite(e.sqnr)])

    def x(i: int) -> float:
        return pad + (width - 2 * pad) * i / (n - 1)

    def y(v: float) -> float:
        v = SQNR_CAP if v > SQNR_CAP else max(v, lo)
        return height - pad - (height - 2 * pad) * (v - lo) / (SQNR_CAP - lo)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             'font-family="sans-serif" font-size="11">',
             f'<rect x="{pad}" y="{pad}" width="{width - 2 * pad}" height="{height - 2 * pad}" '
             'fill="none" stroke="#999"/>']
    for tick in range(int(math.ceil(lo / 25.0)) * 25, int(SQNR_CAP) + 1, 25):
        parts.append(f'<line x1="{pad}" x2="{width - pad}" y1="{y(tick):.1f}" y2="{y(tick):.1f}" '
                     f'stroke="#eee"/><text x="{pad - 4}" y="{y(tick) + 4:.1f}" '
                     f'text-anchor="end">{tick}</text>')
    parts.append(f'<text x="12" y="{height / 2}" transform="rotate(-90 12 {height / 2})" '
                 'text-anchor="middle">SQNR (dB, exact drawn at 150)</text>')
    parts.append(f'<text x="{width / 2}" y="{height - 12}" text-anchor="middle">node (graph order)</text>')
    for k, run in enumerate(result.runs):
        color = _COLORS[k % len(_COLORS)]
        points = [(row, row.errors.get(run.name)) for row in result.rows]
        points = [(row, e) for row, e in points if e is not None]
        path = " ".join(f"{x(row.index):.1f},{y(e.sqnr):.1f}" for row, e in points)
        parts.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="1.5"/>')
        for row, e in points:
            tip = html.escape(f"{run.name}: #{row.index} {row.label} ({row.op}) SQNR "
                              f"{_sqnr_text(e.sqnr)}, rel {e.rel:.2e}")
            fill = color if e.within else "#000"
            parts.append(f'<circle cx="{x(row.index):.1f}" cy="{y(e.sqnr):.1f}" r="2.5" '
                         f'fill="{fill}"><title>{tip}</title></circle>')
        first = result.first_divergence(run.name)
        if first is not None:
            parts.append(f'<line x1="{x(first.index):.1f}" x2="{x(first.index):.1f}" y1="{pad}" '
                         f'y2="{height - pad}" stroke="{color}" stroke-dasharray="4 3"/>')
        parts.append(f'<text x="{width - pad - 4}" y="{pad + 14 + 14 * k}" text-anchor="end" '
                     f'fill="{color}">{html.escape(run.name)}</text>')
    parts.append("</svg>")
    head = "".join(f"<th>{html.escape(r.name)}</th>" for r in result.runs)
    firsts = {r.name: result.first_divergence(r.name) for r in result.runs}
    body = []
    for row in result.rows:
        cells = []
        for r in result.runs:
            text, ok = _cell(row, r.name, firsts[r.name])
            cells.append(f'<td class="{"" if ok else "out"}">{html.escape(text)}</td>')
        body.append(f"<tr><td>{row.index}</td><td>{html.escape(row.label)}</td>"
                    f"<td>{html.escape(row.op)}</td>{''.join(cells)}"
                    f"<td class='src'>{html.escape(row.source)}</td></tr>")
    summary = "".join(f"<li>{html.escape(line)}</li>" for line in summary_lines(result))
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            "<style>body{font-family:sans-serif;margin:1em}table{border-collapse:collapse;"
            "font-size:12px}td,th{border:1px solid #ddd;padding:2px 6px}td.out{color:#c00;"
            "font-weight:bold}td.src{color:#666}</style></head><body>"
            f"<h1>{html.escape(title)}</h1><p>reference: {html.escape(result.reference)}</p>"
            f"<ul>{summary}</ul>{''.join(parts)}<table><tr><th>#</th><th>node</th><th>op</th>"
            f"{head}<th>source</th></tr>{''.join(body)}</table></body></html>")
