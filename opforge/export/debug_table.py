"""The debug table of one method as the emitter builds it (``opforge/program/debug.py``).

The node table is every call the ``TagDebugHandles`` pass saw, in graph order; a node's
handle is its position. The emitter reports each instruction it writes: a kernel call
captures its out arguments under the node it was made from, a delegate call its outputs
under the nodes whose results leave the partition, and the delegate's ops (when the
backend said which nodes each computes) are listed under its index.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.fx

from opforge.program.debug import DebugCapture, DebugNode, MethodDebug

__all__ = ["DebugTable"]


class DebugTable:
    def __init__(self, nodes: dict[str, tuple[str, str]]) -> None:
        self.nodes = [DebugNode(name, op, source) for name, (op, source) in nodes.items()]
        self.handles = {n.name: i for i, n in enumerate(self.nodes)}
        self.captures: list[DebugCapture] = []
        self.delegate_ops: dict[int, tuple[tuple[int, ...], ...]] = {}

    def kernel_call(self, instruction: int, node: torch.fx.Node,
                    value_index: Callable[[torch.fx.Node], int]) -> None:
        handle = self.handles.get(node.meta.get("debug_handle"))
        if handle is None:
            return
        outs = [node.kwargs.get(a.name) for a in node.target._schema.arguments if a.is_out]
        flat = [o for out in outs for o in (out if isinstance(out, (list, tuple)) else [out])]
        for item, out in enumerate(flat):
            if isinstance(out, torch.fx.Node):
                self.captures.append(DebugCapture(instruction, value_index(out), handle, item))

    def delegate(self, instruction: int, index: int, lowered: Any, outs: list[int]) -> None:
        for value, handle in zip(outs, lowered.output_handles):
            if handle is not None and handle[0] in self.handles:
                self.captures.append(DebugCapture(instruction, value, self.handles[handle[0]],
                                                  handle[1]))
        if lowered.op_nodes is not None and index not in self.delegate_ops:
            self.delegate_ops[index] = tuple(
                tuple(self.handles[n] for n in names if n in self.handles)
                for names in lowered.op_nodes)

    def finish(self) -> MethodDebug:
        return MethodDebug(tuple(self.nodes), tuple(self.captures), dict(self.delegate_ops))
