"""Views and copies: reshape/permute/expand/slice as strided aliases (no copy) where the
result is a strided view of its input, copies otherwise; cat, casts, constant padding and
row gathers (index_select).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch
import torch.fx

from opforge.backends.partition import op_name
from opforge.backends.cpu.lowering.core import (
    SYMBOLIC_SIZES,
    EW, GENERIC_DTYPES, LOWERINGS, Lowering, TensorSpec, Unsupported, _unwrap, _val, known,
)


# --- views and copies ----------------------------------------------------------------------
def _fit_affine(offsets: torch.Tensor):
    """(base, strides) if ``offsets`` (int64, any shape) is base + idx·strides, else None."""
    if offsets.numel() == 0:
        return 0, [0] * offsets.dim()
    base = int(offsets.reshape(-1)[0])
    strides = []
    for k in range(offsets.dim()):
        if offsets.shape[k] > 1:
            index = [0] * offsets.dim()
            index[k] = 1
            strides.append(int(offsets[tuple(index)]) - base)
        else:
            strides.append(0)
    grid = torch.full(offsets.shape, base, dtype=torch.int64)
    for k, s in enumerate(strides):
        shape = [1] * offsets.dim()
        shape[k] = offsets.shape[k]
        grid = grid + torch.arange(offsets.shape[k]).reshape(shape) * s
    return (base, strides) if torch.equal(grid, offsets) else None


def _positions(spec: TensorSpec) -> torch.Tensor:
    grid = torch.zeros(spec.dims, dtype=torch.int64)
    for k, (d, s) in enumerate(zip(spec.dims, spec.strides)):
        shape = [1] * len(spec.dims)
        shape[k] = d
        grid = grid + torch.arange(d).reshape(shape) * s
    return grid


def lower_view(L: Lowering, node, args, kwargs):
    """Any op that picks elements of its one tensor input (view, permute, expand, select,
    slice, squeeze, split, clone...): run it on the input's element offsets; an affine
    result is an alias (no copy), with zero strides materialised."""
    source = args[0]
    tid = L.materialize(source)
    spec = L.spec(tid)
    if L.table is not None and _symbolic(spec, args, kwargs):
        from opforge.backends.cpu.lowering.symbolic_views import lower_view_symbolic

        return lower_view_symbolic(L, node, args, kwargs)
    if math.prod(spec.dims) > (1 << 24):
        raise Unsupported("shape", f"{op_name(node)} on a tensor of more than 2^24 elements: the "
                          "backend's view analysis is bounded; stays on the kernels")
    result = node.target(_positions(spec), *_unwrap(args[1:]), **_unwrap(kwargs))
    results = list(result) if isinstance(result, (tuple, list)) else [result]
    if any(_fit_affine(r) is None for r in results):
        # e.g. a view of a permuted tensor: make the input row-major first
        tid = L.contiguous(tid)
        spec = L.spec(tid)
        result = node.target(_positions(spec), *_unwrap(args[1:]), **_unwrap(kwargs))
        results = list(result) if isinstance(result, (tuple, list)) else [result]
    out = []
    for r in results:
        fit = _fit_affine(r)
        if fit is None:
            raise Unsupported("layout", f"{op_name(node)}: its result is not a strided view of the "
                              "input; stays on the kernels")
        base, strides = fit
        dims = tuple(r.shape)
        alias = L.alias(tid, dims, strides, base)
        if any(s == 0 and d > 1 for s, d in zip(strides, dims)):  # expand: make it real
            real = L.new_tensor(spec.dtype, dims)
            L.copy(alias, real)
            alias = real
        out.append(("t", alias))
    return tuple(out) if isinstance(result, (tuple, list)) else out[0]


def _symbolic(spec: TensorSpec, args, kwargs) -> bool:
    from opforge.backends.cpu.lowering.symbolic import is_symbolic_dim

    def walk(v):
        if isinstance(v, (list, tuple)):
            return any(walk(x) for x in v)
        return is_symbolic_dim(v)
    return walk(list(spec.dims) + list(spec.strides) + [spec.offset]) or walk(args[1:]) \
        or walk(list(kwargs.values()))


def lower_cat(L: Lowering, node, args, kwargs):
    tensors = [L.materialize(t) for t in args[0]]
    dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
    fake = _val(node)
    dim = dim % fake.dim()
    out = L.new_tensor(fake.dtype, fake.shape)
    strides = L.spec(out).strides
    start = 0
    for t in tensors:
        s = L.spec(t)
        if s.dtype != fake.dtype:
            raise Unsupported("dtype", "aten::cat of mixed dtypes; stays on the kernels")
        if known(lambda: math.prod(s.dims) == 0):
            continue
        L.copy(t, out, start * strides[dim], strides)
        start += s.dims[dim]
    return ("t", out)


def lower_stack(L: Lowering, node, args, kwargs):
    """One copy per input into its slot of the new dim (torch's bicubic interpolation
    stacks its weights; the support check folds that on constants, but a partition can
    receive them at run time)."""
    tensors = [L.materialize(t) for t in args[0]]
    fake = _val(node)
    dim = (args[1] if len(args) > 1 else kwargs.get("dim", 0)) % fake.dim()
    out = L.new_tensor(fake.dtype, fake.shape)
    strides = list(L.spec(out).strides)
    for i, t in enumerate(tensors):
        if L.spec(t).dtype != fake.dtype:
            raise Unsupported("dtype", "aten::stack of mixed dtypes; stays on the kernels")
        L.copy(t, out, i * strides[dim], strides[:dim] + strides[dim + 1:])
    return ("t", out)


def lower_to_copy(L, node, args, kwargs):
    fake = _val(node)
    src = L.materialize(args[0])
    if fake.dtype not in GENERIC_DTYPES or L.spec(src).dtype not in GENERIC_DTYPES:
        half = {torch.float16, torch.bfloat16} & {fake.dtype, L.spec(src).dtype}
        raise Unsupported("dtype", f"aten::_to_copy from {L.spec(src).dtype} to {fake.dtype}"
                          + (": the engine reads float16/bfloat16 only in a KV cache's write "
                             "and its attention op" if half else "") + "; stays on the kernels")
    out = L.new_tensor(fake.dtype, fake.shape)
    L.copy(src, out)
    return ("t", out)


VIEW_OPS = ["aten::view", "aten::_unsafe_view", "aten::reshape", "aten::permute", "aten::expand",
            "aten::squeeze", "aten::unsqueeze", "aten::select", "aten::slice", "aten::alias",
            "aten::clone", "aten::t", "aten::transpose", "aten::split_with_sizes", "aten::split",
            "aten::unbind", "aten::narrow", "aten::diagonal", "aten::unfold", "aten::as_strided",
            "aten::detach", "aten::view_copy", "aten::permute_copy", "aten::expand_copy",
            "aten::squeeze_copy", "aten::unsqueeze_copy", "aten::select_copy", "aten::slice_copy",
            "aten::alias_copy", "aten::split_with_sizes_copy", "aten::split_copy", "aten::t_copy",
            "aten::transpose_copy", "aten::unbind_copy", "aten::lift_fresh_copy", "aten::contiguous"]



def lower_constant_pad(L: Lowering, node, args, kwargs):
    """constant_pad_nd: fill the output's padding with the value (the whole output when
    sizes are symbolic), then copy the input's overlap into it (negative padding crops)."""
    x, pad = args[0], list(args[1])
    value = args[2] if len(args) > 2 else kwargs.get("value", 0)
    fake = _val(node)
    if fake.dtype not in GENERIC_DTYPES or not isinstance(value, (int, float, bool)):
        raise Unsupported("dtype", f"aten::constant_pad_nd on {fake.dtype}; stays on the kernels")
    src = L.materialize(x)
    s = L.spec(src)
    if all(type(p) is int and p == 0 for p in pad) and L.spec(src).dtype == fake.dtype:
        # torchvision's Swin pads every block's input to whole windows, by 0 when they fit:
        # the input itself (a fill and a copy of the feature map per block before)
        return ("t", src)
    out = L.new_tensor(fake.dtype, fake.shape)
    o = L.spec(out)
    dims = L.shape(fake)
    lengths, src_off, dst_off, borders, empty = [], 0, 0, [], False
    for k in range(len(s.dims)):
        j = len(s.dims) - 1 - k  # pad pairs run from the last dim backwards
        before, after = (pad[2 * j], pad[2 * j + 1]) if 2 * j + 1 < len(pad) else (0, 0)
        start_src, start_dst = max(0, -before), max(0, before)
        length = s.dims[k] - start_src - max(0, -after)
        empty = empty or length <= 0
        lengths.append(length)
        src_off += start_src * s.strides[k]
        dst_off += start_dst * o.strides[k]
        borders += [(k, 0, before)] if before > 0 else []
        borders += [(k, dims[k] - after, after)] if after > 0 else []
    if borders and (empty or not all(type(v) is int for v in (*dims, *o.strides))):
        borders = [(0, 0, dims[0])]  # all of it (nothing of the input left, or symbolic sizes)
    for k, start, size in borders:
        # only the padding is filled (CoaT pads one row before its tokens: the whole tensor
        # filled, then all but that row copied over, before); at most 2 per dim, overlapping
        # at corners (the value written twice)
        region = [*dims[:k], size, *dims[k + 1:]]
        target = L.alias(out, region, o.strides, start * o.strides[k])
        L.op("ew", [], [target], [EW["fill"], 0, len(region), *region, *o.strides],
             [1.0, float(value)], name="fill")
    if empty:
        return ("t", out)
    L.op("copy", [src], [out], [len(lengths), *lengths, *s.strides, src_off, *o.strides, dst_off],
         name="pad")
    return ("t", out)


def lower_index_select(L: Lowering, node, args, kwargs):
    """index_select along dim 0: a row gather (the engine's embedding loop, indices checked
    at run time)."""
    x, dim, index = args[:3]
    fake = _val(node)
    if isinstance(index, tuple) and index[0] == "c" and index[1].dim() <= 1:
        runs = _runs(index[1].reshape(-1).tolist())
        if runs is not None and len(runs) <= 16:  # e.g. torch.roll: two runs
            return _select_runs(L, node, L.materialize(x), dim, runs)
    src = L.contiguous(L.materialize(x))
    s = L.spec(src)
    if dim % max(len(s.dims), 1) != 0 or s.dtype != torch.float32 or len(s.dims) < 1:
        raise Unsupported("op", "aten::index_select other than float32 rows (dim 0); stays on the kernels")
    ix = L.contiguous(L.materialize(index))
    if L.spec(ix).dtype not in (torch.int64, torch.int32):
        raise Unsupported("dtype", "aten::index_select with non-integer indices")
    inner = math.prod(s.dims[1:]) if len(s.dims) > 1 else 1
    rows = L.alias(src, (s.dims[0], inner), (inner, 1))
    out = L.new_tensor(fake.dtype, fake.shape)
    n = math.prod(L.spec(ix).dims) if L.spec(ix).dims else 1
    flat_out = L.alias(out, (n, inner), (inner, 1))
    L.op("embedding", [rows, ix], [flat_out], name="index_select")
    return ("t", out)


def _runs(indices: list[int]) -> list[tuple[int, int]] | None:
    """Constant indices as (start, length) runs of consecutive values."""
    runs: list[list[int]] = []
    for i in indices:
        if runs and i == runs[-1][0] + runs[-1][1]:
            runs[-1][1] += 1
        else:
            runs.append([i, 1])
    return [tuple(r) for r in runs]


def _select_runs(L: Lowering, node, src: int, dim: int, runs) -> Any:
    """index_select with constant indices in a few runs: one strided copy per run."""
    fake = _val(node)
    s = L.spec(src)
    dim %= max(len(s.dims), 1)
    if any(start < 0 or start + n > s.dims[dim] for start, n in runs):
        raise Unsupported("shape", "aten::index_select with an index out of range")
    out = L.new_tensor(fake.dtype, fake.shape)
    o = L.spec(out)
    position = 0
    for start, n in runs:
        dims = list(s.dims)
        dims[dim] = n
        L.op("copy", [src], [out], [len(dims), *dims, *s.strides, start * s.strides[dim],
                                    *o.strides, position * o.strides[dim]], name="index_select")
        position += n
    return ("t", out)


LOWERINGS.update({k: lower_view for k in VIEW_OPS})
LOWERINGS["aten::cat"] = lower_cat
LOWERINGS["aten::stack"] = lower_stack
LOWERINGS["aten::_to_copy"] = lower_to_copy
LOWERINGS["aten::constant_pad_nd"] = lower_constant_pad
LOWERINGS["aten::index_select"] = lower_index_select
SYMBOLIC_SIZES.update({lower_view, lower_cat, lower_to_copy})
