"""sum, mean, amax, amin, any, all: oneDNN's reduction in float32, the engine's loop otherwise.
"""

from __future__ import annotations

import math

import torch
import torch.fx

from opforge.backends.partition import op_name
from opforge.backends.cpu.lowering.core import (
    SYMBOLIC_SIZES, B_ADD,
    GENERIC_DTYPES, LOWERINGS, Lowering, Unsupported, _dense, _dense_operand, _val, channels_last,
    row_major,
)
from opforge.backends.cpu.lowering.pooling import _pool_dst_strides


REDUCE_F32 = ("aten::sum", "aten::mean", "aten::amax", "aten::amin")
REDUCE = {"aten::sum": 0, "aten::mean": 1, "aten::amax": 2, "aten::amin": 3, "aten::any": 4, "aten::all": 5}


def lower_reduce(L: Lowering, node, args, kwargs):
    name = op_name(node).split(".")[0]
    fake = _val(node)
    src = L.materialize(args[0])
    spec = L.spec(src)
    rank = len(spec.dims)
    dims = args[1] if len(args) > 1 else kwargs.get("dim")
    if isinstance(dims, int):
        dims = [dims]
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        dims = list(range(rank))
    dims = sorted({d % max(rank, 1) for d in dims})
    if kwargs.get("dtype") is not None or (len(args) > 3 and args[3] is not None and name in ("aten::sum", "aten::mean")):
        raise Unsupported("dtype", f"{name} with a dtype argument; stays on the kernels")
    kept = tuple(1 if k in dims else d for k, d in enumerate(spec.dims))
    count = math.prod(spec.dims[k] for k in dims) if dims else 1
    if (spec.dtype == torch.float32 and fake.dtype == torch.float32 and name == "aten::mean"
            and rank in (3, 4, 5) and dims == list(range(2, rank)) and _dense(spec)):
        # a global average pool: oneDNN's pooling runs it fast in any layout
        out = L.new_tensor(torch.float32, kept, strides=_pool_dst_strides(spec, kept))
        nsp = rank - 2
        window = list(spec.dims[2:])
        L.op("pool", [src], [out], [1, nsp, *window, *window, *([0] * nsp), *([0] * nsp), *([1] * nsp)],
             name="mean")
    elif spec.dtype == torch.float32 and fake.dtype == torch.float32 and name == "aten::mean" \
            and _middle_block(spec, dims) is not None:
        # a mean over middle dims (timm LeViT's over the tokens of [1, 16, 384]): oneDNN's
        # reduction over a dim that is not innermost is its reference kernel; the same
        # numbers as [outer, inner (channels, stride 1), reduced (spatial)] are a global
        # average pool, which it runs in its jit kernel
        outer, reduced, inner = _middle_block(spec, dims)
        view = L.alias(L.contiguous(src), (outer, inner, reduced), (reduced * inner, 1, inner))
        out = L.new_tensor(torch.float32, (outer, inner, 1), strides=channels_last((outer, inner, 1)))
        L.op("pool", [view], [out], [1, 1, reduced, reduced, 0, 0, 1], name="mean")
        result = L.shape(fake)  # the pool's result is [outer, inner] row-major, as kept is
        return ("t", L.alias(out, result, row_major(result)))
    elif spec.dtype == torch.float32 and fake.dtype == torch.float32 and name == "aten::sum" \
            and _few_slices(spec, dims) is not None:
        # a sum over a few slices of a middle dim (timm SKNet's selective kernel: the sum of
        # its 2 paths, [1, 2, C, H, W] over dim 1): oneDNN's reduction over a dim that is not
        # innermost is its reference kernel (skresnet18: 2x slower than eager); the slices,
        # each dense, added by one binary op and its post-ops, in order, as ATen adds them
        reduced, inner = _few_slices(spec, dims)
        flat = L.contiguous(src)
        parts = [L.alias(flat, (inner,), (1,), k * inner) for k in range(reduced)]
        out = L.new_tensor(torch.float32, kept)
        L.op("binary", parts[:2], [L.alias(out, (inner,), (1,))], [B_ADD], name="sum of slices",
             post=[[1, B_ADD, 0.0, 0.0, part] for part in parts[2:]])
    elif spec.dtype == torch.float32 and fake.dtype == torch.float32 and name in REDUCE_F32 \
            and rank >= 2 and rank - 1 not in dims and type(count) is int and 1 < count <= 8:
        # a few elements reduced over dims that are not innermost, the dims before them
        # counted at run time (the MoE decoders' sum of the top-k experts' outputs,
        # [tokens, 2, hidden] over dim 1): oneDNN's reduction over a dim that is not innermost
        # is its reference kernel; a copy with the reduced dims moved innermost reduces on
        # its jit kernel (the permuted kept shape has kept's row-major numbers)
        order = [k for k in range(rank) if k not in dims] + dims
        moved = L.contiguous(L.alias(src, tuple(spec.dims[k] for k in order),
                                     tuple(spec.strides[k] for k in order)))
        reduced_out = L.new_tensor(torch.float32, tuple(kept[k] for k in order))
        L.op("reduction", [moved], [reduced_out], [REDUCE[name]], name=name.split("::")[1])
        out = L.alias(reduced_out, kept, row_major(kept))
    elif spec.dtype == torch.float32 and fake.dtype == torch.float32 and name in REDUCE_F32 and count > 0:
        src = _dense_operand(L, src)
        out = L.new_tensor(torch.float32, kept)
        L.op("reduction", [src], [out], [REDUCE[name]], name=name.split("::")[1])
    else:
        if fake.dtype not in GENERIC_DTYPES or spec.dtype not in GENERIC_DTYPES:
            raise Unsupported("dtype", f"{name} on {spec.dtype}")
        out = L.new_tensor(fake.dtype, kept)
        out_strides = [0 if k in dims else s for k, s in enumerate(row_major(kept))]
        L.op("reduce", [src], [out], [REDUCE[name], rank, *spec.dims, *spec.strides, *out_strides, max(count, 1)],
             name=name.split("::")[1])
    result = L.shape(fake)
    if result != kept:
        return ("t", L.alias(out, result, row_major(result)))
    return ("t", out)


def _middle_block(spec, dims: list[int]) -> tuple[int, int, int] | None:
    """(outer, reduced, inner) element counts when ``dims`` are one run of neighbouring dims
    with more than one element after them (static sizes), else None."""
    sizes = (*spec.dims, *spec.strides)
    if not dims or any(type(v) is not int for v in sizes) or dims != list(range(dims[0], dims[-1] + 1)):
        return None
    outer = math.prod(spec.dims[:dims[0]])
    reduced = math.prod(spec.dims[k] for k in dims)
    inner = math.prod(spec.dims[dims[-1] + 1:])
    return (outer, reduced, inner) if inner > 1 and reduced > 1 else None


def _few_slices(spec, dims: list[int]) -> tuple[int, int] | None:
    """(reduced, inner) when ``dims`` are one run of middle dims with nothing before them but
    dims of size 1, 2 to 8 elements reduced and more than one after (static sizes), else None."""
    block = _middle_block(spec, dims)
    if block is None:
        return None
    outer, reduced, inner = block
    return (reduced, inner) if outer == 1 and reduced <= 8 else None


LOWERINGS["aten::sum"] = lower_reduce
LOWERINGS["aten::mean"] = lower_reduce
LOWERINGS["aten::amax"] = lower_reduce
LOWERINGS["aten::amin"] = lower_reduce
LOWERINGS["aten::any"] = lower_reduce
LOWERINGS["aten::all"] = lower_reduce
SYMBOLIC_SIZES.add(lower_reduce)
