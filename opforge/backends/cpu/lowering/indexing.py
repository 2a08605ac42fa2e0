"""Indexing on one dimension, and writes into program state.

``index.Tensor`` with one index tensor is a row gather (the engine's ``index``: rotary
tables read at the positions); ``index_put`` (``accumulate=False``, one index tensor: what
``index_copy_`` decomposes to) and ``index_copy`` write rows (``index_put`` / ``index_copy``);
``slice_scatter`` and ``select_scatter`` (``cache[a:b].copy_(k)``: a functional ``copy``
of ``k`` to the slice's sizes, then the scatter) are strided copies. Each
index is checked by the engine at run time before anything is written. The gather and the
row writes also take symbolic sizes (a prefill's positions: a dynamic delegate makes the
plan concrete per shape); the region copies take static ones only.

A write whose ``self`` is a state input the delegate updates in place
(``Subgraph.state``: the new value is that delegate output) writes the state itself: no
copy of the cache, one row per position. Any other write copies ``self`` first.
"""

from __future__ import annotations

import math

import torch

from opforge.backends.cpu.lowering.core import (
    SYMBOLIC_SIZES, LOWERINGS, Lowering, Unsupported, _val, aten, row_major, same,
)
from opforge.backends.cpu.lowering.symbolic import is_symbolic_dim
from opforge.backends.cpu.lowering.views import _fit_affine, _positions

# dtypes the engine's blob has codes for: rows are copied as bytes, so any of them
ROW_DTYPES = (torch.float32, torch.float64, torch.int64, torch.int32, torch.int16, torch.int8,
              torch.uint8, torch.bool)
# a KV cache's half-precision storage: the gather and the row writes take it (whole
# contiguous rows; a write's float32 values are rounded into it), no other engine op does
HALF_DTYPES = (torch.float16, torch.bfloat16)


def _one_index(indices) -> tuple[int, object]:
    """``(dim, index)`` of an ``indices`` list holding one integer index tensor, the entries
    before it ``None`` (ATen's ``x[:, :, idx]``)."""
    entries = list(indices)
    while entries and entries[-1] is None:
        entries.pop()
    if not entries or any(e is None for e in entries[-1:]) or any(
            e is not None for e in entries[:-1]):
        raise Unsupported("op", "indexing with other than one index tensor on one dimension; "
                          "stays on the kernels")
    return len(entries) - 1, entries[-1]


def _index_tensor(L: Lowering, index) -> int:
    ix = L.contiguous(L.materialize(index))
    if L.spec(ix).dtype not in (torch.int64, torch.int32):
        raise Unsupported("dtype", "indexing with a mask or a non-integer index; stays on the "
                          "kernels")
    return ix


def _rows(L: Lowering, tid: int, like: int, dim: int, rows: int | None = None) -> int:
    """``tid`` (row-major) as ``(outer, rows, inner)``, outer and inner the sizes of
    ``like``'s dimensions before and after ``dim`` (the indexed tensor's)."""
    dims = L.spec(like).dims
    outer, inner = math.prod(dims[:dim]), math.prod(dims[dim + 1:])
    rows = dims[dim] if rows is None else rows
    return L.alias(tid, (outer, rows, inner), (rows * inner, inner, 1))


def _check_dtype(node, *dtypes, half: bool = False) -> None:
    for dtype in dtypes:
        if dtype not in ROW_DTYPES and not (half and dtype in HALF_DTYPES):
            raise Unsupported("dtype", f"indexing on {dtype}; stays on the kernels")


def _whole_rows(L: Lowering, tid: int) -> int:
    """``L.contiguous(tid)``; a strided half-precision tensor is refused (the engine's
    copies do not take float16/bfloat16)."""
    spec = L.spec(tid)
    if spec.dtype in HALF_DTYPES and not same(spec.strides, row_major(spec.dims)):
        raise Unsupported("dtype", f"a strided {spec.dtype} tensor: the engine reads half-"
                          "precision tensors whole in the KV cache's write and attention only; "
                          "stays on the kernels")
    return L.contiguous(tid)


def lower_index(L: Lowering, node, args, kwargs):
    dim, index = _one_index(args[1])
    fake = _val(node)
    _check_dtype(node, fake.dtype, half=True)
    src = _whole_rows(L, L.materialize(args[0]))
    ix = _index_tensor(L, index)
    out = L.new_tensor(fake.dtype, fake.shape)
    n = math.prod(L.spec(ix).dims)
    L.op("index", [_rows(L, src, src, dim), ix], [_rows(L, out, src, dim, n)], name="index")
    return ("t", out)


def _target(L: Lowering, node, half: bool = False) -> tuple[int, bool]:
    """The tensor a write goes into: the state itself when this node writes it in place,
    else a new one (``self`` is copied into it by the op)."""
    fake = _val(node)
    _check_dtype(node, fake.dtype, half=half)
    state = L.in_place.get(node.name)
    if state is not None and node.args[0].name == state:
        return L.materialize(L.env[state]), True
    return L.new_tensor(fake.dtype, fake.shape), False


def _write_rows(L: Lowering, node, kind: str, self_value, dim: int, index, values):
    _check_dtype(node, _val(node).dtype, half=True)
    ix = _index_tensor(L, index)
    src = _whole_rows(L, L.materialize(self_value))
    s = L.spec(src)
    shape = s.dims[:dim] + L.spec(ix).dims + s.dims[dim + 1:]
    v = L.materialize(values)
    vs = L.spec(v)
    # (float32 rows into a half-precision cache: the op rounds them, as `.to()` would)
    if vs.dtype != s.dtype and not (vs.dtype == torch.float32 and s.dtype in HALF_DTYPES):
        raise Unsupported("dtype", f"aten::{kind} of {vs.dtype} values into {s.dtype}; stays on "
                          "the kernels")
    if not same(tuple(vs.dims), tuple(shape)):  # broadcast values: made real first
        if any(is_symbolic_dim(d) for d in (*vs.dims, *shape)):
            raise Unsupported("shape", f"aten::{kind}: values broadcast over dynamic sizes; "
                              "stays on the kernels")
        try:
            torch.broadcast_shapes(tuple(vs.dims), tuple(shape))
        except RuntimeError:
            raise Unsupported("shape", f"aten::{kind}: values do not broadcast") from None
        pad = len(shape) - len(vs.dims)
        strides = [0] * pad + [0 if d == 1 and o != 1 else st for d, st, o in
                               zip(vs.dims, vs.strides, shape[pad:])]
        v = L.alias(v, shape, strides)
    v = _whole_rows(L, v)
    out, in_place = _target(L, node, half=True)
    n = math.prod(L.spec(ix).dims)
    rows_out = _rows(L, out, src, dim)
    L.op(kind, [rows_out if in_place else _rows(L, src, src, dim), ix, _rows(L, v, src, dim, n)],
         [rows_out], name=kind + (" (state, in place)" if in_place else ""))
    return ("t", out)


def lower_index_put(L: Lowering, node, args, kwargs):
    accumulate = args[3] if len(args) > 3 else kwargs.get("accumulate", False)
    if accumulate:
        raise Unsupported("op", "aten::index_put with accumulate=True; stays on the kernels")
    dim, index = _one_index(args[1])
    return _write_rows(L, node, "index_put", args[0], dim, index, args[2])


def lower_index_copy(L: Lowering, node, args, kwargs):
    fake = _val(node)
    dim = args[1] % max(fake.dim(), 1)
    if fake.dim() == 0:
        raise Unsupported("shape", "aten::index_copy of a 0-d tensor; stays on the kernels")
    return _write_rows(L, node, "index_copy", args[0], dim, args[2], args[3])


def lower_scatter_region(L: Lowering, node, args, kwargs):
    """``slice_scatter`` / ``select_scatter``: ``src`` copied into a strided region of
    ``self`` (static bounds, checked by torch at export)."""
    fake = _val(node)
    _check_dtype(node, fake.dtype)
    src = L.materialize(args[1])
    out, in_place = _target(L, node)
    if not in_place:
        L.copy(L.materialize(args[0]), out)
    where = _positions(L.spec(out))
    try:
        if node.target is aten.select_scatter.default:
            region = aten.select.int(where, args[2], args[3])
        else:
            region = aten.slice.Tensor(where, *args[2:])
    except (RuntimeError, IndexError) as e:
        raise Unsupported("shape", f"{node.target}: {e}") from None
    fit = _fit_affine(region)
    s = L.spec(src)
    if fit is None or tuple(region.shape) != tuple(s.dims) or s.dtype != fake.dtype:
        raise Unsupported("shape", f"{node.target}: src does not fill the region exactly; stays "
                          "on the kernels")
    base, strides = fit
    if math.prod(s.dims):
        L.copy(src, L.alias(out, tuple(region.shape), strides, base))
    return ("t", out)


def lower_copy(L: Lowering, node, args, kwargs):
    """Functional ``copy(self, src)``: ``src`` broadcast and cast to ``self``'s sizes and
    dtype (slice assignment, ``cache[a:b].copy_(k)``, is copy then slice_scatter)."""
    fake = _val(node)
    src = L.materialize(args[1])
    s = L.spec(src)
    if fake.dtype not in ROW_DTYPES or s.dtype not in ROW_DTYPES:
        raise Unsupported("dtype", f"aten::copy to {fake.dtype}; stays on the kernels")
    shape = tuple(fake.shape)
    pad = len(shape) - len(s.dims)
    if pad < 0 or any(d not in (1, o) for d, o in zip(s.dims, shape[pad:])):
        raise Unsupported("shape", "aten::copy: src does not broadcast to self")
    strides = [0] * pad + [0 if d == 1 and o != 1 else st for d, st, o in
                           zip(s.dims, s.strides, shape[pad:])]
    out = L.new_tensor(fake.dtype, shape)
    if math.prod(shape):
        L.copy(L.alias(src, shape, strides), out)
    return ("t", out)


LOWERINGS["aten::copy.default"] = lower_copy
LOWERINGS["aten::index.Tensor"] = lower_index
LOWERINGS["aten::index_put.default"] = lower_index_put
LOWERINGS["aten::index_copy.default"] = lower_index_copy
LOWERINGS["aten::slice_scatter.default"] = lower_scatter_region
LOWERINGS["aten::select_scatter.default"] = lower_scatter_region
SYMBOLIC_SIZES.update({lower_index, lower_index_put, lower_index_copy})
