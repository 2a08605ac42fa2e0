"""The quantization report: per node the scheme applied (or why it stayed float), and the
accuracy of the converted model against the float model.

SQNR (signal-to-quantization-noise ratio) is ``10 log10(sum(ref²) / sum((ref - q)²))`` over
all outputs of all calibration samples, in dB: every 6 dB is about one bit of agreement.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from opforge.quantize.annotate import Decision

__all__ = ["QuantReport", "Accuracy", "accuracy", "build_report", "sqnr_db"]


def _flat(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _flat(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _flat(v)]
    return []


def sqnr_db(reference: Sequence[Any], actual: Sequence[Any]) -> float:
    """SQNR of ``actual`` against ``reference`` (matching nests of tensors), in dB."""
    signal = noise = 0.0
    for ref, got in zip(reference, actual):
        for r, g in zip(_flat(ref), _flat(got)):
            r, g = r.detach().double(), g.detach().double()
            signal += float((r * r).sum())
            noise += float(((r - g) ** 2).sum())
    if noise == 0.0:
        return math.inf
    if signal == 0.0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)


@dataclass(frozen=True)
class Accuracy:
    sqnr_db: float
    max_abs_error: float
    samples: int


def accuracy(reference: Sequence[Any], actual: Sequence[Any]) -> Accuracy:
    err = 0.0
    for ref, got in zip(reference, actual):
        for r, g in zip(_flat(ref), _flat(got)):
            if r.numel():
                err = max(err, float((r.detach().double() - g.detach().double()).abs().max()))
    return Accuracy(sqnr_db(reference, actual), err, len(reference))


@dataclass
class QuantReport:
    """What :func:`opforge.quantize.quantize` did; ``print_table()`` shows it."""

    scheme: str
    decisions: list[Decision]
    accuracy: Accuracy
    calibration_samples: int
    notes: list[str] = field(default_factory=list)
    qdq_ops: dict[str, int] = field(default_factory=dict)
    # the same measure on samples the calibration did not see (QuantizedModel.evaluate)
    held_out: Accuracy | None = None

    @property
    def sqnr_db(self) -> float:
        return self.accuracy.sqnr_db

    @property
    def max_abs_error(self) -> float:
        return self.accuracy.max_abs_error

    def decision(self, node: str) -> Decision:
        return next(d for d in self.decisions if d.node == node)

    def to_dict(self) -> dict[str, Any]:
        return {
            "scheme": self.scheme,
            "sqnr_db": self.sqnr_db,
            "max_abs_error": self.max_abs_error,
            "calibration_samples": self.calibration_samples,
            "nodes": [d.__dict__ for d in self.decisions],
            "notes": list(self.notes),
            "qdq_ops": dict(self.qdq_ops),
            "held_out": None if self.held_out is None else {
                "sqnr_db": self.held_out.sqnr_db, "max_abs_error": self.held_out.max_abs_error,
                "samples": self.held_out.samples},
        }

    def print_table(self, console=None) -> None:
        from rich.table import Table

        from opforge.cli.tables import table_console

        console = console or table_console()
        table = Table(title=f"quantization ({self.scheme})")
        for column in ("node", "op", "scheme", "detail"):
            table.add_column(column)
        for d in self.decisions:
            style = "dim" if d.scheme == "float" else None
            table.add_row(d.node, d.op, d.scheme, d.detail, style=style)
        console.print(table)
        acc = Table(title="accuracy against the float model")
        for column in ("inputs", "samples", "SQNR (dB)", "max abs error"):
            acc.add_column(column, justify="right")
        acc.add_row("calibration", str(self.accuracy.samples), f"{self.sqnr_db:.2f}",
                    f"{self.max_abs_error:.6g}")
        if self.held_out is not None:
            acc.add_row("held out", str(self.held_out.samples), f"{self.held_out.sqnr_db:.2f}",
                        f"{self.held_out.max_abs_error:.6g}")
        console.print(acc)
        for note in self.notes:
            console.print(f"note: {note}")


def build_report(quantizer, converted: torch.fx.GraphModule, acc: Accuracy, *,
                 calibrated: int, scheme: str) -> QuantReport:
    decisions = list(quantizer.decisions.values())
    notes = [f"{d.node} ({d.op}) stays float: {d.detail}" for d in decisions
             if d.detail.startswith("custom op")]
    counts: dict[str, int] = {}
    for node in converted.graph.nodes:
        target = node.target
        if node.op == "call_function" and hasattr(target, "_schema"):
            ns = target._schema.name.split("::")[0]
            if ns in ("quantized_decomposed", "torchao"):
                key = target._schema.name
                counts[key] = counts.get(key, 0) + 1
    return QuantReport(scheme, decisions, acc, calibrated, notes, counts)
