"""Debug handles: each call of the decomposed graph remembers the FX node it is.

The decomposed graph (core ATen) is the one ``opforge compare`` runs eagerly as its
reference, so its node names are the handles. This pass records, for every call, its
name, operator and model source line in ``method.notes["debug_nodes"]`` (graph order) and
tags the node (``meta["debug_handle"]`` = its name); the later passes carry the tag to the
out-variant call (``ToOutVariant``) and into delegate subgraphs (node metadata is copied
with the node), and the emitter turns it into the program's debug table
(``opforge/program/debug.py``).
"""

from __future__ import annotations

import operator

from opforge.export.diagnostics import node_location
from opforge.export.method_graph import MethodGraph
from opforge.export.out_variants import op_key
from opforge.export.pass_manager import ExportPass

__all__ = ["TagDebugHandles", "DEBUG_HANDLE", "debug_op_name"]

DEBUG_HANDLE = "debug_handle"
MAX_SOURCE = 512


def debug_op_name(target: object) -> str:
    try:
        return op_key(target)
    except Exception:  # noqa: BLE001 - not an operator overload (a Python callable)
        return getattr(target, "__name__", None) or str(target)


class TagDebugHandles(ExportPass):
    """Tag every call with its own name as its debug handle; list them in the notes."""

    requires = frozenset({"core_aten_or_custom"})
    ensures = frozenset({"debug_handles"})

    def run(self, method: MethodGraph) -> MethodGraph:
        nodes = {}
        for node in method.call_nodes():
            if node.target is operator.getitem:
                continue
            node.meta[DEBUG_HANDLE] = node.name
            nodes[node.name] = (debug_op_name(node.target), (node_location(node) or "")[:MAX_SOURCE])
        method.notes["debug_nodes"] = nodes
        return method
