"""What a lowered partition is in the export graph (see ``delegation.py``).

``LoweredDelegate`` is the functional call of a partition after ``preprocess``;
``DelegateOut`` its out form after ``ToOutVariant``. Both run the partition's subgraph
eagerly, so the graph stays executable by torch.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.fx

__all__ = ["LoweredDelegate", "DelegateOut", "is_delegate"]


class LoweredDelegate:
    """A partition after ``preprocess``: callable on its inputs (runs the subgraph eagerly,
    so the graph stays executable by torch), and what emission needs."""

    def __init__(self, backend: str, blob: bytes, specs: tuple[tuple[str, bytes], ...],
                 graph_module: torch.fx.GraphModule, constants: Sequence[torch.Tensor],
                 num_inputs: int, num_outputs: int, ops: list[str], nodes: list[str]) -> None:
        self.backend = backend
        self.blob = blob
        self.specs = specs
        self.graph_module = graph_module
        self.constants = tuple(constants)
        self.num_inputs = num_inputs
        self.num_outputs = num_outputs
        self.ops = ops
        self.nodes = nodes
        # debug handles (set by the Delegate pass): each output's (node, result index), and
        # per op of the blob the nodes it computes when the backend says (Subgraph.op_nodes)
        self.output_handles: list[tuple[str, int] | None] = [None] * num_outputs
        self.op_nodes: list[list[str]] | None = None
        # output position → input position: that output is the new value of that state
        # input, written in place by the backend (UpdateStateInPlace passes the state as it)
        self.state_writes: dict[int, int] = {}
        self.__name__ = f"delegate_{backend}"

    def __call__(self, *inputs: Any) -> tuple:
        result = self.graph_module(*inputs, *self.constants)
        return tuple(result) if isinstance(result, (tuple, list)) else (result,)

    def __repr__(self) -> str:
        return f"<LoweredDelegate {self.backend} {len(self.nodes)} nodes {len(self.blob)} B>"


class DelegateOut:
    """The out form of a delegate call: ``DelegateOut(lowered)(*inputs, *outs)`` writes outs."""

    def __init__(self, lowered: LoweredDelegate) -> None:
        self.lowered = lowered
        self.__name__ = f"delegate_{lowered.backend}_out"

    def __call__(self, *args: Any) -> None:
        n = self.lowered.num_inputs
        for out, result in zip(args[n:], self.lowered(*args[:n])):
            out.copy_(result)

    def __repr__(self) -> str:
        return f"<DelegateOut {self.lowered!r}>"


def is_delegate(node: torch.fx.Node) -> bool:
    """A call of a lowered delegate (functional or out form)."""
    return node.op == "call_function" and isinstance(node.target, (LoweredDelegate, DelegateOut))
