"""Grouped-query attention without expanding the KV cache.

A decoder with fewer key/value heads than query heads repeats each cache head for its
group of query heads before the score and value matmuls
(``k_cache.repeat_interleave(group, dim=1)``). Exported, that is a chain

    cache [T, Hkv, d] -> unsqueeze -> expand [T, Hkv, G, d] -> clone -> view [T, H, d]
          -> permute / transpose ... -> matmul(q, ·)      (or matmul(probs, ·))

whose ``view`` merges the broadcast (stride-0) axis G into the heads axis: no strided view
can say that, so the plain path copies the expanded cache (and then copies it again into the
batch-dense layout the matmul wants), every call. Here the chain is found before lowering
(``find_grouped_chains``: each node of it read only by the next, the last read only by a
``matmul``/``bmm``, no state written between the ``expand`` and the matmul, since the
matmul now reads the cache where the copy read it before); its nodes lower to a
``GroupedView`` — the broadcast alias of the cache with each logical dim a group of its
physical dims — and the matmul splits its batch dims into those groups: the heads axis
becomes [Hkv, G], the other operand and the result are viewed [.., Hkv, G, m, k] (a
split is always a strided view), the cache operand [.., Hkv, 1, k, n] (oneDNN's matmul
broadcasts a batch dim of size 1). Where the other operand's G and row strides allow it
(a row-major q or probabilities, as the decoder's are), G is folded into the rows instead:
[.., Hkv, G·m, k] x [.., Hkv, k, n], one larger matmul per KV head and no broadcast. The
result [.., Hkv, G, m, n] is the same memory as [.., H, m, n].

Anything else in the chain (a view that splits, a slice, another reader) or at the matmul
(ranks that differ, a matrix dim the cache cannot be read along with unit stride) falls
back to the plain path at that point: the view is materialised with one copy, as before.
Sizes may be symbolic (the prefill's sequence): every decision on a size is ``same``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.fx

from opforge.backends.partition import op_name
from opforge.backends.cpu.lowering.core import (
    Lowering, Unsupported, _is_one, _val, row_major, same,
)

__all__ = ["GroupedView", "find_grouped_chains", "lower_grouped"]

aten = torch.ops.aten

# ops a chain may pass through between the expand and the matmul (and their _copy forms)
_CHAIN = {"view", "_unsafe_view", "reshape", "permute", "transpose", "t", "expand", "clone",
          "alias", "detach", "contiguous"}
_MATMULS = (aten.matmul.default, aten.bmm.default)
# ops that write program state in place: none may run between a chain's expand and its
# matmul (the matmul reads the cache at its own position in the plan)
_WRITES = {"index_put", "index_put_", "index_copy", "index_copy_", "copy", "copy_",
           "slice_scatter", "select_scatter"}


def _base(node) -> str:
    name = op_name(node).split("::")[-1].split(".")[0]
    return name[:-5] if name.endswith("_copy") and name != "index_copy" else name


@dataclass(frozen=True)
class GroupedView:
    """A tensor the plan cannot hold as one strided view: ``tid`` is the strided alias of
    the physical dims (a broadcast one has stride 0), and logical dim ``i`` is the physical
    dims ``groups[i]`` read as one row-major index."""

    tid: int
    groups: tuple[tuple[int, ...], ...]

    def dims(self, L: Lowering) -> tuple:
        spec = L.spec(self.tid)
        return tuple(math.prod(spec.dims[p] for p in g) for g in self.groups)


def find_grouped_chains(sub) -> dict[str, str]:
    """Node name → ``"chain"`` (lowered to a ``GroupedView``) or ``"matmul"`` (reads one),
    for each chain ``expand → (view ops)* → matmul/bmm`` whose expand broadcasts a size-1
    dim and whose nodes are each read only by the next."""
    nodes = list(sub.graph_module.graph.nodes)
    order = {n: i for i, n in enumerate(nodes)}
    found: dict[str, str] = {}
    for mm in nodes:
        if mm.op != "call_function" or mm.target not in _MATMULS:
            continue
        for operand in mm.args[:2]:
            chain = _chain_to_expand(operand, mm)
            if chain is None:
                continue
            between = nodes[order[chain[-1]] + 1:order[mm]]
            if any(n.op == "call_function" and _base(n) in _WRITES for n in between):
                continue
            found.update({n.name: "chain" for n in chain})
            found[mm.name] = "matmul"
    return found


def _chain_to_expand(node, user) -> list | None:
    """The nodes from ``node`` back to a broadcasting expand, each read only by the one
    after it (``user`` last), or None."""
    chain = []
    while isinstance(node, torch.fx.Node) and node.op == "call_function" \
            and list(node.users) == [user] and _base(node) in _CHAIN:
        chain.append(node)
        if _base(node) == "expand" and _broadcasts(node):
            return chain
        user, node = node, node.args[0]
    return None


def _broadcasts(expand) -> bool:
    src, out = _val(expand.args[0]), _val(expand)
    if src is None or out is None:
        return False
    pad = out.dim() - src.dim()
    return pad > 0 or any(type(s) is int and s == 1 and not (type(o) is int and o == 1)
                          for s, o in zip(src.shape, out.shape[pad:]))


# --- lowering --------------------------------------------------------------------------
def lower_grouped(L: Lowering, node, args, kwargs):
    """A node ``find_grouped_chains`` marked: a chain node returns ``("g", GroupedView)``
    (or, where the view is not a regrouping, today's value after one copy); the matmul
    reads it in place, or falls back to ``lower_mm`` on the materialised operand."""
    from opforge.backends.cpu.lowering.matmul import lower_mm
    from opforge.backends.cpu.lowering.views import lower_view

    if L.grouped.get(node.name) == "matmul":
        out = _grouped_matmul(L, node, args)
        if out is not None:
            return out
        return lower_mm(L, node, [materialize(L, a) for a in args], kwargs)
    source = args[0]
    view = source[1] if isinstance(source, tuple) and source[0] == "g" else None
    if view is None:  # the expand: its input is an ordinary tensor
        view = _expand(L, L.materialize(source), args[1]) if _base(node) == "expand" else None
    else:
        view = _regroup(L, node, view, args)
    if view is None:  # today's path from here: one copy, then the op as usual
        return lower_view(L, node, [materialize(L, source), *args[1:]], kwargs)
    return ("g", view)


def materialize(L: Lowering, value):
    """``value`` as an ordinary plan value: a ``GroupedView`` copied into a row-major
    tensor of its logical dims (each group's physical dims in order: a row-major copy of
    the concatenated groups is one of the logical dims)."""
    if not (isinstance(value, tuple) and len(value) == 2 and value[0] == "g"):
        return value
    view: GroupedView = value[1]
    spec = L.spec(view.tid)
    order = [p for g in view.groups for p in g]
    dims = tuple(spec.dims[p] for p in order)
    src = L.alias(view.tid, dims, tuple(spec.strides[p] for p in order))
    out = L.new_tensor(spec.dtype, view.dims(L))
    L.copy(src, L.alias(out, dims, row_major(dims)))
    return ("t", out)


def _expand(L: Lowering, tid: int, sizes) -> GroupedView | None:
    spec = L.spec(tid)
    sizes = [L.dim(s) for s in sizes]
    pad = len(sizes) - len(spec.dims)
    if pad < 0:
        return None
    dims, strides = [], []
    for k, size in enumerate(sizes):
        if k < pad:
            if type(size) is not int or size < 0:
                return None
            dims.append(size)
            strides.append(0)
            continue
        d, s = spec.dims[k - pad], spec.strides[k - pad]
        if (type(size) is int and size == -1) or same(size, d):
            dims.append(d)
            strides.append(s)
        elif type(d) is int and d == 1:
            dims.append(size)
            strides.append(0)
        else:
            return None
    # (the alias tidies size-1 strides; a broadcast dim keeps its 0: its size is not 1)
    return GroupedView(L.alias(tid, dims, strides), tuple((k,) for k in range(len(dims))))


def _regroup(L: Lowering, node, view: GroupedView, args) -> GroupedView | None:
    """``node`` (a view op) on a ``GroupedView``: a permutation of its groups, a merge of
    adjacent groups, or the same groups; None for anything else."""
    base, groups, rank = _base(node), list(view.groups), len(view.groups)
    if base in ("clone", "alias", "detach", "contiguous"):
        return view
    if base == "permute":
        perm = [p % rank for p in args[1]]
        return GroupedView(view.tid, tuple(groups[p] for p in perm))
    if base in ("transpose", "t"):
        a, b = (args[1] % rank, args[2] % rank) if base == "transpose" else (0, 1)
        groups[a], groups[b] = groups[b], groups[a]
        return GroupedView(view.tid, tuple(groups))
    dims = view.dims(L)
    if base == "expand":
        sizes = [L.dim(s) for s in args[1]]
        ok = len(sizes) == rank and all((type(s) is int and s == -1) or same(s, d)
                                        for s, d in zip(sizes, dims))
        return view if ok else None
    if base in ("view", "_unsafe_view", "reshape"):
        return _merge(L, view, dims, [L.dim(s) for s in args[1]])
    return None


def _merge(L: Lowering, view: GroupedView, dims, sizes) -> GroupedView | None:
    """A reshape that only merges runs of adjacent logical dims (each new size identically
    the product of its run; a -1 is resolved from the total)."""
    if sum(1 for s in sizes if type(s) is int and s == -1) > 1:
        return None
    if any(type(s) is int and s == -1 for s in sizes):
        k = next(i for i, s in enumerate(sizes) if type(s) is int and s == -1)
        rest = math.prod(s for i, s in enumerate(sizes) if i != k)
        try:
            sizes[k] = math.prod(dims) // (max(rest, 1) if type(rest) is int else rest)
        except Unsupported:
            return None
    merged, i = [], 0
    try:
        for size in sizes:
            run, numel = [], 1
            while i < len(dims) and (not run or not same(numel, size)):
                run += view.groups[i]
                numel = numel * dims[i]
                i += 1
            if not run or not same(numel, size):
                return None
            merged.append(tuple(run))
    except Unsupported:
        return None
    return GroupedView(view.tid, tuple(merged)) if i == len(dims) else None


def _grouped_matmul(L: Lowering, node, args):
    """The matmul over split batch dims, or None (the caller takes the plain path)."""
    from opforge.backends.cpu.lowering.core import _need_f32
    from opforge.backends.cpu.lowering.matmul import _matmul_operand

    _need_f32(node)
    grouped = [i for i, a in enumerate(args[:2]) if isinstance(a, tuple) and a[0] == "g"]
    if len(grouped) != 1:
        return None
    g = grouped[0]
    view: GroupedView = args[g][1]
    other = _matmul_operand(L, L.materialize(args[1 - g]))
    so, phys = L.spec(other), L.spec(view.tid)
    rank = len(view.groups)
    fake = _val(node)
    if rank < 3 or len(so.dims) != rank or fake is None or fake.dim() != rank:
        return None
    # the grouped operand's two matrix dims: one physical dim each, read with a unit stride
    matrix = []
    for grp in view.groups[-2:]:
        real = [p for p in grp if not _is_one(phys.dims[p])]
        if len(real) > 1 or (real and same(phys.strides[real[0]], 0)):
            return None
        matrix.append(real[0] if real else None)
    if None in matrix or not (same(phys.strides[matrix[0]], 1) or same(phys.strides[matrix[1]], 1)):
        return None
    odims = L.shape(fake)
    for k, grp in enumerate(view.groups[:-2]):
        size = math.prod(phys.dims[p] for p in grp)
        if not same(size, so.dims[k]) or not same(size, odims[k]):
            return None  # (the other operand broadcasting here: plain path)
    out = L.new_tensor(fake.dtype, fake.shape)
    sout = L.spec(out)
    dims = {"x": [], "o": [], "y": []}
    strides = {"x": [], "o": [], "y": []}
    bcast = []  # split positions where the grouped operand broadcasts
    for k, grp in enumerate(view.groups[:-2]):
        sizes = [phys.dims[p] for p in grp]
        for j, p in enumerate(grp):
            inner = math.prod(sizes[j + 1:])
            zero = not _is_one(sizes[j]) and same(phys.strides[p], 0)
            if zero:
                bcast.append(len(dims["x"]))
            dims["x"].append(1 if zero else sizes[j])
            strides["x"].append(phys.strides[p])
            for key, spec in (("y", so), ("o", sout)):
                dims[key].append(sizes[j])
                strides[key].append(spec.strides[k] * inner)
    for key, spec in (("y", so), ("o", sout)):
        dims[key] += list(spec.dims[-2:])
        strides[key] += list(spec.strides[-2:])
    dims["x"] += [phys.dims[p] for p in matrix]
    strides["x"] += [phys.strides[p] for p in matrix]
    if g == 1 and bcast and bcast[-1] == len(dims["x"]) - 3 and _folds(dims, strides, "y") \
            and _folds(dims, strides, "o"):
        _fold(dims, strides, bcast[-1])
    x = L.alias(view.tid, dims["x"], strides["x"])
    y = L.alias(other, dims["y"], strides["y"])
    ins = [y, x] if g == 1 else [x, y]
    L.op("matmul", ins, [L.alias(out, dims["o"], strides["o"])], name="matmul (grouped)")
    return ("t", out)


def _folds(dims, strides, key) -> bool:
    """Whether the last batch dim of ``key`` merges into its rows (a strided view)."""
    d, s = dims[key], strides[key]
    return same(s[-3], d[-2] * s[-2])


def _fold(dims, strides, k) -> None:
    """The broadcast batch dim ``k`` (the last) into the rows of the other operand and the
    result; the grouped operand (size 1 there) drops it."""
    for key in ("y", "o"):
        dims[key][-2] = dims[key][k] * dims[key][-2]
        del dims[key][k], strides[key][k]
    del dims["x"][k], strides["x"][k]
