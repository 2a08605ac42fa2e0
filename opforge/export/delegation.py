"""Delegation at export: hand partitions of each method's graph to backends.

    functional, assertion-free graph
      → for each backend, in the order given: partition (ExportGraph) → for each partition:
        cut it out as a Subgraph (torch.fx ``fuse_as_graphmodule``) → preprocess → blob
      → the partition's nodes become one call of a ``LoweredDelegate`` (inputs → outputs)
      → ToOutVariant turns that call into ``DelegateOut(inputs..., outs...)`` on planned allocs
      → emit: one ``DelegateCall`` per call, each blob a 64-byte-aligned segment

Constants a partition reads are baked into its blob by ``preprocess``, or stored by name
(``subgraph.named_data``: once per program, whichever delegates read them, see
``opforge/backends/named_data.py``); a constant no other node reads leaves the program's
constant segment. Program state is a run-time input; a
cache write inside the partition may go into the state in place (``delegated_state.py``). The graph stays executable by torch at
every step (a ``LoweredDelegate`` runs its subgraph eagerly), which is how tests compare.

What each backend did and why it left each node out is recorded in ``method.notes
["delegation"]`` and, at emit, in the program's user metadata (``opforge.delegation``, JSON),
so ``opforge inspect`` and :func:`delegation_report` read it from the file.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import torch
import torch.fx
import heapq
from torch.fx.passes.utils.fuser_utils import fuse_as_graphmodule

from opforge.backends.named_data import NamedDataStore
from opforge.export import freed_memory  # noqa: E402 (a module of this package)
from opforge.backends.report import METADATA_KEY, delegation_report
from opforge.errors import BackendError, InternalError
from opforge.export.method_graph import InputKind, MethodGraph
from opforge.export.delegated_state import in_place_writes, with_program_state
from opforge.export.lowered import DelegateOut, LoweredDelegate, is_delegate
from opforge.export.pass_manager import ExportPass

__all__ = [
    "LoweredDelegate", "DelegateOut", "Delegate", "resolve_backends", "is_delegate",
    "delegation_report", "METADATA_KEY", "IO_SPEC_INPUTS", "IO_SPEC_OUTPUTS",
]

# Stored beside the backend's own compile specs: how many of a DelegateCall's args are
# inputs and outputs (the runtime and verifier check calls against them).
IO_SPEC_INPUTS = "opforge.inputs"
IO_SPEC_OUTPUTS = "opforge.outputs"


@dataclass
class _Request:
    backend: Any  # opforge.backends.Backend
    specs: dict[str, Any]
    given: dict[str, Any] = field(default_factory=dict)


def resolve_backends(backends: Iterable[Any] | None,
                     compile_specs: Mapping[str, Any] | None = None) -> list[_Request]:
    """``backends``: names, ``(name, {spec: value})`` pairs or Backend instances.

    ``compile_specs`` (a dict of spec → value) applies to every backend that is given
    without its own. Unknown backends, unusable ones (``unavailable()``) and unknown or
    ill-typed compile specs are ``BackendError``s, raised before anything is captured.
    """
    from opforge.backends import Backend, get_backend, resolve_specs

    requests = []
    seen: set[str] = set()
    for item in backends or ():
        given: Mapping[str, Any] | None = None
        if isinstance(item, tuple) and len(item) == 2:
            item, given = item
        backend = item if isinstance(item, Backend) else get_backend(item) if isinstance(item, str) \
            else None
        if backend is None:
            raise BackendError(f"`opforge.export.export(backends=...)`: {item!r} — valid: a backend "
                               "name, (name, compile_specs) or a Backend — fix: e.g. backends=['cpu']")
        if backend.name in seen:
            raise BackendError(f"`opforge.export.export(backends=...)`: backend {backend.name!r} "
                               "given twice — fix: give each backend once")
        seen.add(backend.name)
        problem = backend.unavailable()
        if problem:
            raise BackendError(f"backend {backend.name!r} cannot be used here: {problem}")
        given = dict(compile_specs or {}) if given is None else dict(given)
        requests.append(_Request(backend, resolve_specs(backend.name, backend.compile_spec_defs,
                                                        given), given))
    return requests


class Delegate(ExportPass):
    """Partition and lower each method for the requested backends, in order."""

    requires = frozenset({"functional", "assertion_free"})
    ensures = frozenset()

    def __init__(self, requests: Sequence[_Request]) -> None:
        self.requests = list(requests)

    def run(self, method: MethodGraph) -> MethodGraph:
        from opforge.backends import encode_specs
        from opforge.backends.base import PreprocessRefused, Rejection
        from opforge.backends.partition import ExportGraph, Subgraph, op_name
        from opforge.export.diagnostics import node_location

        report = method.notes.setdefault("delegation", {"delegates": [], "rejected": []})
        for request in self.requests:
            backend = request.backend
            symbols = method.notes.get("symbols") or None
            if symbols is not None and not backend.dynamic_shapes:
                # Backends compile for fixed sizes, and probing a symbolic size (int(s))
                # would specialise torch's symbol to the example: nothing is offered to them.
                report["rejected"].extend(
                    Rejection(backend.name, n.name, op_name(n), "shape",
                              f"dynamic shapes: a later feature of the {backend.name} backend",
                              node_location(n) or "").as_dict()
                    for n in method.call_nodes() if n.target is not operator.getitem)
                continue
            kinds = with_program_state(method)  # state another method updates: live too
            graph = ExportGraph(method.name, method.graph_module, kinds, method.constants,
                                symbols, method.notes.get("named_data_pool"))
            result = backend.partition(graph, request.specs)
            report["rejected"].extend(r.as_dict() for r in result.rejected)
            for nodes in result.partitions:
                nodes = [n for n in nodes if n.graph is method.graph]
                if not nodes:
                    continue
                problem = _unlowerable(method, nodes)
                if problem is not None:
                    report["rejected"].extend(
                        Rejection(backend.name, n.name, op_name(n), "partition", problem,
                                  node_location(n) or "").as_dict()
                        for n in nodes if n.target is not operator.getitem)
                    continue
                sub, inputs, outputs = fuse_as_graphmodule(
                    method.graph_module, nodes, f"delegate_{backend.name}", always_return_tuple=True)
                runtime_inputs, constants = [], {}
                for placeholder, outer in zip(
                        [n for n in sub.graph.nodes if n.op == "placeholder"], inputs):
                    placeholder.meta.update({k: v for k, v in outer.meta.items() if k == "val"})
                    if outer.op == "placeholder" and kinds.get(outer.name) not in (
                            None, InputKind.USER, InputKind.STATE):
                        constants[placeholder.name] = method.constants[outer.name]
                    else:  # program state too: a live value, read at run time
                        runtime_inputs.append((placeholder, outer))
                _reorder_placeholders(sub, [p for p, _ in runtime_inputs])
                state = _state_inputs(method, kinds, nodes, runtime_inputs, list(outputs),
                                      backend.writes_state_in_place)
                subgraph = Subgraph(backend.name, method.name, sub,
                                    [p.name for p, _ in runtime_inputs], constants, state,
                                    symbols=symbols,
                                    named_data=NamedDataStore(method.notes.get("named_data_pool")))
                try:
                    blob = backend.preprocess(subgraph, request.specs)
                except PreprocessRefused as refused:
                    # the group stays on the kernels, every node saying why
                    report["rejected"].extend(
                        Rejection(backend.name, n.name, op_name(n), refused.kind,
                                  f"left on the kernels with its whole delegate group: "
                                  f"{refused.reason}", node_location(n) or "").as_dict()
                        for n in nodes if n.target is not operator.getitem)
                    continue
                if sum(c.nbytes for c in constants.values()
                       if isinstance(c, torch.Tensor)) >= freed_memory.LARGE_BYTES:
                    freed_memory.release()  # the lowering's dropped copies (freed_memory.py)
                if not isinstance(blob, (bytes, bytearray, memoryview)):
                    raise InternalError(f"backend {backend.name!r}: preprocess returned "
                                        f"{type(blob).__name__}, not bytes")
                ops = [op_name(n) for n in subgraph.call_nodes()]
                specs = encode_specs(request.specs, backend.compile_spec_defs) + (
                    (IO_SPEC_INPUTS, b"i:%d" % len(runtime_inputs)),
                    (IO_SPEC_OUTPUTS, b"i:%d" % len(outputs)))
                lowered = LoweredDelegate(
                    backend.name, bytes(blob), specs, sub, list(constants.values()),
                    len(runtime_inputs), len(outputs), ops,
                    [n.name for n in nodes if n.target is not operator.getitem])
                lowered.output_handles = [_handle_of(o) for o in outputs]
                lowered.state_writes = {
                    position: k for k, (placeholder, _) in enumerate(runtime_inputs)
                    if (position := state.get(placeholder.name)) is not None}
                lowered.op_nodes = subgraph.op_nodes
                lowered.named_data = subgraph.named_data.entries  # stored once by emit
                lowered.named_layouts = subgraph.named_data.layouts  # checked by emit
                self._replace(method, nodes, [o for _, o in runtime_inputs], list(outputs), lowered)
                lowered.report = {
                    "backend": backend.name, "nodes": len(lowered.nodes), "ops": ops,
                    "blob_bytes": len(lowered.blob), "inputs": lowered.num_inputs,
                    "outputs": lowered.num_outputs}  # emit adds "delegate": its index
                report["delegates"].append(lowered.report)
        _drop_unused_constants(method)
        method.graph.lint()
        method.graph_module.recompile()
        return method

    @staticmethod
    def _replace(method: MethodGraph, nodes: list[torch.fx.Node], inputs: list[torch.fx.Node],
                 outputs: list[torch.fx.Node], lowered: LoweredDelegate) -> None:
        graph = method.graph
        with graph.inserting_after(nodes[-1]):
            call = graph.create_node("call_function", lowered, tuple(inputs), {},
                                     name=f"delegate_{lowered.backend}")
            call.meta["val"] = tuple(o.meta.get("val") for o in outputs)
        anchor = call
        for i, out in enumerate(outputs):
            with graph.inserting_after(anchor):
                anchor = item = graph.create_node("call_function", operator.getitem, (call, i), {},
                                         name=f"{call.name}_{i}")
            item.meta["val"] = out.meta.get("val")
            out.replace_all_uses_with(item)
        for node in reversed(nodes):
            if node.users:
                raise InternalError(f"delegation: {node.name} still has users {list(node.users)}")
            graph.erase_node(node)
        # The call sits after the partition's last node; a node outside the partition that
        # reads one of its outputs may come earlier in graph order (partitions are convex,
        # not contiguous): re-sort topologically.
        _sort_in_place(graph)


def _state_inputs(method: MethodGraph, kinds: dict[str, str], nodes: list[torch.fx.Node],
                  runtime_inputs: list, outputs: list[torch.fx.Node],
                  in_place: bool) -> dict[str, int | None]:
    """``Subgraph.state``: each state input (by its subgraph name) → the output position of
    its new value when the delegate may write it in place (``delegated_state.py``), else
    None."""
    writes = in_place_writes(method, nodes) if in_place else {}
    state: dict[str, int | None] = {}
    for placeholder, outer in runtime_inputs:
        if kinds.get(outer.name) == InputKind.STATE:
            writer = writes.get(outer)
            state[placeholder.name] = outputs.index(writer) if writer in outputs else None
    return state


def _handle_of(node: torch.fx.Node) -> tuple[str, int] | None:
    """The debug handle (and result index) of a delegate output node."""
    if node.target is operator.getitem and isinstance(node.args[0], torch.fx.Node):
        handle = node.args[0].meta.get("debug_handle")
        return (handle, int(node.args[1])) if handle else None
    handle = node.meta.get("debug_handle")
    return (handle, 0) if handle else None


def _unlowerable(method: MethodGraph, nodes: list[torch.fx.Node]) -> str | None:
    """Why a proposed partition cannot become a delegate call (None when it can): a
    DelegateCall passes tensors only, and must produce something."""
    inside = set(nodes)
    for node in nodes:
        for arg in node.all_input_nodes:
            if arg not in inside and not isinstance(arg.meta.get("val"), torch.Tensor):
                return (f"the group reads {arg.name}, a {type(arg.meta.get('val')).__name__} "
                        "(a delegate call passes tensors only)")
    if not any(user not in inside for node in nodes for user in node.users):
        return "the group's results are never used"
    return None


def _sort_in_place(graph: torch.fx.Graph) -> None:
    """Stable topological order (original order wherever dependencies allow), moving the
    node objects themselves: partitions still to lower keep pointing at them."""
    nodes = list(graph.nodes)
    position = {node: i for i, node in enumerate(nodes)}
    pending = {node: len(set(node.all_input_nodes)) for node in nodes}
    ready = [(position[n], n) for n in nodes if pending[n] == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        _, node = heapq.heappop(ready)
        order.append(node)
        for user in node.users:
            pending[user] -= 1
            if pending[user] == 0:
                heapq.heappush(ready, (position[user], user))
    if len(order) != len(nodes):
        raise InternalError("delegation: the graph has a cycle after lowering a partition")
    if order == nodes:
        return
    previous = order[0]
    if previous is not nodes[0]:
        nodes[0].prepend(previous)
    for node in order[1:]:
        previous.append(node)
        previous = node


def _reorder_placeholders(sub: torch.fx.GraphModule, first: list[torch.fx.Node]) -> None:
    """Make ``first`` the leading placeholders (run-time inputs), constants after them."""
    rest = [n for n in sub.graph.nodes if n.op == "placeholder" and n not in first]
    anchor = next(n for n in sub.graph.nodes if n.op != "placeholder")
    for node in [*first, *rest]:
        anchor.prepend(node)
    sub.graph.lint()
    sub.recompile()


def _drop_unused_constants(method: MethodGraph) -> None:
    for node in list(method.graph.nodes):
        if node.op == "placeholder" and not node.users and method.input_kinds.get(node.name) not in (
                None, InputKind.USER):
            method.graph.erase_node(node)
            method.constants.pop(node.name, None)
            method.input_kinds.pop(node.name, None)
