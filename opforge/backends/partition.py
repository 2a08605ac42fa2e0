"""The ahead-of-time side of delegation (needs torch): what ``Backend.partition`` and
``Backend.preprocess`` are given, and the helpers most backends partition with.

``ExportGraph`` is one method's functional core-ATen graph (after assertions are dropped,
before out variants): call_function nodes on ``torch.ops.aten`` / custom ops, placeholders
for user inputs and constants. ``Subgraph`` is one partition cut out of it as its own
``GraphModule`` whose placeholders are the delegate's run-time inputs (in call order) and
its constants (baked into the blob by ``preprocess``).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch
import torch.fx
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from opforge.backends.base import PartitionResult, Rejection
from opforge.export.lowered import is_delegate
from opforge.export.diagnostics import node_location
from opforge.export.method_graph import InputKind

__all__ = ["ExportGraph", "Subgraph", "partition_by_support", "op_name", "Check"]

# check(node) -> None when the backend takes the node, else (kind, reason)
Check = Callable[[torch.fx.Node], "tuple[str, str] | None"]


def op_name(node: torch.fx.Node) -> str:
    """``aten::convolution.default`` for an OpOverload target; ``str(target)`` otherwise."""
    target = node.target
    schema = getattr(target, "_schema", None)
    if schema is None:
        return getattr(target, "__name__", str(target))
    return f"{schema.name}.{schema.overload_name or 'default'}"


@dataclass
class ExportGraph:
    """One method's graph as a backend sees it when partitioning."""

    method: str
    graph_module: torch.fx.GraphModule
    input_kinds: Mapping[str, str]
    constants: Mapping[str, torch.Tensor]
    # a dynamic method's symbol table (``opforge.export.symbolic.SymbolTable``), given only
    # to a backend that takes dynamic shapes (``Backend.dynamic_shapes``); else None
    symbols: Any = None
    # the export's pool of named data (``named_data.NamedDataPool``): a backend whose
    # partitioning makes constants (the cpu backend's trial lowering) shares them through
    # it, so that they are made once for the check and the delegates; None: not shared
    named_data_pool: Any = None

    def call_nodes(self) -> list[torch.fx.Node]:
        return [n for n in self.graph_module.graph.nodes
                if n.op == "call_function" and n.target is not operator.getitem
                and not is_delegate(n)]  # taken by an earlier backend

    def is_constant(self, node: Any) -> bool:
        """A placeholder whose value is fixed at export (program state is not: it is a
        live value, passed to a delegate at run time like a user input)."""
        return (isinstance(node, torch.fx.Node) and node.op == "placeholder"
                and self.input_kinds.get(node.name, InputKind.USER) not in (
                    InputKind.USER, InputKind.STATE))

    def constant(self, node: torch.fx.Node) -> torch.Tensor | None:
        return self.constants.get(node.name) if self.is_constant(node) else None


@dataclass
class Subgraph:
    """One partition as its own graph: ``graph_module``'s placeholders are ``inputs`` (the
    delegate's run-time inputs, in order) and the keys of ``constants``; its output is the
    tuple of the delegate's outputs. Every node keeps its ``meta["val"]`` (a fake tensor)."""

    backend: str
    method: str
    graph_module: torch.fx.GraphModule
    inputs: list[str]
    constants: dict[str, torch.Tensor] = field(default_factory=dict)
    # the inputs that are program state: name → the position of the output that is its new
    # value when the delegate writes it in place (the program then passes the state itself
    # as that output), None when the delegate only reads it
    state: dict[str, int | None] = field(default_factory=dict)
    # set by ``preprocess`` when the backend can say it: for each op of the blob, in the
    # order it runs, the names of the subgraph nodes it computes (the debug handles)
    op_nodes: list[list[str]] | None = None
    symbols: Any = None  # as ``ExportGraph.symbols``
    # where ``preprocess`` may put large constants by name instead of in its blob (a
    # ``named_data.NamedDataStore``; None: everything goes in the blob)
    named_data: Any = None

    def placeholders(self) -> list[torch.fx.Node]:
        return [n for n in self.graph_module.graph.nodes if n.op == "placeholder"]

    def output_nodes(self) -> list[Any]:
        output = next(n for n in reversed(self.graph_module.graph.nodes) if n.op == "output")
        result = output.args[0]
        return list(result) if isinstance(result, (tuple, list)) else [result]

    def call_nodes(self) -> list[torch.fx.Node]:
        return [n for n in self.graph_module.graph.nodes
                if n.op == "call_function" and n.target is not operator.getitem]


class _Support(OperatorSupportBase):
    def __init__(self, verdicts: dict[torch.fx.Node, tuple[str, str] | None]) -> None:
        self.verdicts = verdicts

    def is_node_supported(self, submodules, node: torch.fx.Node) -> bool:
        if node.op != "call_function":
            return False
        if node.target is operator.getitem:
            source = node.args[0]
            return isinstance(source, torch.fx.Node) and self.verdicts.get(source, ("", "")) is None
        return self.verdicts.get(node, ("", "")) is None


def partition_by_support(backend: str, graph: ExportGraph, check: Check, *,
                         min_nodes: int = 1) -> PartitionResult:
    """Group the nodes ``check`` accepts into maximal partitions that keep the graph acyclic
    (torch.fx's ``CapabilityBasedPartitioner``); every refused node gets a Rejection.

    A partition of fewer than ``min_nodes`` compute nodes is dropped and its nodes are
    rejected with kind ``"partition"`` (a backend whose call costs more than one op saves).
    """
    verdicts: dict[torch.fx.Node, tuple[str, str] | None] = {}
    rejected: list[Rejection] = []
    for node in graph.call_nodes():
        try:
            verdict = check(node)
        except Exception as e:  # a backend's check must not take export down: say why
            verdict = ("op", f"the backend's support check failed: {type(e).__name__}: {e}")
        verdicts[node] = verdict
        if verdict is not None:
            rejected.append(Rejection(backend, node.name, op_name(node), verdict[0], verdict[1],
                                      node_location(node) or ""))
    partitioner = CapabilityBasedPartitioner(graph.graph_module, _Support(verdicts),
                                             allows_single_node_partition=True)
    order = {node: i for i, node in enumerate(graph.graph_module.graph.nodes)}
    partitions = []
    for proposed in partitioner.propose_partitions():
        nodes = sorted(proposed.nodes, key=order.__getitem__)
        compute = [n for n in nodes if n.target is not operator.getitem]
        if len(compute) < min_nodes:
            for node in compute:
                rejected.append(Rejection(
                    backend, node.name, op_name(node), "partition",
                    f"a partition of {len(compute)} op(s), below the backend's minimum of {min_nodes}",
                    node_location(node) or ""))
            continue
        partitions.append(nodes)
    partitions.sort(key=lambda nodes: order[nodes[0]])
    by_name = {node.name: i for node, i in order.items()}
    rejected.sort(key=lambda r: by_name.get(r.node, len(by_name)))  # graph order
    return PartitionResult(partitions, rejected)
