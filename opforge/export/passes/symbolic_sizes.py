"""Symbolic sizes: size arithmetic in the graph → expressions; guards → program guards.

With ``dynamic_shapes`` torch.export leaves nodes that compute sizes at run time:
``aten.sym_size.int(x, 1)`` and ``operator.mul/add/floordiv/...`` on them, read by ``view``,
``expand``, ``full`` and the like, and ``_assert_scalar`` checks on ``SymBool`` nodes. This
pass records the method's symbols (``export/symbolic.py``: names, bounds; an unbounded
dimension is refused), replaces every use of a size node by a ``SymSize`` (its expression
over the symbols), turns each ``_assert_scalar`` on a size relation into a program guard,
and erases the size nodes. A read of a tensor's value that is a data-dependent size
(``item()`` as a size: an unbacked symbol with a bound) stays, as ``read_size``: it binds
its symbol at run time. A static method passes through unchanged (and gets an empty
symbol table).
"""

from __future__ import annotations

import torch
import torch.fx

from opforge.export.method_graph import MethodGraph, read_size
from opforge.export.pass_manager import ExportPass
from opforge.export.symbolic import SymbolTable, SymSize

__all__ = ["SymbolicSizes", "is_size_node"]

_ASSERT_SCALAR = getattr(torch.ops.aten, "_assert_scalar", None)
# reads of a tensor's one value as a Python int: data-dependent sizes when they are symbols
_SCALAR_READS = (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.item.default)


def is_size_node(node: torch.fx.Node) -> bool:
    """A call that computes a size or a size relation (its value is a SymInt/SymBool)."""
    return node.op == "call_function" and isinstance(
        node.meta.get("val"), (torch.SymInt, torch.SymBool)) and not isinstance(
        node.target, torch._ops.HigherOrderOperator)


class SymbolicSizes(ExportPass):
    """Fold size nodes into ``SymSize`` arguments; collect symbols and guards."""

    requires = frozenset({"core_aten_or_custom"})
    ensures = frozenset({"sizes_symbolic"})

    def run(self, method: MethodGraph) -> MethodGraph:
        users = {n.name: n.meta.get("val") for n in method.user_inputs()}
        table = SymbolTable(method.name, method.exported, users, method.notes.get("dim_names"),
                            grow=method.notes.get("grow", frozenset()))
        method.notes["symbols"] = table
        if table.unbounded:  # where each is made, for the refusal that names it
            _note_where_made(table, method)
        if not table and not any(is_size_node(n) for n in method.call_nodes()):
            return method  # static: nothing to fold (a data-dependent size is refused below)
        graph = method.graph
        asserts = [n for n in method.call_nodes() if _ASSERT_SCALAR is not None
                   and n.target == _ASSERT_SCALAR.default]
        for node in asserts:
            cond = node.args[0]
            value = cond.meta.get("val") if isinstance(cond, torch.fx.Node) else cond
            if isinstance(value, torch.SymBool):
                table.guards.append(table.guard_of(value))
            graph.erase_node(node)
        for node in reversed(list(method.call_nodes())):
            if not is_size_node(node):
                continue
            if node.target in _SCALAR_READS and _produces(table, node):
                node.target = read_size  # binds the symbol at run time: kept (a Move)
                node.args, node.kwargs = node.args[:1], {}
            if isinstance(node.meta["val"], torch.SymInt):
                expr = table.expr_of(node.meta["val"])
                marker = SymSize(expr, table.hint(expr))
                for user in list(node.users):
                    user.args = _replace(user.args, node, marker)
                    user.kwargs = _replace(user.kwargs, node, marker)
            if not node.users and node.target is not read_size:
                graph.erase_node(node)
        method.graph_module.recompile()
        return method


def _note_where_made(table: SymbolTable, method: MethodGraph) -> None:
    from opforge.export.diagnostics import describe_node

    for node in method.call_nodes():
        value = node.meta.get("val")
        sizes = value.shape if isinstance(value, torch.Tensor) else \
            [value] if isinstance(value, torch.SymInt) else []
        for size in sizes:
            if isinstance(size, torch.SymInt):
                for symbol in map(str, size.node.expr.free_symbols):
                    if symbol in table.unbounded:
                        table.made_at.setdefault(symbol, describe_node(node))


def _produces(table: SymbolTable, node: torch.fx.Node) -> bool:
    """Whether a scalar read's value is a data-dependent size the method's sizes use
    (``item()`` as a size): its unbacked symbol, with a bound (else it is refused)."""
    expr = node.meta["val"].node.expr
    if not expr.is_Symbol:
        return False
    name = str(expr)
    if name in table.unbounded:
        raise table._unbounded(name)
    return name in table.produced


def _replace(value, node: torch.fx.Node, marker: SymSize):
    if value is node:
        return marker
    if isinstance(value, tuple):
        return tuple(_replace(v, node, marker) for v in value)
    if isinstance(value, list):
        return [_replace(v, node, marker) for v in value]
    if isinstance(value, dict):
        return {k: _replace(v, node, marker) for k, v in value.items()}
    return value

