"""Attention over the filled part of a static KV cache as one engine op (``attention``).

A decoder with a static cache attends over every slot and masks the ones not written yet:

    scores = q @ K^T / f            K: a view of the cache [S slots] (a repeat_interleave for
    scores = masked_fill(scores, slots[None, :] > positions[:, None], -inf)     grouped heads)
    out    = softmax(scores, -1) @ V

so a decode step costs the whole capacity S whatever its position. The group is one op that
reads the positions at run time and stops at slot ``positions[i]`` for query row ``i``
(native/attention.cpp): a masked slot's weight is exactly 0 in torch, so the result is the
same up to float rounding, and a step at position 10 of a 2,048-slot cache reads 11 slots.

A match (``find_filled_attention``), each inner node read only by the next:

- ``_softmax(x, -1)`` reading ``masked_fill.Scalar(s, mask, -inf)``, read only by a
  ``matmul`` whose other operand is the V chain;
- ``s`` is ``div(mm, c)``, ``mul(mm, c)`` (c a number) or ``mm`` itself, ``mm = matmul(q,
  K chain)`` with ``q`` [H, M, D] (M may be symbolic: a dynamic prefill's sequence);
- ``mask`` is ``gt(slots, positions)`` with ``slots`` a constant ``0..S-1`` ([S] or [1, S])
  and ``positions`` an int64 [M] node unsqueezed to [M, 1] (the mask itself may be shared);
- each chain is view ops (unsqueeze, expand, clone, view, permute, transpose, ...) from a
  float32 cache tensor, static sizes, and is checked by running it on the element indices of
  the cache: K must come out as ``K[h, d, j] = cache[.., j, h / G, .., d]`` (a dim for slots,
  one for KV heads, one for the head size, any others of size 1) and V as ``V[h, j, d]`` on
  the same dims; so any order of views that means that matches, and nothing else does.
"""

from __future__ import annotations

import itertools
import math

import torch
import torch.fx

from opforge.backends.cpu.lowering.core import Lowering, _val, aten
from opforge.backends.cpu.lowering.normalization import _only_user

__all__ = ["FilledAttention", "find_filled_attention"]

_VIEWS = {aten.unsqueeze.default, aten.expand.default, aten.clone.default, aten.view.default,
          aten._unsafe_view.default, aten.reshape.default, aten.permute.default,
          aten.transpose.int, aten.t.default, aten.alias.default, aten.contiguous.default}


class FilledAttention:
    """One match: q, positions and the cache nodes (K, V), with the cache dims each of the
    op's operand dims [KV heads, slots, head size] is, and the score scaling."""

    kind = "attention"

    def __init__(self, q, positions, k_cache, v_cache, dims, mode: int, factor: float,
                 nodes: list) -> None:
        self.q, self.positions, self.k_cache, self.v_cache = q, positions, k_cache, v_cache
        self.dims, self.mode, self.factor, self.nodes = dims, mode, factor, nodes
        self.last = nodes[-1]

    def lower(self, L: Lowering):
        q = L.materialize(L.env[self.q.name])
        if L.spec(q).strides[-1] != 1:
            q = L.contiguous(q)
        positions = L.contiguous(L.materialize(L.env[self.positions.name]))
        caches = []
        for node, dims in zip((self.k_cache, self.v_cache), self.dims):
            tid = L.materialize(L.env[node.name])
            spec = L.spec(tid)
            caches.append(L.alias(tid, [spec.dims[d] for d in dims],
                                  [spec.strides[d] for d in dims]))
        fake = _val(self.last)
        out = L.new_tensor(torch.float32, fake.shape)
        L.op("attention", [q, *caches, positions], [out], ia=[self.mode], fa=[self.factor],
             name="attention (filled slots)")
        return ("t", out)


def find_filled_attention(sub, taken: dict) -> dict[str, FilledAttention]:
    """Every match whose nodes no other group has ``taken``, keyed by each node's name."""
    found: dict[str, FilledAttention] = {}
    order = {n: i for i, n in enumerate(sub.graph_module.graph.nodes)}
    for node in sub.graph_module.graph.nodes:
        try:
            match = _match(node, sub.constants)
        except Exception:  # noqa: BLE001 — a probe that does not run is not a match
            match = None
        if match is None or any(n.name in taken or n.name in found for n in match.nodes):
            continue
        match.nodes.sort(key=order.__getitem__)
        match.last = match.nodes[-1]
        for n in match.nodes:
            found[n.name] = match
    return found


def _match(mm2, constants) -> FilledAttention | None:
    if mm2.op != "call_function" or mm2.target is not aten.matmul.default or len(mm2.args) != 2:
        return None
    probs, v_operand = mm2.args
    if not (_only_user(probs, mm2) and probs.target is aten._softmax.default
            and probs.args[1] in (-1, 2) and not probs.args[2]):
        return None
    masked = probs.args[0]
    if not (_only_user(masked, probs) and masked.target is aten.masked_fill.Scalar
            and masked.args[2] == float("-inf")):
        return None
    scores, mask = masked.args[0], masked.args[1]
    mode, factor, mm1 = 1, 1.0, scores
    if scores.target in (aten.div.Tensor, aten.mul.Tensor) and isinstance(
            scores.args[1], (int, float)) and _only_user(scores, masked):
        mode, factor = int(scores.target is aten.mul.Tensor), float(scores.args[1])
        mm1 = scores.args[0]
        if not math.isfinite(factor) or factor == 0:
            return None
    reader = scores if mm1 is not scores else masked
    if not (isinstance(mm1, torch.fx.Node) and _only_user(mm1, reader)
            and mm1.target is aten.matmul.default and len(mm1.args) == 2):
        return None
    q, k_operand = mm1.args
    fq = _val(q)
    if fq is None or fq.dtype != torch.float32 or fq.dim() != 3:
        return None
    heads, rows, size = fq.shape  # (rows may be symbolic: a dynamic prefill's sequence)
    if not (isinstance(heads, int) and isinstance(size, int)):
        return None
    k = _chain(k_operand, mm1)
    v = _chain(v_operand, mm2)
    if k is None or v is None:
        return None
    (k_cache, k_nodes, k_probe), (v_cache, v_nodes, v_probe) = k, v
    slots = k_probe.shape[-1]
    if tuple(k_probe.shape) != (heads, size, slots) or tuple(v_probe.shape) != (heads, slots, size):
        return None
    positions = _positions(mask, constants, slots, rows)
    if positions is None:
        return None
    k_dims = _cache_dims(k_probe.permute(0, 2, 1), _val(k_cache).shape)
    v_dims = _cache_dims(v_probe, _val(v_cache).shape)
    if k_dims is None or v_dims is None:
        return None
    nodes = [*k_nodes, *v_nodes, mm1, masked, probs, mm2] + ([scores] if scores is not mm1 else [])
    return FilledAttention(q, positions, k_cache, v_cache, (k_dims, v_dims), mode, factor, nodes)


def _chain(node, user):
    """(cache node, the view nodes from it to ``node``, the chain run on the cache's element
    indices), or None: each node a view op read only by the next, static float32 sizes."""
    nodes = []
    while isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target in _VIEWS:
        if not _only_user(node, user):
            return None
        nodes.append(node)
        user, node = node, node.args[0]
    fake = _val(node) if isinstance(node, torch.fx.Node) else None
    if not nodes or fake is None or fake.dtype != torch.float32 or not all(
            isinstance(s, int) for s in fake.shape):
        return None
    value = torch.arange(fake.numel(), dtype=torch.int64).reshape(fake.shape)
    for n in reversed(nodes):
        value = n.target(value, *n.args[1:], **n.kwargs)
    return node, nodes, value


def _cache_dims(probe, shape) -> tuple[int, int, int] | None:
    """The cache dims (KV heads, slots, head size) that ``probe[h, j, d]`` (the cache's flat
    element indices) reads at ``[.., j, h / G, .., d]``, every other dim of size 1."""
    heads, slots, size = probe.shape
    strides = [math.prod(shape[k + 1:]) for k in range(len(shape))]
    for kv_dim, slot_dim, size_dim in itertools.permutations(range(len(shape)), 3):
        kv = shape[kv_dim]
        if kv < 1 or heads % kv or shape[slot_dim] != slots or shape[size_dim] != size or any(
                shape[k] != 1 for k in range(len(shape)) if k not in (kv_dim, slot_dim, size_dim)):
            continue
        h = torch.arange(heads).view(-1, 1, 1) // (heads // kv)
        j = torch.arange(slots).view(1, -1, 1)
        d = torch.arange(size).view(1, 1, -1)
        want = h * strides[kv_dim] + j * strides[slot_dim] + d * strides[size_dim]
        if torch.equal(probe, want.expand_as(probe)):
            return kv_dim, slot_dim, size_dim
    return None


def _positions(mask, constants, slots: int, rows: int):
    """The int64 [rows] node ``p`` when ``mask`` is ``gt(0..slots-1, p[:, None])``."""
    if not (isinstance(mask, torch.fx.Node) and mask.target is aten.gt.Tensor):
        return None
    table, column = mask.args
    if isinstance(table, torch.fx.Node) and table.target is aten.unsqueeze.default \
            and table.args[1] == 0:
        table = table.args[0]
    values = constants.get(table.name) if isinstance(table, torch.fx.Node) else None
    if values is None or values.dtype != torch.int64 or tuple(values.shape) != (slots,) \
            or not torch.equal(values, torch.arange(slots)):
        return None
    if not (isinstance(column, torch.fx.Node) and column.target is aten.unsqueeze.default
            and column.args[1] in (1, -1)):
        return None
    p = column.args[0]
    fp = _val(p)
    if fp is None or fp.dtype != torch.int64 or fp.dim() != 1 or str(fp.shape[0]) != str(rows):
        return None
    return p
