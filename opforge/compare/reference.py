"""The reference: the exported graph run node by node in eager PyTorch.

The model is captured once with ``torch.export``; that ``ExportedProgram`` is what every
program of a comparison is exported from (``runs.py``), and decomposed here exactly as
export decomposes it (``DecomposeToCoreAten``), so the reference's node names are the
programs' debug handles. ``torch.fx.Interpreter`` runs the decomposed graph and keeps each
call's result by node name: in float64 for the reference (floating inputs and constants
promoted; a node whose kernel has no float64 runs in float32 and its result is promoted),
and in the model's own dtypes for the ``eager`` run.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.fx
from torch.utils._pytree import tree_map

from opforge.export.capture import capture, method_specs, quiet_torch_internals
from opforge.export.method_graph import InputKind, MethodGraph
from opforge.export.passes import DecomposeToCoreAten, TagDebugHandles

__all__ = ["ReferenceGraph", "capture_reference"]


@dataclass
class ReferenceGraph:
    """The captured model: its ``ExportedProgram`` (what the programs are exported from)
    and the decomposed method graph the reference runs."""

    exported: Any                 # torch.export.ExportedProgram
    method: MethodGraph           # decomposed, debug handles tagged
    nodes: list[tuple[str, str, str]]  # (name, op, source) of every call, graph order

    def run(self, inputs: tuple, *, float64: bool) -> dict[tuple[str, int], np.ndarray]:
        """Each call's results, ``{(node name, result index): array}``."""
        args = []
        user = iter(inputs)
        for node in self.method.placeholders():
            if self.method.input_kinds[node.name] == InputKind.USER:
                args.append(torch.as_tensor(next(user)))
            else:
                args.append(self.method.constants[node.name])
        if float64:
            args = [_promote(a) for a in args]
        recorder = _Recorder(self.method.graph_module, float64)
        with torch.no_grad():
            recorder.run(*args)
        return recorder.results


def capture_reference(model: torch.nn.Module, inputs: tuple, *, strict: bool = False) -> ReferenceGraph:
    """Capture ``model`` on ``inputs`` with ``torch.export`` and decompose it as export does."""
    spec = method_specs(model, tuple(inputs), None, None)[0]
    captured = capture(spec, strict=strict)
    exported = captured.exported
    with quiet_torch_internals():
        method = DecomposeToCoreAten().run(captured)
    method = TagDebugHandles().run(method)
    nodes = [(name, op, source) for name, (op, source) in method.notes["debug_nodes"].items()]
    return ReferenceGraph(exported, method, nodes)


def _promote(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dtype != torch.float64:
        return value.to(torch.float64)
    return value


def _demote(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.dtype == torch.float64:
        return value.to(torch.float32)
    return value


class _Recorder(torch.fx.Interpreter):
    def __init__(self, module: torch.fx.GraphModule, float64: bool) -> None:
        super().__init__(module)
        self.float64 = float64
        self.results: dict[tuple[str, int], np.ndarray] = {}

    def call_function(self, target, args, kwargs):
        try:
            return super().call_function(target, args, kwargs)
        except (RuntimeError, NotImplementedError, TypeError):
            if not self.float64:
                raise
            # no float64 kernel: run it in float32, promote the result
            result = super().call_function(target, tree_map(_demote, args), tree_map(_demote, kwargs))
            return tree_map(_promote, result)

    def run_node(self, n: torch.fx.Node) -> Any:
        result = super().run_node(n)
        if n.op == "call_function" and n.target is not operator.getitem:
            items = result if isinstance(result, (tuple, list)) else (result,)
            for i, item in enumerate(items):
                if isinstance(item, torch.Tensor):
                    self.results[(n.name, i)] = item.detach().cpu().numpy().copy() \
                        if item.dtype != torch.bfloat16 else item.float().numpy()
        return result
