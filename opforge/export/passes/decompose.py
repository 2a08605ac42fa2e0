"""Decompose to the core ATen opset, keeping custom ops and preserved ops opaque."""

from __future__ import annotations

from typing import Iterable

import torch

from opforge.export.capture import method_graph_from_exported, quiet_torch_internals
from opforge.export.method_graph import MethodGraph
from opforge.export.out_variants import op_key
from opforge.export.pass_manager import ExportPass

__all__ = ["DecomposeToCoreAten", "decomposition_table"]


def decomposition_table(preserve: Iterable[str] = ()) -> dict:
    """torch's default (core ATen) decomposition table, minus every op outside the
    ``aten`` namespace (custom and backend ops are never decomposed) and minus the ops
    named in ``preserve`` (``"aten::linear.default"`` keys)."""
    preserve = frozenset(preserve)
    table = torch.export.default_decompositions()
    for op in list(table.keys()):
        if op.namespace != "aten" or op_key(op) in preserve:
            del table[op]
    return table


class DecomposeToCoreAten(ExportPass):
    """``ExportedProgram.run_decompositions`` with :func:`decomposition_table`.

    Also functionalizes the graph (in-place ops become functional ones plus mutation
    outputs, which the next pass reports).
    """

    requires = frozenset({"captured"})
    ensures = frozenset({"core_aten_or_custom"})

    def __init__(self, preserve: Iterable[str] = ()) -> None:
        self.preserve = frozenset(preserve)

    def run(self, method: MethodGraph) -> MethodGraph:
        with quiet_torch_internals():
            exported = method.exported.run_decompositions(decomposition_table(self.preserve))
        result = method_graph_from_exported(method.name, exported)
        result.preserved_ops = self.preserve
        return result
