"""Decompose to the core ATen opset, keeping custom ops and preserved ops opaque."""

from __future__ import annotations

from typing import Iterable

import torch

from opforge.errors import ExportError

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
        try:
            with quiet_torch_internals():
                exported = method.exported.run_decompositions(decomposition_table(self.preserve))
        except AssertionError as exc:  # torch's own invariant, e.g. a hand-exported HF cache module
            raise ExportError(
                f"`opforge.export.export()`: method {method.name!r} — torch's "
                f"run_decompositions() failed: AssertionError: {exc} — valid: an ExportedProgram "
                "torch can decompose — fix:\n  1. for a transformers decoder, export it with "
                "transformers.integrations.executorch.TorchExportableModuleForDecoderOnlyLM("
                "model, ...).export(input_ids=..., cache_position=..., dynamic_shapes=...) and "
                "pass the ExportedProgram it returns to opforge.export.export\n  2. or export "
                "the module with strict=True") from exc
        result = method_graph_from_exported(method.name, exported)
        result.preserved_ops = self.preserve
        result.notes = {**method.notes, **result.notes}
        prefix = result.notes.get("buffer_prefix", "")
        result.notes["buffer_names"] = {p: name.removeprefix(prefix)
                                        for p, name in result.notes["buffer_names"].items()}
        return result
