"""Attention over the filled part of a static KV cache as one engine op (``attention``).

A decoder with a static cache attends over every slot and masks the ones not written yet:

    scores = q @ K^T / f            K: a view of the cache [S slots] (a repeat_interleave for
    scores = masked_fill(scores, slots[None, :] > positions[:, None], -inf)     grouped heads)
    out    = softmax(scores, -1) @ V

so a decode step costs the whole capacity S whatever its position. The group is one op that
reads the positions at run time and stops at slot ``positions[i]`` for query row ``i``
(native/attention.cpp): a masked slot's weight is exactly 0 in torch, so the result is the
same up to float rounding, and a step at position 10 of a 2,048-slot cache reads 11 slots.

A match (``find_filled_attention``), each inner node read only inside the match:

- ``mm2 = matmul|bmm(probs, V chain)``, [H, M, D] (or with a batch dim of 1); ``probs``
  (through views that only add or drop dims of 1) is ``_softmax(x, -1)`` or the safe
  softmax's ``where`` (lowering/normalization.find_safe_softmax: the match takes it whole);
- ``x`` is ``masked_fill(s, mask, v)``, ``s + where(mask, 0, v)`` / ``s + where(mask, v,
  0)`` (v -inf or float32's lowest) or ``s + M`` (a float mask);
- ``s`` is ``mm1 = matmul|bmm(q, K chain)`` through reshapes and scalar multiplies or
  divides (on q, on the K chain, on the scores: one factor); ``q`` [H, M, D] (M may be
  symbolic: a dynamic prefill's sequence);
- each chain is view ops (unsqueeze, expand, clone, view, permute, transpose, ...) from a
  float32 cache tensor, static sizes, or from a float16/bfloat16 one with a cast to float32
  among them (the op reads the half-precision slots and converts them exactly: the same
  values as the cast's), and is checked by running it on the element indices of
  the cache: K must come out as ``K[h, d, j] = cache[.., j, h / G, .., d]`` (a dim for slots,
  one for KV heads, one for the head size, any others of size 1) and V as ``V[h, j, d]`` on
  the same dims; so any order of views that means that matches, and nothing else does;
- the bound: ``mask`` a comparison of the slot table (``0..S-1``, computed in the graph)
  with an int64 [M] node ``p`` along the rows (attention_graph.slot_bound): the op reads
  ``p``; else, where K and V are a cache write's result, the op reads the mask itself and
  stops at each row's last attended slot (a mask made outside this delegate).

A half-precision cache's write, ``index_copy(cache, d, p, x.to(cache dtype))`` (or
``index_put``) of a float32 ``x`` read only there, is one engine write (``HalfCacheWrite``)
that rounds the rows as it stores them (to nearest even, as the cast); with the attention
op, a decoder's half-precision cache is never converted whole. Nothing else the engine
does reads a float16 or bfloat16 tensor: any other reader of the cache stays on the kernels.
"""

from __future__ import annotations

import itertools
import math

import torch
import torch.fx

from opforge.backends.cpu.lowering.attention_graph import (HALF, RESHAPES, constant, is_cast,
                                                           peel, same_rows, scale_of, slot_bound)
from opforge.backends.cpu.lowering.core import Lowering, _val, aten
from opforge.backends.cpu.lowering.normalization import _only_user

__all__ = ["FilledAttention", "HalfCacheWrite", "find_filled_attention"]

# what a row with no slot to attend to gives (the op's ia[1]): torch's softmax of a row of
# -inf (NaN), the safe softmax's zeros, or (a finite mask value) the mean of every slot
_EMPTY_NAN, _EMPTY_ZERO, _EMPTY_MEAN = 0, 1, 2
# where the op reads each row's bound (its ia[3]): the positions (int64 [M]) or a mask
# [M, S] it scans for the row's last attended slot (bool, True = attend or True = masked;
# float32, added to the scores: the last slot that is not -inf)
_POSITIONS, _ATTEND_MASK, _MASKED_MASK, _FLOAT_MASK = 0, 1, 2, 3


class FilledAttention:
    """One match: q, positions and the cache nodes (K, V), with the cache dims each of the
    op's operand dims [KV heads, slots, head size] is, the score scaling, what an empty row
    gives and the bound's bias (row i attends to slots ``j < positions[i] + bias``)."""

    kind = "attention"

    def __init__(self, q, positions, k_cache, v_cache, dims, mode: int, factor: float,
                 nodes: list, *, empty: int = _EMPTY_NAN, bias: int = 1,
                 source: int = _POSITIONS) -> None:
        self.q, self.positions, self.k_cache, self.v_cache = q, positions, k_cache, v_cache
        self.dims, self.mode, self.factor, self.nodes = dims, mode, factor, nodes
        self.empty, self.bias, self.source = empty, bias, source
        self.last = nodes[-1]

    def lower(self, L: Lowering):
        q = _squeezed(L, L.materialize(L.env[self.q.name]), self.nodes)
        if L.spec(q).strides[-1] != 1:
            q = L.contiguous(q)
        positions = L.materialize(L.env[self.positions.name])
        if self.source == _POSITIONS:
            positions = L.contiguous(positions)
        else:  # the mask [1.., M or 1, S] as [M, S] (a row dim of 1: stride 0, every row)
            spec = L.spec(positions)
            rows = L.spec(q).dims[1]
            one_row = isinstance(spec.dims[-2], int) and spec.dims[-2] == 1
            positions = L.alias(positions, [rows, spec.dims[-1]],
                                [0 if one_row else spec.strides[-2], spec.strides[-1]])
        caches = []
        for node, dims in zip((self.k_cache, self.v_cache), self.dims):
            tid = L.materialize(L.env[node.name])
            spec = L.spec(tid)
            caches.append(L.alias(tid, [spec.dims[d] for d in dims],
                                  [spec.strides[d] for d in dims]))
        out = L.new_tensor(torch.float32, _val(self.last).shape)
        spec = L.spec(out)
        heads_rows_cols = L.alias(out, spec.dims[-3:], spec.strides[-3:]) if len(spec.dims) > 3 else out
        L.op("attention", [q, *caches, positions], [heads_rows_cols],
             ia=[self.mode, self.empty, self.bias, self.source],
             fa=[self.factor], name="attention (filled slots)")
        return ("t", out)


def _squeezed(L: Lowering, tid: int, nodes) -> int:
    """q [H, M, D]: the score matmul's first operand, which the match walked back to a
    tensor of the same elements in the same order with dims of size 1 added (a batch dim of
    1, transformers' [1, H, M, D]): an alias without them."""
    mm1 = next(n for n in nodes if n.target in _MATMULS)
    want = _val(mm1.args[0]).shape[-3:]
    spec = L.spec(tid)
    if len(spec.dims) == len(want):
        return tid
    kept = [k for k, d in enumerate(spec.dims) if not (isinstance(d, int) and d == 1)]
    dims, strides, k = [], [], 0
    for d in want:
        if isinstance(d, int) and d == 1:
            dims.append(1)
            strides.append(1)
        else:
            dims.append(spec.dims[kept[k]])
            strides.append(spec.strides[kept[k]])
            k += 1
    return L.alias(tid, dims, strides)


def find_filled_attention(sub, taken: dict, safe: dict | None = None) -> dict[str, FilledAttention]:
    """Every match whose nodes no other group has ``taken``, keyed by each node's name.
    ``safe`` (node name → softmax node, lowering/normalization.find_safe_softmax) lets a
    match take a safe softmax in whole; its nodes are then the match's, not ``safe``'s."""
    safe = safe or {}
    found: dict = _half_cache_writes(sub, taken)
    order = {n: i for i, n in enumerate(sub.graph_module.graph.nodes)}
    for node in sub.graph_module.graph.nodes:
        try:
            match = _match(node, sub.constants, safe)
        except Exception:  # noqa: BLE001 — a probe that does not run is not a match
            match = None
        if match is None or any(n.name in taken or n.name in found for n in match.nodes):
            continue
        match.nodes.sort(key=order.__getitem__)
        match.last = match.nodes[-1]
        for n in match.nodes:
            found[n.name] = match
    return found


_MATMULS = (aten.matmul.default, aten.bmm.default)
_MASKED = (float("-inf"), torch.finfo(torch.float32).min)  # a masked score's value


def _match(mm2, constants, safe: dict) -> FilledAttention | None:
    if mm2.op != "call_function" or mm2.target not in _MATMULS or len(mm2.args) != 2:
        return None
    fo = _val(mm2)
    if fo is None or fo.dtype != torch.float32 or not _heads_rows_cols(fo):
        return None
    probs_operand, v_operand = mm2.args
    # the probabilities: a softmax over the last dim, or the safe softmax's where; views
    # that only drop the batch dim of 1 between
    probs, probs_nodes, _ = peel(probs_operand, mm2, views=RESHAPES)
    if not same_rows(probs_nodes, probs):
        return None
    empty, nodes = _EMPTY_NAN, [*probs_nodes]
    if probs.name in safe and safe[probs.name] is not probs:
        softmax = safe[probs.name]
        group = [n for n in probs.graph.nodes if safe.get(n.name) is softmax]
        if probs not in group or not all(u in group for n in group for u in n.users
                                        if n is not probs) or list(probs.users) != [
                                            probs_nodes[-1] if probs_nodes else mm2]:
            return None
        empty, nodes = _EMPTY_ZERO, [*nodes, *group]
    elif _only_user(probs, probs_nodes[-1] if probs_nodes else mm2):
        softmax = probs
        nodes.append(softmax)
    else:
        return None
    if not (softmax.target is aten._softmax.default and not softmax.args[2]
            and softmax.args[1] % _val(softmax).dim() == _val(softmax).dim() - 1):
        return None
    masked = softmax.args[0]
    inner = set(nodes)
    if not (isinstance(masked, torch.fx.Node) and set(masked.users) <= inner):
        return None
    # the masked scores: masked_fill(s, mask, v) or s + where(mask, 0, v), v -inf or
    # float32's lowest (either is exactly 0 after the softmax's exp beside a finite score)
    form = _mask_form(masked, constants)
    if form is None:
        return None
    scores, cond, attend, fill, where = form
    if fill is not None and fill != float("-inf"):
        empty = _EMPTY_MEAN  # a row of only masked slots: every score the same, the mean
    nodes.append(masked)
    mm1, score_nodes, score_scales = peel(scores, masked, views=RESHAPES, scales=True)
    if not (isinstance(mm1, torch.fx.Node) and mm1.op == "call_function"
            and mm1.target in _MATMULS and len(mm1.args) == 2 and _only_user(
                mm1, score_nodes[-1] if score_nodes else masked)
            and same_rows(score_nodes, mm1)):
        return None
    q_operand, k_operand = mm1.args
    q, q_nodes, q_scales = peel(q_operand, mm1, views=RESHAPES, scales=True)
    fq = _val(q_operand)
    if q is None or _val(q) is None or fq.dtype != torch.float32 or not _heads_rows_cols(fq) \
            or not same_rows(q_nodes, q):
        return None
    heads, rows, size = fq.shape[-3:]  # (rows may be symbolic: a dynamic prefill's sequence)
    if not (isinstance(heads, int) and isinstance(size, int)):
        return None
    k = _chain(k_operand, mm1)
    v = _chain(v_operand, mm2, scales=False)
    if k is None or v is None:
        return None
    (k_cache, k_nodes, k_probe, k_scales), (v_cache, v_nodes, v_probe, _) = k, v
    if not (_heads_rows_cols(k_probe) and _heads_rows_cols(v_probe)):
        return None
    k_probe, v_probe = k_probe.reshape(k_probe.shape[-3:]), v_probe.reshape(v_probe.shape[-3:])
    slots = k_probe.shape[-1]
    if tuple(k_probe.shape) != (heads, size, slots) or tuple(v_probe.shape) != (heads, slots, size) \
            or [str(d) for d in fo.shape[-3:]] != [str(heads), str(rows), str(size)]:
        return None
    bound = None if attend is None else slot_bound(cond, constants, slots, rows, attend)
    source = _POSITIONS
    if bound is None:  # not provable from the graph (a mask made elsewhere): read the mask,
        # for a KV cache's attention only (K and V the result of a write into a cache)
        if not (_cache_write(k_cache) and _cache_write(v_cache)):
            return None
        source = _mask_source(cond, attend, slots, rows)
        if source is None:
            return None
        bound = (cond, 1)
        if where is not None and _only_user(where, masked):
            nodes.append(where)
    if _val(k_cache).dtype != _val(v_cache).dtype:  # (the op reads both as one dtype)
        return None
    k_dims = _cache_dims(k_probe.permute(0, 2, 1), _val(k_cache).shape)
    v_dims = _cache_dims(v_probe, _val(v_cache).shape)
    if k_dims is None or v_dims is None:
        return None
    mode, factor = _factor([*q_scales, *k_scales, *score_scales])
    nodes = [*q_nodes, *k_nodes, *v_nodes, mm1, *score_nodes, *nodes, mm2]
    return FilledAttention(q, bound[0], k_cache, v_cache, (k_dims, v_dims), mode, factor,
                           nodes, empty=empty, bias=bound[1], source=source)


def _heads_rows_cols(fake) -> bool:
    """A float [.., a, b, c] whose dims before the last three are all 1 (a batch of 1)."""
    return fake.dim() >= 3 and all(isinstance(d, int) and d == 1 for d in fake.shape[:-3])


def _cache_write(node) -> bool:
    """``node`` is a write of new rows into a tensor (a static cache's update)."""
    return isinstance(node, torch.fx.Node) and node.target in (
        aten.index_put.default, aten.index_put_.default, aten.index_copy.default,
        aten.index_copy_.default)


def _mask_source(mask, attend, slots: int, rows):
    """The op's source for a mask it reads at run time (bool: attend or masked; float32:
    added to the scores), when ``mask`` is [1.., rows or 1, slots]; else None."""
    fake = _val(mask) if isinstance(mask, torch.fx.Node) else None
    if fake is None or fake.dim() < 2 or str(fake.shape[-1]) != str(slots) or not (
            str(fake.shape[-2]) in (str(rows), "1")) or any(
                not (isinstance(d, int) and d == 1) for d in fake.shape[:-2]):
        return None
    if attend is None:
        return _FLOAT_MASK if fake.dtype == torch.float32 else None
    if fake.dtype != torch.bool:
        return None
    return _ATTEND_MASK if attend else _MASKED_MASK


def _mask_form(masked, constants):
    """(scores, mask, True when the mask says attend / False masked / None a float mask
    added, the masked value or None, the ``where`` that made the float mask or None) of
    ``masked_fill(scores, mask, v)``, ``scores + where(mask, 0, v)`` (either order, or
    ``where(mask, v, 0)``), v one of ``_MASKED``, or ``scores + mask``; else None."""
    if masked.target is aten.masked_fill.Scalar and len(masked.args) == 3:
        scores, cond, fill = masked.args
        return (scores, cond, False, fill, None) if fill in _MASKED else None
    if masked.target is not aten.add.Tensor or len(masked.args) != 2 or masked.kwargs:
        return None
    for scores, additive in (masked.args, masked.args[::-1]):
        if not (isinstance(additive, torch.fx.Node) and additive.target is aten.where.self):
            continue
        cond, a, b = additive.args
        a, b = (_number(constant(x, constants)) for x in (a, b))
        fs, fm = _val(scores), _val(additive)
        if fs is None or fm is None or fm.dim() > fs.dim() or fm.dtype != torch.float32:
            continue
        if str(fm.shape[-1]) != str(fs.shape[-1]):
            continue
        if a == 0 and b in _MASKED:
            return scores, cond, True, b, additive
        if b == 0 and a in _MASKED:
            return scores, cond, False, a, additive
    for scores, additive in (masked.args, masked.args[::-1]):
        fs, fm = _val(scores), _val(additive)
        if isinstance(additive, torch.fx.Node) and fs is not None and fm is not None \
                and fm.dtype == torch.float32 and fm.dim() <= fs.dim() \
                and _val(masked).shape == fs.shape and isinstance(scores, torch.fx.Node) \
                and scores.target in (*_MATMULS, *RESHAPES, aten.mul.Tensor, aten.mul.Scalar,
                                      aten.div.Tensor, aten.div.Scalar):
            return scores, additive, None, None, None
    return None


def _number(value):
    if isinstance(value, torch.Tensor) and value.numel() == 1 and value.is_floating_point():
        return float(value)
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _factor(scales) -> tuple[int, float]:
    """The op's (mode, factor) for the scalings met: one division keeps mode 0 (divide by
    its number, as the graph does); otherwise the product of the factors (mode 1)."""
    if len(scales) == 1 and scales[0].target in (aten.div.Tensor, aten.div.Scalar):
        return 0, float(scales[0].args[1])
    return 1, math.prod(scale_of(n) for n in scales)


def _chain(node, user, scales: bool = True):
    """(cache node, the nodes from it to ``node``, the chain run on the cache's element
    indices, the scalings met), or None: each node a view op (or a scalar scaling where
    ``scales``) read only by the next, from a float32 cache of static sizes, or from a
    float16/bfloat16 one with one cast to float32 among the nodes."""
    source, nodes, factors = peel(node, user, scales=scales, converts=True)
    fake = _val(source) if isinstance(source, torch.fx.Node) else None
    casts = [n for n in nodes if is_cast(n)]
    if not nodes or fake is None or not all(isinstance(s, int) for s in fake.shape) or not (
            (fake.dtype == torch.float32 and not casts)
            or (fake.dtype in HALF and len(casts) == 1)):
        return None
    value = torch.arange(fake.numel(), dtype=torch.int64).reshape(fake.shape)
    for n in reversed(nodes):
        # (a scaling or the cast changes values, not which element is where)
        if n not in factors and n not in casts:
            value = n.target(value, *n.args[1:], **n.kwargs)
    return source, nodes, value, factors


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


class HalfCacheWrite:
    """``index_copy(cache, d, p, x.to(half))`` / ``index_put(cache, [.., p], x.to(half))``
    of a float16/bfloat16 ``cache`` and a float32 ``x``: the engine's write rounds ``x``'s rows
    into the cache (lowering/indexing.py), the cast computed by it."""

    kind = "index write (float32 rows rounded into a half-precision cache)"

    def __init__(self, cast, write) -> None:
        self.cast, self.write = cast, write
        self.nodes = [cast, write]
        self.last = write

    def lower(self, L: Lowering):
        from opforge.backends.cpu.lowering.indexing import lower_index_copy, lower_index_put

        args = list(L.arg(self.write.args))
        kwargs = {k: L.arg(v) for k, v in self.write.kwargs.items()}
        copy = self.write.target in (aten.index_copy.default, aten.index_copy_.default)
        args[3 if copy else 2] = L.env[self.cast.args[0].name]  # the float32 rows
        return (lower_index_copy if copy else lower_index_put)(L, self.write, args, kwargs)


def _half_cache_writes(sub, taken: dict) -> dict:
    """node name → ``HalfCacheWrite`` for each write of a cast's result into a half cache
    (the cast read by nothing else, neither node taken by another group)."""
    found = {}
    for write in sub.graph_module.graph.nodes:
        if not _cache_write(write) or len(write.args) < 3:
            continue
        copy = write.target in (aten.index_copy.default, aten.index_copy_.default)
        cast = write.args[3] if copy and len(write.args) > 3 else write.args[2]
        fake, self_fake = _val(cast) if isinstance(cast, torch.fx.Node) else None, _val(write)
        if fake is None or self_fake is None or self_fake.dtype not in HALF \
                or fake.dtype != self_fake.dtype or cast.target is not aten._to_copy.default \
                or len(cast.args) != 1 or not set(cast.kwargs) <= {"dtype", "layout", "device"} \
                or list(cast.users) != [write] or not isinstance(cast.args[0], torch.fx.Node) \
                or _val(cast.args[0]) is None or _val(cast.args[0]).dtype != torch.float32 \
                or cast.name in taken or write.name in taken or not _plain_write(write, copy):
            continue
        group = HalfCacheWrite(cast, write)
        found[cast.name] = found[write.name] = group
    return found


def _plain_write(write, copy: bool) -> bool:
    """The write lowers for certain (lowering/indexing.py), as the cast it takes is computed
    by it: a contiguous cache, one int64/int32 index tensor, values of the written rows'
    shape, no accumulation."""
    cache, values = _val(write.args[0]), _val(write.args[3 if copy else 2])
    if cache is None or values is None or not cache.is_contiguous() or cache.dim() == 0:
        return False
    if copy:
        index, dim = write.args[2], write.args[1]
        if not isinstance(dim, int):
            return False
        dim %= cache.dim()
    else:
        accumulate = write.args[3] if len(write.args) > 3 else write.kwargs.get("accumulate", False)
        indices = list(write.args[1])
        while indices and indices[-1] is None:
            indices.pop()
        if accumulate or not indices or any(i is not None for i in indices[:-1]):
            return False
        index, dim = indices[-1], len(indices) - 1
    ix = _val(index) if isinstance(index, torch.fx.Node) else None
    if ix is None or ix.dtype not in (torch.int64, torch.int32):
        return False
    want = [*cache.shape[:dim], *ix.shape, *cache.shape[dim + 1:]]
    return [str(d) for d in values.shape] == [str(d) for d in want]
