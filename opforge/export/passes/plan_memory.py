"""Memory planning, the last pass: every activation gets an offset in an arena.

Planned tensors are the ``alloc`` nodes and the user inputs, except the tensors whose sizes
read a growing symbol (``export(grow=...)``): those live outside the arenas and the runtime
grows them. A tensor with symbolic sizes is planned at its upper bound (``SymbolTable.upper_sizes``): every call's actual sizes fit
its slot, and lifetimes are reused as for static tensors. Graph inputs are planned
like activations: the runtime copies (or lets the caller write) each input into its slot
before the first instruction, so an input's slot becomes free after its last use.
Outputs are read from their slots after the last instruction, so an output lives to the
end. Constants are not planned: they live in constant segments.

Time steps: instruction ``i`` (the ``i``-th out-variant call) runs at step ``i + 1``;
inputs are written at step 0; outputs are read at step ``len(instructions) + 1``. A
tensor lives from its first to its last step; an input and the output of the same
instruction are both live at that step, so kernels never see aliased arguments.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.fx

from opforge.export.memory_planning import DEFAULT_ALIGNMENT, TensorLifetime, plan_arenas
from opforge.export.method_graph import InputKind, MethodGraph, is_alloc
from opforge.export.pass_manager import ExportPass

__all__ = ["PlanMemory", "tensor_lifetimes"]


def _nbytes(method: MethodGraph, node: torch.fx.Node) -> int:
    """Bytes of the tensor at its upper bound (its worst-case slot) for symbolic sizes."""
    fake = node.meta["val"]
    table = method.notes.get("symbols")
    if table and any(not isinstance(s, int) for s in fake.shape):
        return math.prod(table.upper_sizes(fake)) * fake.element_size()
    return int(fake.numel()) * fake.element_size()


def _node_args(node: torch.fx.Node) -> list[torch.fx.Node]:
    return list(node.all_input_nodes)


def tensor_lifetimes(method: MethodGraph) -> list[TensorLifetime]:
    """The lifetime of every planned tensor of ``method`` (see the module docstring)."""
    table = method.notes.get("symbols")
    planned = [
        n for n in method.graph.nodes
        if (is_alloc(n) or (n.op == "placeholder" and method.input_kinds[n.name] == InputKind.USER))
        and not (table and table.grows(n.meta.get("val")))  # grown by the runtime instead
    ]
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for node in planned:
        if node.op == "placeholder":
            first[node.name] = last[node.name] = 0
    calls = [n for n in method.call_nodes() if not is_alloc(n)]
    for step, call in enumerate(calls, start=1):
        for arg in _node_args(call):
            first.setdefault(arg.name, step)
            last[arg.name] = step
    end = len(calls) + 1
    for value in method.output_args():
        if isinstance(value, torch.fx.Node):
            last[value.name] = end
            first.setdefault(value.name, end)
    lifetimes = []
    for node in planned:
        if not isinstance(node.meta.get("val"), torch.Tensor):
            continue  # a non-tensor user input (an int): a scalar value, not memory
        start = first.get(node.name, 0)
        lifetimes.append(TensorLifetime(node.name, _nbytes(method, node), start, max(start, last.get(node.name, start))))
    return lifetimes


class PlanMemory(ExportPass):
    """Greedy-by-size packing of all planned tensors; see ``memory_planning.py``.

    ``mem_id_policy(tensor_lifetime, node) -> int`` picks each tensor's arena (default 0).
    """

    requires = frozenset({"all_out_variants", "constants_lifted"})
    ensures = frozenset({"memory_planned"})

    def __init__(
        self,
        alignment: int = DEFAULT_ALIGNMENT,
        mem_id_policy: Callable[[TensorLifetime, torch.fx.Node], int] | None = None,
    ) -> None:
        self.alignment = alignment
        self.mem_id_policy = mem_id_policy

    def run(self, method: MethodGraph) -> MethodGraph:
        nodes = {n.name: n for n in method.graph.nodes}
        policy = self.mem_id_policy
        mem_id_of = (lambda t: policy(t, nodes[t.name])) if policy else (lambda t: 0)
        plan = plan_arenas(tensor_lifetimes(method), alignment=self.alignment, mem_id_of=mem_id_of)
        method.notes["memory_plan"] = plan
        return method
