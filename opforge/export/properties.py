"""The named properties that export passes require and ensure.

Each property is a function ``MethodGraph -> list[str]`` returning its violations (empty
when the property holds), so that the pass manager can say exactly what a pass broke.

| property | holds when |
| --- | --- |
| ``captured`` | the method still carries its ``ExportedProgram`` (nothing decomposed yet) |
| ``core_aten_or_custom`` | every call is a core ATen op, a preserved op, an op of another namespace (custom ops stay opaque), ``getitem``, or a higher-order op (rejected by ``functional``) |
| ``sizes_symbolic`` | no call computes a size (``sym_size``, ``SymInt`` arithmetic): sizes are ``SymSize`` expressions; the method has a symbol table |
| ``functional`` | no call writes to an argument, no input or buffer is mutated, no higher-order ops |
| ``assertion_free`` | no call of a run-time assertion op (``_assert_tensor_metadata``, ``_assert_scalar``, …) is left |
| ``all_out_variants`` | every call is ``alloc`` or an out-variant overload whose out arguments are ``alloc`` nodes (or, for a state written in place, the state placeholder); no ``getitem`` |
| ``constants_lifted`` | every non-user placeholder has a contiguous constant tensor and a segment key; no two constants are equal |
| ``debug_handles`` | every call (but ``getitem``) carries ``meta["debug_handle"]``, its node name in the decomposed graph |
| ``memory_planned`` | every user input and ``alloc`` has storage in an arena, inside the arena's size (except growing tensors, which the runtime allocates) |
"""

from __future__ import annotations

import operator
from typing import Callable

import torch

from opforge.export.lowered import DelegateOut, is_delegate
from opforge.export.method_graph import InputKind, MethodGraph, assertion_nodes, is_alloc, is_size_read
from opforge.export.out_variants import is_mutating_schema, is_out_schema, op_key

__all__ = ["PROPERTIES", "check_property"]


def _captured(method: MethodGraph) -> list[str]:
    return [] if method.exported is not None else ["the method has no ExportedProgram"]


def _core_aten_or_custom(method: MethodGraph) -> list[str]:
    bad = []
    for node in method.call_nodes():
        target = node.target
        if target is operator.getitem or isinstance(target, torch._ops.HigherOrderOperator) \
                or is_delegate(node) or _is_size(node):
            continue
        if not isinstance(target, torch._ops.OpOverload):
            bad.append(f"node {node.name}: target {target!r} is not an operator overload")
        elif target.namespace == "aten" and torch.Tag.core not in target.tags:
            if op_key(target) not in method.preserved_ops and target in _decomposable():
                bad.append(f"node {node.name}: {op_key(target)} is neither core ATen nor preserved")
    return bad


def _is_size(node) -> bool:
    return isinstance(node.meta.get("val"), (torch.SymInt, torch.SymBool))


def _sizes_symbolic(method: MethodGraph) -> list[str]:
    bad = [f"node {node.name}: computes a size ({node.target})"
           for node in method.call_nodes() if _is_size(node) and not is_size_read(node)]
    return bad + ([] if "symbols" in method.notes else ["no symbol table"])


def _decomposable() -> frozenset:
    # Ops torch can decompose; a non-core op torch has no decomposition for is left as is.
    global _DECOMPOSABLE
    if _DECOMPOSABLE is None:
        _DECOMPOSABLE = frozenset(torch.export.default_decompositions().keys())
    return _DECOMPOSABLE


_DECOMPOSABLE: frozenset | None = None


def _functional(method: MethodGraph) -> list[str]:
    bad = []
    for node in method.call_nodes():
        if isinstance(node.target, torch._ops.HigherOrderOperator):
            bad.append(f"node {node.name}: higher-order op {node.target.name()}")
        elif isinstance(node.target, torch._ops.OpOverload) and is_mutating_schema(node.target._schema):
            bad.append(f"node {node.name}: {op_key(node.target)} mutates an argument")
    return bad


def _all_out_variants(method: MethodGraph) -> list[str]:
    bad = []
    for node in method.call_nodes():
        if is_alloc(node) or is_size_read(node):  # a size read is a Move, not a call
            continue
        if isinstance(node.target, DelegateOut):
            outs = node.args[node.target.lowered.num_inputs:]
            if not all(isinstance(v, torch.fx.Node) and (is_alloc(v) or _state(method, v))
                       for v in outs):
                bad.append(f"node {node.name}: a delegate output is not an alloc node")
            continue
        if not isinstance(node.target, torch._ops.OpOverload) or not is_out_schema(node.target._schema):
            bad.append(f"node {node.name}: {node.target} is not an out variant")
            continue
        for arg in node.target._schema.arguments:
            if not arg.is_out:
                continue
            value = node.kwargs.get(arg.name)
            values = value if isinstance(value, (list, tuple)) else [value]
            if not values or not all(isinstance(v, torch.fx.Node) and (is_alloc(v) or _state(method, v))
                                     for v in values):
                bad.append(f"node {node.name}: out argument {arg.name} is not an alloc node")
    return bad


def _state(method: MethodGraph, node: torch.fx.Node) -> bool:
    """A state placeholder: the out of a write in place (passes/update_state_in_place.py),
    by a kernel or by a delegate (export/delegated_state.py)."""
    return node.op == "placeholder" and method.input_kinds.get(node.name) == InputKind.STATE


def _constants_lifted(method: MethodGraph) -> list[str]:
    bad = []
    keys = method.notes.get("constant_keys", {})
    seen: dict[str, str] = {}
    for node in method.graph.nodes:
        if node.op == "get_attr":
            bad.append(f"node {node.name}: get_attr left in the graph")
        if node.op != "placeholder" or method.input_kinds[node.name] == InputKind.USER:
            continue
        tensor = method.constants.get(node.name)
        if tensor is None:
            bad.append(f"placeholder {node.name}: no constant tensor")
        elif not tensor.is_contiguous():
            bad.append(f"placeholder {node.name}: constant is not contiguous")
        key = keys.get(node.name)
        if key is None:
            bad.append(f"placeholder {node.name}: no segment key")
        elif key in seen:
            bad.append(f"placeholders {seen[key]} and {node.name}: equal constants not deduplicated")
        else:
            seen[key] = node.name
    return bad


def _memory_planned(method: MethodGraph) -> list[str]:
    plan = method.notes.get("memory_plan")
    if plan is None:
        return ["no memory plan"]
    bad = []
    for node in method.graph.nodes:
        planned = is_alloc(node) or (node.op == "placeholder" and method.input_kinds[node.name] == InputKind.USER)
        if not planned or not isinstance(node.meta.get("val"), torch.Tensor):
            continue
        table = method.notes.get("symbols")
        if table and table.grows(node.meta["val"]):
            continue  # a growing tensor: allocated and grown by the runtime
        slot = plan.allocations.get(node.name)
        if slot is None:
            bad.append(f"node {node.name}: no storage")
        elif slot.offset + slot.nbytes > plan.arena_sizes[slot.mem_id]:
            bad.append(f"node {node.name}: storage beyond arena {slot.mem_id}")
    return bad


def _assertion_free(method: MethodGraph) -> list[str]:
    return [f"node {node.name}: assertion {op_key(node.target)} is still in the graph"
            for node in assertion_nodes(method)]


def _debug_handles(method: MethodGraph) -> list[str]:
    return [f"{node.name} has no debug handle" for node in method.call_nodes()
            if node.target is not operator.getitem and "debug_handle" not in node.meta]


PROPERTIES: dict[str, Callable[[MethodGraph], list[str]]] = {
    "captured": _captured,
    "core_aten_or_custom": _core_aten_or_custom,
    "sizes_symbolic": _sizes_symbolic,
    "functional": _functional,
    "assertion_free": _assertion_free,
    "all_out_variants": _all_out_variants,
    "constants_lifted": _constants_lifted,
    "memory_planned": _memory_planned,
    "debug_handles": _debug_handles,
}


def check_property(name: str, method: MethodGraph) -> list[str]:
    """The violations of property ``name`` on ``method`` (empty when it holds)."""
    try:
        check = PROPERTIES[name]
    except KeyError:
        raise KeyError(f"unknown export property {name!r}; known: {', '.join(sorted(PROPERTIES))}") from None
    return check(method)
