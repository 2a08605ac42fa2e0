"""Decompose to the core ATen opset, keeping custom ops and preserved ops opaque.

# Design: other libraries' functional custom ops
#
# A custom op stays one instruction when the program can call it: it has an out variant
# (an op manifest's, or one opforge adds for a library op it ships kernels for:
# ``torch_bridge/library_ops.py``, e.g. ``transformers::grouped_mm_fallback``). A functional
# op with no out variant would stop export at ``ToOutVariant``; when torch knows what the op
# computes in ATen terms, that definition is used instead:
#
#   1. a decomposition registered in torch's table (``torch._decomp.register_decomposition``)
#   2. the op's ``CompositeImplicitAutograd`` kernel (written with torch ops)
#
# and the op is decomposed here like an ATen op. An op whose only implementation is a
# Python (or C++) kernel for a device is not traced: its body may call anything
# (``.tolist()``, NumPy, a loop over data) and tracing it would freeze one input's control
# flow into the program without a word. It stays opaque and ``ToOutVariant`` refuses it,
# naming the fixes (a manifest entry with a kernel, or a decomposition as above). The
# program never carries a Python callback: it must run on the native runtime too.
"""

from __future__ import annotations

from typing import Iterable

import torch
import torch._decomp
import torch.fx

from opforge.errors import ExportError

from opforge.export.capture import method_graph_from_exported, quiet_torch_internals
from opforge.export.method_graph import MethodGraph
from opforge.export.out_variants import find_out_variant, op_key
from opforge.export.pass_manager import ExportPass

__all__ = ["DecomposeToCoreAten", "decomposition_table", "library_decompositions"]


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


def library_decompositions(exported: torch.export.ExportedProgram) -> dict:
    """What torch knows each non-ATen op of ``exported`` computes, for the ops the program
    could not call otherwise (no out variant): ``{OpOverload: decomposition}``."""
    table: dict = {}
    for module in exported.graph_module.modules():
        if not isinstance(module, torch.fx.GraphModule):
            continue
        for node in module.graph.nodes:
            op = node.target
            if node.op != "call_function" or not isinstance(op, torch._ops.OpOverload) or \
                    op.namespace in ("aten", "prims") or op in table or find_out_variant(op):
                continue
            decomposition = torch._decomp.decomposition_table.get(op)
            if decomposition is None and torch._C._dispatch_has_kernel_for_dispatch_key(
                    op.name(), "CompositeImplicitAutograd"):
                # torch's own wrapper of the CIA kernel (op.decompose itself would recurse
                # once run_decompositions registers it as the op's Python kernel)
                from torch._export.utils import _get_decomp_for_cia

                decomposition = _get_decomp_for_cia(op)
            if decomposition is not None:
                table[op] = decomposition
    return table


class DecomposeToCoreAten(ExportPass):
    """``ExportedProgram.run_decompositions`` with :func:`decomposition_table` and the
    :func:`library_decompositions` of the graph's custom ops (noted as
    ``decomposed_library_ops``).

    Also functionalizes the graph (in-place ops become functional ones plus mutation
    outputs, which the next pass reports).
    """

    requires = frozenset({"captured"})
    ensures = frozenset({"core_aten_or_custom"})

    def __init__(self, preserve: Iterable[str] = ()) -> None:
        self.preserve = frozenset(preserve)

    def run(self, method: MethodGraph) -> MethodGraph:
        library = library_decompositions(method.exported)
        try:
            with quiet_torch_internals():
                exported = method.exported.run_decompositions(
                    {**decomposition_table(self.preserve), **library})
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
        result.notes = {**method.notes, **result.notes,
                        "decomposed_library_ops": sorted(op_key(op) for op in library)}
        prefix = result.notes.get("buffer_prefix", "")
        result.notes["buffer_names"] = {p: name.removeprefix(prefix)
                                        for p, name in result.notes["buffer_names"].items()}
        return result
