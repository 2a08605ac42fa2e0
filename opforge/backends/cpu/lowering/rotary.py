"""Rotary position embeddings as one engine op (``rope``).

Llama-style models (and transformers' ``rotate_half``) write the rotation as

    x1, x2 = x[..., :h], x[..., h:]            h = d / 2
    y = x * cos + cat([-x2, x1], -1) * sin     either operand order of each product

which torch keeps as two slices, a neg, a cat (two copies), two muls and an add: seven
nodes, three temporaries and five passes over ``x`` for each of q and k of every layer.
The group is one op: ``y_j = x_j * cos_j + r_j * sin_j`` with ``r_j = -x_{j+h}`` for
``j < h`` and ``x_{j-h}`` after, ``cos`` and ``sin`` broadcast to ``x`` (their missing or
size-1 dims read with stride 0), computed in float32 in torch's order (two products, then
the sum), so the result is torch's to the last bit where the compiler does not contract.
A match needs each inner node read only inside the group.
"""

from __future__ import annotations

import sys

import torch
import torch.fx

from opforge.backends.cpu.lowering.core import Lowering, _val, aten
from opforge.backends.cpu.lowering.normalization import _only_user

__all__ = ["Rope", "find_rope"]

INT_MAX = sys.maxsize


class Rope:
    """One rotation: ``x``, ``cos``, ``sin`` (nodes), every node of the group in graph
    order (``last``, the add, computes the result)."""

    kind = "rope"

    def __init__(self, x, cos, sin, nodes: list) -> None:
        self.x, self.cos, self.sin, self.nodes = x, cos, sin, nodes
        self.last = nodes[-1]

    def lower(self, L: Lowering):
        x = L.contiguous(L.materialize(L.env[self.x.name]))
        dims = L.spec(x).dims
        fake = _val(self.x)
        ins = [x] + [_broadcast(L, L.materialize(L.env[n.name]), _val(n), fake, dims)
                     for n in (self.cos, self.sin)]
        out = L.new_tensor(torch.float32, dims)
        L.op("rope", ins, [out], name="rope")
        return ("t", out)


def _broadcast(L: Lowering, tid: int, fake, x_fake, dims) -> int:
    """``tid`` (cos or sin) as a view with ``x``'s dims: missing leading dims and size-1
    dims that ``x`` has larger read with stride 0; the last dim dense."""
    if L.spec(tid).strides[-1] != 1:
        tid = L.contiguous(tid)
    spec = L.spec(tid)
    lead = len(dims) - len(spec.dims)
    strides = []
    for k in range(len(dims)):
        if k < lead:
            strides.append(0)
            continue
        size = fake.shape[k - lead]
        broadcast = isinstance(size, int) and size == 1 and not (
            isinstance(x_fake.shape[k], int) and x_fake.shape[k] == 1)
        strides.append(0 if broadcast else spec.strides[k - lead])
    return L.alias(tid, dims, tuple(strides))


def find_rope(sub, taken: dict) -> dict[str, Rope]:
    """Every rotation of the subgraph whose nodes no other group has ``taken``, keyed by
    the name of each of its nodes."""
    found: dict[str, Rope] = {}
    order = {n: i for i, n in enumerate(sub.graph_module.graph.nodes)}
    for node in sub.graph_module.graph.nodes:
        match = _rope_match(node, order)
        if match is not None and not any(n.name in taken or n.name in found for n in match.nodes):
            for n in match.nodes:
                found[n.name] = match
    return found


def _product(node, user):
    """(a, b) of ``mul.Tensor(a, b)`` read only by ``user``, else None."""
    if _only_user(node, user) and node.target is aten.mul.Tensor and len(node.args) == 2 \
            and not node.kwargs:
        return node.args
    return None


def _slice(node, user, x, last: int, start: int, end) -> bool:
    """``node`` is ``x[..., start:end]`` (on the last dim, step 1) read only by ``user``."""
    if not (_only_user(node, user) and node.target is aten.slice.Tensor and node.args[0] is x):
        return False
    args = list(node.args) + [0, None, None, 1][len(node.args) - 1:]
    dim, lo, hi, step = args[1:5]
    return (dim in (-1, last) and lo == start and step == 1
            and (hi == end or (end is None and hi in (None, INT_MAX))))


def _rotated_half(cat, user, x) -> bool:
    """``cat`` is ``cat([-x[..., h:], x[..., :h]], -1)`` read only by ``user``."""
    if not (_only_user(cat, user) and cat.target is aten.cat.default):
        return False
    fake = _val(x)
    last = fake.dim() - 1
    d = fake.shape[-1]
    if not isinstance(d, int) or d % 2 or (len(cat.args) > 1 and cat.args[1] not in (-1, last)):
        return False
    parts = cat.args[0]
    if len(parts) != 2:
        return False
    neg, x1 = parts
    if not (_only_user(neg, cat) and neg.target is aten.neg.default):
        return False
    x2 = neg.args[0]
    half = d // 2
    return _slice(x2, neg, x, last, half, None) or _slice(x2, neg, x, last, half, d) \
        if _slice(x1, cat, x, last, 0, half) else False


def _rope_match(add, order: dict) -> Rope | None:
    if add.op != "call_function" or add.target is not aten.add.Tensor or len(add.args) != 2 \
            or add.kwargs:
        return None
    for first, second in (add.args, add.args[::-1]):
        direct, rotated = _product(first, add), _product(second, add)
        if direct is None or rotated is None:
            continue
        for x, cos in (direct, direct[::-1]):
            for cat, sin in (rotated, rotated[::-1]):
                if _fits(x, cos, sin, add) and _rotated_half(cat, second, x):
                    neg, x1 = cat.args[0]
                    nodes = sorted([x1, neg.args[0], neg, cat, first, second, add],
                                   key=order.__getitem__)
                    return Rope(x, cos, sin, nodes)
    return None


def _fits(x, cos, sin, add) -> bool:
    """x, cos, sin float32 tensors; cos and sin broadcast to x, the result x's shape."""
    if not all(isinstance(n, torch.fx.Node) for n in (x, cos, sin)):
        return False
    fx, fc, fs, fo = (_val(n) for n in (x, cos, sin, add))
    if any(f is None or f.dtype != torch.float32 for f in (fx, fc, fs, fo)) or fx.dim() < 1:
        return False
    if [str(s) for s in fo.shape] != [str(s) for s in fx.shape]:
        return False
    return all(f.dim() <= fx.dim() and str(f.shape[-1]) == str(fx.shape[-1]) for f in (fc, fs))

