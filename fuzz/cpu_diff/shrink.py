"""Shrink a failing graph to a minimal one that still fails the same way.

Greedy delta debugging to a fixed point, each candidate kept only if it still fits
(``replay``: eager float64 runs it, values finite, the ops' own checks pass) and still
fails with the same signature (disagreement on the same runtime, or the same exception
type at the same stage):

1. keep one output;
2. drop a node: its readers read one of its own inputs of the same shape and dtype
   instead, or a new graph input of its shape and dtype (drawn like its values: positive
   if they were, the same integer range);
3. shrink graph-input shapes (halve a dimension, or make it 1);
4. simplify attributes (``OpSpec.simpler``: bias=False, stride=1, affine=False, ...).
"""

from __future__ import annotations

import time
from dataclasses import replace

import torch

from fuzz.cpu_diff.generate import replay
from fuzz.cpu_diff.graph import Graph, Input, compact
from fuzz.cpu_diff.ops import OPS
from fuzz.cpu_diff.oracle import TARGETS, Outcome, check

__all__ = ["shrink", "targets_of"]


def targets_of(outcome: Outcome) -> tuple[str, ...]:
    """The runtimes worth running to see this failure again."""
    for t in TARGETS:
        if t in outcome.where:
            return (t,)
    return ("cpu-lean",) if "cpu" in outcome.where else TARGETS


def _like(value: torch.Tensor, seed: int) -> Input:
    shape = tuple(value.shape)
    if value.dtype == torch.bool:
        return Input(shape, "bool", "bool", seed)
    if not value.is_floating_point():
        return Input(shape, str(value.dtype)[6:], "int", seed, high=max(1, int(value.max()) + 1))
    peak = float(value.abs().max())
    scale = min((0.1, 1.0, 3.0), key=lambda s: abs(s - peak / 2))
    return Input(shape, "float32", "pos" if bool((value > 0).all()) else "randn", seed, scale)


def _rewire(graph: Graph, vid: int, to: int | None, new: Input | None) -> Graph:
    """Readers (and outputs) of ``vid`` read ``to``, or a new graph input ``new``."""
    n_in = len(graph.inputs)
    shift = 1 if new is not None else 0
    target = n_in if new is not None else to

    def m(v):
        if v == vid:
            return target if new is None else n_in
        return v + shift if v >= n_in else v
    nodes = tuple(replace(n, args=tuple(m(a) for a in n.args)) for n in graph.nodes)
    outputs = tuple(m(o) for o in graph.outputs)
    inputs = graph.inputs + ((new,) if new is not None else ())
    return compact(Graph(inputs, nodes, tuple(dict.fromkeys(outputs))))


def _candidates(graph: Graph, values):
    n_in = len(graph.inputs)
    if len(graph.outputs) > 1:
        for o in graph.outputs:
            yield "one output", compact(replace(graph, outputs=(o,)))
    for j in range(len(graph.nodes) - 1, -1, -1):
        vid = n_in + j
        v = values[vid]
        for a in dict.fromkeys(graph.nodes[j].args):
            if values[a].shape == v.shape and values[a].dtype == v.dtype:
                yield f"bypass node {j}", _rewire(graph, vid, a, None)
        yield f"cut node {j}", _rewire(graph, vid, None, _like(v, 1000 + j))
    for i, inp in enumerate(graph.inputs):
        for d, size in enumerate(inp.shape):
            for smaller in dict.fromkeys((1, (size + 1) // 2, size - 1)):
                if 1 <= smaller < size:
                    shape = inp.shape[:d] + (smaller,) + inp.shape[d + 1:]
                    inputs = graph.inputs[:i] + (replace(inp, shape=shape),) + graph.inputs[i + 1:]
                    yield f"input {i} dim {d} → {smaller}", replace(graph, inputs=inputs)
    for j, node in enumerate(graph.nodes):
        attrs = node.attr
        for key, simple in OPS[node.op].simpler.items():
            if key in attrs and attrs[key] != simple:
                nodes = graph.nodes[:j] + (node.with_attrs(**{key: simple}),) + graph.nodes[j + 1:]
                yield f"node {j} {key}={simple}", replace(graph, nodes=nodes)


def shrink(graph: Graph, outcome: Outcome, *, max_checks: int = 400, max_seconds: float = 300,
           log=None) -> tuple[Graph, Outcome, int]:
    """``(smallest graph, its outcome, checks run)``."""
    targets = targets_of(outcome)
    signature = outcome.signature
    best, best_outcome = graph, outcome
    checks, start = 0, time.monotonic()
    seen: set = set()
    progress = True
    while progress:
        progress = False
        values = replay(best)
        if values is None:
            break
        for what, candidate in _candidates(best, values):
            if checks >= max_checks or time.monotonic() - start > max_seconds:
                return best, best_outcome, checks
            key = (candidate.inputs, candidate.nodes, candidate.outputs)
            if key in seen or _size(candidate) > _size(best) or key == (best.inputs, best.nodes, best.outputs):
                continue
            seen.add(key)
            if replay(candidate) is None:
                continue
            checks += 1
            result = check(candidate, targets)
            if result.signature == signature:
                best, best_outcome, progress = candidate, result, True
                if log:
                    log(f"  shrink: {what}: {len(best.nodes)} nodes, {len(best.inputs)} inputs")
                break
    return best, best_outcome, checks


def _size(graph: Graph) -> tuple:
    numel = sum(max(1, _prod(i.shape)) for i in graph.inputs)
    return (len(graph.nodes), len(graph.outputs), numel)


def _prod(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
