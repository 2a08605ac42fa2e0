"""``compare``: run a model everywhere on the same inputs and align the node results.

    capture (torch.export) → reference: eager float64, node by node        reference.py
      → each run: eager, lean, aten, cpu / cpu-fused (debug builds), quantized   runs.py
      → per node and run: max abs error, relative error, SQNR, tolerance    metrics.py
      → the first node where each run leaves its tolerance                  (here)
      → table, JSON, HTML plot                                              report.py
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np

from opforge.compare.metrics import NodeError, Tolerance, node_error
from opforge.compare.runs import RUNS, Run, model_runs, native_run, program_run
from opforge.errors import OpforgeError

__all__ = ["compare", "compare_program", "Comparison", "NodeRow", "CompareError"]

DEFAULT_RUNS = ("eager", "lean", "aten", "cpu")


class CompareError(OpforgeError):
    """``opforge compare`` was asked for something it cannot do."""


@dataclass
class NodeRow:
    """One node result of the reference, and each run's error on it (None: not observed)."""

    index: int
    name: str
    item: int
    op: str
    source: str
    errors: dict[str, NodeError | None] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return self.name if self.item == 0 else f"{self.name}[{self.item}]"


@dataclass
class Comparison:
    reference: str
    runs: list[Run]
    rows: list[NodeRow]

    def first_divergence(self, run: str) -> NodeRow | None:
        """The first node (in graph order) where ``run`` leaves its tolerance, or None."""
        for row in self.rows:
            error = row.errors.get(run)
            if error is not None and not error.within:
                return row
        return None

    def as_dict(self) -> dict:
        return {
            "reference": self.reference,
            "runs": [{"name": r.name, "tolerance": r.tolerance.describe(), "note": r.note,
                      "observed": sum(1 for row in self.rows if row.errors.get(r.name)),
                      "first_divergence": _first(self.first_divergence(r.name), r.name)}
                     for r in self.runs],
            "nodes": [{"index": row.index, "node": row.label, "op": row.op, "source": row.source,
                       "runs": {r.name: _cell(row, r) for r in self.runs}}
                      for row in self.rows],
        }


def _first(row: NodeRow | None, run: str) -> dict | None:
    if row is None:
        return None
    return {"index": row.index, "node": row.label, "op": row.op, "source": row.source,
            **row.errors[run].as_dict()}


def _cell(row: NodeRow, run: Run) -> dict | None:
    error = row.errors.get(run.name)
    if error is None:
        return None
    key = (row.name, row.item)
    out = {**error.as_dict(), "where": run.where.get(key, "")}
    if key in run.integers:
        out["integer"] = run.integers[key]
    if key in run.clipped:
        count, size, ratio = run.clipped[key]
        out["clipped"] = {"values": count, "of": size, "ratio": ratio}
    return out


def compare(model: Any, inputs: Sequence[Any], *, against: Iterable[str] = DEFAULT_RUNS,
            rtol: float = 1e-3, atol: float = 1e-5, min_sqnr: float = 20.0,
            scheme: str = "8a8w", calibration: Sequence[Sequence[Any]] | None = None,
            kernels: Sequence[str] = (), strict: bool = False, on_step=None) -> Comparison:
    """Run ``model`` on ``inputs`` eagerly in float64 (the reference) and in each run of
    ``against`` (``eager``, ``lean``, ``aten``, ``cpu``, ``cpu-fused``, ``quantized``); align every node
    result by debug handle and measure each run against the reference.

    Float runs leave their tolerance where ``max|x - r| > atol + rtol * max|r|``; the
    quantized run (``scheme``, calibrated on ``calibration`` or the inputs) where its SQNR
    falls below ``min_sqnr`` dB. ``kernels`` (native libraries or ``module:function``
    registrars) are loaded into every program run, as ``opforge run --kernels`` does.

    >>> import torch
    >>> from opforge.compare import compare
    >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    >>> result = compare(model, (torch.randn(2, 4),), against=["lean"])
    >>> result.first_divergence("lean") is None
    True
    """
    import torch

    from opforge.compare.reference import capture_reference

    step = on_step or (lambda text: None)
    against = _check_runs(against, RUNS)
    arrays = [np.asarray(a.detach().numpy() if isinstance(a, torch.Tensor) else a) for a in inputs]
    step("capture and reference (eager float64)")
    ref = capture_reference(model, tuple(torch.as_tensor(a) for a in arrays), strict=strict)
    reference = ref.run(tuple(torch.as_tensor(a) for a in arrays), float64=True)
    runs = model_runs(ref, arrays, against, tolerance=Tolerance(rtol, atol),
                      quantized_tolerance=Tolerance(rtol, atol, min_sqnr), kernels=kernels,
                      model=model, scheme=scheme, calibration=calibration, on_step=step)
    nodes = [(name, op, source) for name, op, source in ref.nodes]
    return Comparison("eager float64", runs, _rows(nodes, reference, runs))


def compare_program(program: Any, inputs: Sequence[Any], *, against: Iterable[str] = ("lean", "aten"),
                    rtol: float = 1e-3, atol: float = 1e-5, kernels: Sequence[str] = (),
                    method: str = "forward") -> Comparison:
    """Compare runs of a program file (no model, so no eager reference): the first of
    ``against`` (``lean``, ``aten`` or ``native``) is the reference the others are measured
    against. The ``native`` run has the method's outputs only (no capture natively yet)."""
    from opforge.program import debug_info, load

    if not hasattr(program, "methods"):
        program = load(program)
    against = _check_runs(against, ("lean", "aten", "native"))
    info = debug_info(program)
    if info is None or method not in info.methods:
        raise CompareError(
            f"`opforge compare`: method {method!r} — the program has no debug table — valid: a "
            "program exported with its debug handles — fix: re-export it without "
            "--no-debug-handles, or compare the model (MODULE:FACTORY) instead")
    tolerance = Tolerance(rtol, atol)
    runs = [native_run(program, inputs, kernels=kernels, tolerance=tolerance, method=method)
            if name == "native" else
            program_run(program, inputs, name, mode=name, kernels=kernels, tolerance=tolerance,
                        method=method) for name in against]
    base, others = runs[0], runs[1:]
    nodes = [(n.name, n.op, n.source) for n in info.methods[method].nodes]
    return Comparison(f"{base.name} run", others, _rows(nodes, base.values, others))


def _check_runs(against: Iterable[str], valid: Sequence[str]) -> list[str]:
    runs = [a.strip() for a in against if a.strip()]
    unknown = [a for a in runs if a not in valid]
    if unknown or not runs:
        raise CompareError(
            f"`opforge compare --against`: {', '.join(unknown) or '(none)'} — valid: "
            f"{', '.join(valid)} — fix: pick from those, comma-separated")
    return list(dict.fromkeys(runs))


def _rows(nodes, reference: dict, runs: list[Run]) -> list[NodeRow]:
    rows = []
    for name, op, source in nodes:
        items = sorted(i for (n, i) in reference if n == name)
        for item in items:
            row = NodeRow(len(rows), name, item, op, source)
            for run in runs:
                value = run.values.get((name, item))
                row.errors[run.name] = None if value is None else node_error(
                    value, reference[(name, item)], run.tolerance)
            rows.append(row)
    return rows
