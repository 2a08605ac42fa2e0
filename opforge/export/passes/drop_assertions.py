"""Drop the run-time assertions torch.export leaves in a graph.

Non-strict export records some checks as operator calls with no result: ``x.float()``
becomes ``_assert_tensor_metadata(x, dtype=...)`` before the ``_to_copy``, and guards on
sizes become ``_assert_scalar`` / ``sym_constrain_range_for_size``. A program's shapes and
dtypes are fixed at export and every call checks its inputs against them, so these checks
hold by construction; they have no out variant and nothing reads them, so they go.
"""

from __future__ import annotations

from opforge.export.method_graph import MethodGraph, assertion_nodes
from opforge.export.pass_manager import ExportPass

__all__ = ["DropAssertions"]


class DropAssertions(ExportPass):
    """Erase every assertion call. None of torch's assertions returns a value; one that
    something reads anyway is left, and the ``assertion_free`` contract names it."""

    requires = frozenset({"functional"})
    ensures = frozenset({"assertion_free"})

    def run(self, method: MethodGraph) -> MethodGraph:
        for node in assertion_nodes(method):
            if not node.users:
                method.graph.erase_node(node)
        method.graph_module.recompile()
        return method
