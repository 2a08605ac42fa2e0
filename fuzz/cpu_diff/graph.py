"""The random graph as data, and the Python it becomes.

A ``Graph`` is plain frozen data: graph inputs (shape, dtype, how the values are drawn,
a seed), nodes (a catalog op name, the value ids it reads, its attributes, a parameter
seed) and the value ids it returns. Value ids count the inputs first, then the nodes.

``source(graph)`` renders it as a self-contained Python module — a ``Graph`` nn.Module
whose forward is straight-line code and an ``inputs()`` function — and that source is what
every run executes, so the minimal reproduction printed for a finding is the very code
that disagreed. Parameters and buffers are drawn away from their defaults by ``spread``
from each module's own seed, so removing one node leaves the others' values unchanged.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field, replace

__all__ = ["Input", "Node", "Graph", "source", "compact", "HELPERS"]


@dataclass(frozen=True)
class Input:
    shape: tuple[int, ...]
    dtype: str  # "float32", "int64", "bool"
    kind: str  # "randn" (× scale), "pos" (positive), "int" (0..high-1), "bool"
    seed: int
    scale: float = 1.0
    high: int = 10


@dataclass(frozen=True)
class Node:
    op: str
    args: tuple[int, ...]
    attrs: tuple[tuple[str, object], ...]
    seed: int

    @property
    def attr(self) -> dict:
        return dict(self.attrs)

    def with_attrs(self, **changes) -> "Node":
        merged = dict(self.attrs)
        merged.update(changes)
        return replace(self, attrs=tuple(sorted(merged.items())))


@dataclass(frozen=True)
class Graph:
    inputs: tuple[Input, ...]
    nodes: tuple[Node, ...]
    outputs: tuple[int, ...]
    notes: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        n_in = len(self.inputs)
        for j, node in enumerate(self.nodes):
            assert all(0 <= a < n_in + j for a in node.args), (j, node)
        assert self.outputs and all(0 <= o < n_in + len(self.nodes) for o in self.outputs), self.outputs

    def name(self, vid: int) -> str:
        n_in = len(self.inputs)
        return f"x{vid}" if vid < n_in else f"v{vid - n_in}"


# The helpers every rendered graph starts with: how inputs are drawn and how parameters and
# buffers are spread away from their defaults (a default BatchNorm is the identity and hides
# a wrong broadcast; a zero bias hides a wrong bias layout).
HELPERS = '''\
import torch
import torch.nn as nn
import torch.nn.functional as F


def draw(shape, dtype, kind, seed, scale=1.0, high=10):
    g = torch.Generator().manual_seed(seed)
    if kind == "int":
        return torch.randint(0, high, shape, generator=g, dtype=getattr(torch, dtype))
    if kind == "bool":
        return torch.rand(shape, generator=g) < 0.5
    x = torch.randn(shape, generator=g) * scale
    return x.abs() + 0.25 if kind == "pos" else x


def spread(module, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in list(module.named_parameters()) + list(module.named_buffers()):
            if not t.is_floating_point():
                continue
            if name.endswith("running_var"):
                t.copy_(torch.rand(t.shape, generator=g) * 2 + 0.1)
            elif t.dim() >= 2:
                fan_in = max(1, t[0].numel())
                t.copy_(torch.randn(t.shape, generator=g) / fan_in ** 0.5)
            else:
                t.copy_(torch.randn(t.shape, generator=g))
    return module.eval()
'''


def source(graph: Graph, render) -> str:
    """The graph as a Python module (``render(node) -> (expression, module constructor)``)."""
    init, body = [], []
    for j, node in enumerate(graph.nodes):
        vid = len(graph.inputs) + j
        expr, ctor = render(node)
        args = [graph.name(a) for a in node.args]
        if ctor is not None:
            init.append(f"self.m{j} = spread({ctor}, {node.seed})")
        body.append(f"{graph.name(vid)} = {expr.format(*args, m=f'self.m{j}')}")
    outs = ", ".join(graph.name(o) for o in graph.outputs)
    params = ", ".join(["self"] + [graph.name(i) for i in range(len(graph.inputs))])
    draws = ",\n        ".join(
        f"draw({tuple(i.shape)}, {i.dtype!r}, {i.kind!r}, {i.seed}"
        + (f", scale={i.scale}" if i.scale != 1.0 else "")
        + (f", high={i.high}" if i.kind == "int" else "") + ")"
        for i in graph.inputs)
    init_text = "\n".join("        " + line for line in init) or "        pass"
    body_text = "\n".join("        " + line for line in body)
    return HELPERS + textwrap.dedent(f"""

class Graph(nn.Module):
    def __init__(self):
        super().__init__()
{init_text}

    def forward({params}):
{body_text}
        return ({outs},)


def inputs():
    return (
        {draws},
    )
""")


def compact(graph: Graph) -> Graph:
    """Drop nodes no output depends on and inputs nothing reads; renumber."""
    n_in = len(graph.inputs)
    live = set(graph.outputs)
    for j in range(len(graph.nodes) - 1, -1, -1):
        if n_in + j in live:
            live.update(graph.nodes[j].args)
    kept_inputs = [i for i in range(n_in) if i in live]
    kept_nodes = [j for j in range(len(graph.nodes)) if n_in + j in live]
    remap = {old: new for new, old in enumerate(kept_inputs)}
    for new, j in enumerate(kept_nodes):
        remap[n_in + j] = len(kept_inputs) + new
    nodes = tuple(replace(graph.nodes[j], args=tuple(remap[a] for a in graph.nodes[j].args))
                  for j in kept_nodes)
    outputs = tuple(dict.fromkeys(remap[o] for o in graph.outputs))
    return Graph(tuple(graph.inputs[i] for i in kept_inputs), nodes, outputs, graph.notes)
