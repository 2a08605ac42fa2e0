"""Program state in delegates: which state a partition may update in place.

A delegate reads program state (a KV cache) as a run-time input, never as a constant baked
into its blob: the state changes from call to call. A partition may also hold the write
that makes a state's new value (``index_put(cache, [positions], k)``, what ``index_copy_``
decomposes to; ``slice_scatter`` / ``select_scatter`` for ``cache[a:b].copy_(k)``); then a
backend that ``writes_state_in_place`` writes the positions into the state itself, and
``UpdateStateInPlace`` passes the state as that delegate output (no copy of the cache).

Safe, as for a kernel's in-place write (``passes/update_state_in_place.py``): the write's
``self`` is the state and its result is the state's new value; the state is no other
argument of it; and every node that reads the state's old value — directly or through a
view of it, which may alias the state — is inside the partition and comes before the
write (the backend runs the partition in graph order). A reader outside the partition
could be scheduled after the delegate call: such a state stays read-only in the delegate,
and its new value is copied back after the call as for any other update.
"""

from __future__ import annotations

import operator

import torch
import torch.fx

from opforge.export.method_graph import InputKind, MethodGraph

__all__ = ["STATE_WRITES", "in_place_writes", "with_program_state"]

_aten = torch.ops.aten
# functional writes whose result is ``self`` with some positions replaced
STATE_WRITES = frozenset({
    _aten.index_put.default, _aten.index_copy.default, _aten.slice_scatter.default,
    _aten.select_scatter.default,
})


def with_program_state(method: MethodGraph) -> dict[str, str]:
    """``method.input_kinds`` with every buffer that is program state (notes
    ``program_state``: what any method of the program updates) as ``STATE``, though this
    method only reads it: a delegate takes it at run time, the live copy another method
    updates."""
    kinds = dict(method.input_kinds)
    live = method.notes.get("program_state", frozenset())
    for placeholder, name in method.notes.get("buffer_names", {}).items():
        if name in live and kinds.get(placeholder) == InputKind.BUFFER:
            kinds[placeholder] = InputKind.STATE
    return kinds


def in_place_writes(method: MethodGraph, nodes: list[torch.fx.Node]) -> dict[torch.fx.Node, torch.fx.Node]:
    """State placeholder → the node of ``nodes`` that may write its new value in place."""
    inside = set(nodes)
    order = {node: i for i, node in enumerate(method.graph.nodes)}
    outputs = method.output_args()
    found = {}
    for position, name in method.notes.get("state_outputs", {}).items():
        writer = outputs[position]
        if not isinstance(writer, torch.fx.Node) or writer not in inside \
                or writer.target not in STATE_WRITES or not writer.args:
            continue
        state = writer.args[0]
        if not isinstance(state, torch.fx.Node) or state.name != name \
                or method.input_kinds.get(name) != InputKind.STATE:
            continue
        if any(a is state for a in _flat([*writer.args[1:], *writer.kwargs.values()])):
            continue  # the state is also an index or the written source
        if all(r in inside and order[r] < order[writer] for r in _old_value_readers(state, writer)):
            found[state] = writer
    return found


def _flat(values) -> list:
    out = []
    for v in values:
        out.extend(_flat(v) if isinstance(v, (list, tuple)) else [v])
    return out


def _old_value_readers(state: torch.fx.Node, writer: torch.fx.Node) -> set[torch.fx.Node]:
    """Every node that reads ``state`` before ``writer`` changes it: its users and, through
    ops whose result may alias their input (views, getitems of views), theirs."""
    readers: set[torch.fx.Node] = set()
    pending = [u for u in state.users if u is not writer]
    while pending:
        node = pending.pop()
        if node in readers:
            continue
        readers.add(node)
        if _may_alias_input(node):
            pending.extend(node.users)
    return readers


def _may_alias_input(node: torch.fx.Node) -> bool:
    if node.target is operator.getitem:
        return True
    schema = getattr(node.target, "_schema", None)
    return schema is None or any(r.alias_info is not None for r in schema.returns)
