"""The IR the export passes work on: one method's FX graph plus what the graph alone
does not say (which placeholders are user inputs and which are constants, and the
results of passes such as the memory plan).

After ``torch.export`` the graph is an ``ExportedProgram``; the decomposition pass is the
last one that needs it. The passes after it rewrite the graph in ways the
``ExportedProgram`` verifier does not accept (out-variant calls, ``alloc`` nodes), so
they work on this plain container instead. The graph stays executable by torch at every
step: ``method.graph_module(*inputs_and_constants)`` still computes the model, which is
how the tests check each pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx

__all__ = ["ASSERTION_OPS", "InputKind", "MethodGraph", "alloc", "assertion_nodes", "is_alloc",
           "read_size", "is_size_read"]


class InputKind:
    """What a placeholder of the method's graph stands for."""

    USER = "user_input"
    PARAMETER = "parameter"
    BUFFER = "buffer"
    CONSTANT = "constant"  # a lifted tensor constant or a non-persistent buffer
    STATE = "state"  # a buffer the method updates: program state (initial value = constant)


def alloc(sizes: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Allocate the out tensor of one out-variant call.

    In the graph an ``alloc`` node is a planned tensor; in eager execution of the graph
    (tests) it returns fresh memory.
    """
    return torch.empty(sizes, dtype=dtype)


def is_alloc(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and node.target is alloc


def read_size(tensor: torch.Tensor) -> int:
    """A size read from a one-element integer tensor at run time (``int(n.item())`` used as
    a size: torch's ``_local_scalar_dense``). Emitted as a ``Move`` into an int that
    produces the size's symbol (``opforge/program/produced.py``); eagerly, the value."""
    return int(tensor.item())


def is_size_read(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and node.target is read_size


@dataclass
class MethodGraph:
    """One method of the program while it goes through the passes.

    ``exported`` is the ``ExportedProgram`` from capture (set until decomposition has run);
    ``graph_module`` its graph; ``input_kinds`` maps every placeholder name to an
    :class:`InputKind`; ``constants`` maps the names of non-user placeholders to their
    tensors; ``notes`` holds what passes report for later stages (e.g. the memory plan).
    """

    name: str
    graph_module: torch.fx.GraphModule
    input_kinds: dict[str, str]
    constants: dict[str, torch.Tensor]
    exported: Any | None = None  # torch.export.ExportedProgram
    preserved_ops: frozenset[str] = frozenset()
    notes: dict[str, Any] = field(default_factory=dict)

    @property
    def graph(self) -> torch.fx.Graph:
        return self.graph_module.graph

    def placeholders(self) -> list[torch.fx.Node]:
        return [n for n in self.graph.nodes if n.op == "placeholder"]

    def user_inputs(self) -> list[torch.fx.Node]:
        return [n for n in self.placeholders() if self.input_kinds[n.name] == InputKind.USER]

    def output_args(self) -> list[Any]:
        """The graph's outputs, flattened (nodes, or plain Python values)."""
        output = next(n for n in reversed(self.graph.nodes) if n.op == "output")
        flat, _ = torch.utils._pytree.tree_flatten(output.args[0])
        return flat

    def call_nodes(self) -> list[torch.fx.Node]:
        return [n for n in self.graph.nodes if n.op == "call_function"]


# Operators torch.export records as run-time checks: no result, no out variant.
_aten = torch.ops.aten
ASSERTION_OPS = frozenset(
    getattr(getattr(_aten, name), overload)
    for name, overload in (
        ("_assert_tensor_metadata", "default"),
        ("_assert_scalar", "default"),
        ("_assert_async", "default"),
        ("_assert_async", "msg"),
        ("sym_constrain_range_for_size", "default"),
        ("sym_constrain_range", "default"),
        ("_functional_assert_async", "msg"),
    )
    if hasattr(_aten, name) and hasattr(getattr(_aten, name), overload)
)


def assertion_nodes(method: MethodGraph) -> list:
    """Calls of run-time assertion operators (:data:`ASSERTION_OPS`), which
    ``passes/drop_assertions.py`` removes."""
    return [node for node in method.call_nodes() if node.target in ASSERTION_OPS]
