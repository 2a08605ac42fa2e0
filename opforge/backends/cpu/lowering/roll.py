"""aten::roll as block copies.

torchvision's Swin shifts its feature map by half a window before each shifted block's
attention and back after it (``torch.roll(x, shifts=(-3, -3), dims=(1, 2))`` on
[B, H, W, C]). No strided view says a roll, and the cpu backend had no lowering for it, so
each roll stayed on the portable kernels and cut the model into 11 delegates (10 rolls in
swin_t). A roll over k dims is 2^k block copies: along each rolled dim of size n with shift
s (taken modulo n), source [0, n - s) goes to [s, n) and source [n - s, n) to [0, s); the
other dims are copied whole. Each copy reads and writes runs of the innermost dims, so a
roll costs what a copy of the tensor costs. Sizes must be static (a symbolic size would
need the blocks per call); a roll without ``dims`` (of the flattened tensor) stays on the
kernels.
"""

from __future__ import annotations

import itertools

from opforge.backends.cpu.lowering.core import LOWERINGS, Lowering, Unsupported, _val


def _segments(n: int, shift: int) -> list[tuple[int, int, int]]:
    """(source start, destination start, length) of the blocks of one dim of size ``n``
    rolled by ``shift``."""
    s = shift % n if n else 0
    return [(0, 0, n)] if s == 0 else [(0, s, n - s), (n - s, 0, s)]


def lower_roll(L: Lowering, node, args, kwargs):
    fake = _val(node)
    src = L.materialize(args[0])
    spec = L.spec(src)
    shifts = args[1] if len(args) > 1 else kwargs.get("shifts")
    dims = args[2] if len(args) > 2 else kwargs.get("dims", [])
    shifts = [shifts] if isinstance(shifts, int) else list(shifts)
    dims = [dims] if isinstance(dims, int) else list(dims)
    rank = len(spec.dims)
    if not dims or len(dims) != len(shifts) or rank == 0:
        raise Unsupported("op", "aten::roll without dims (of the flattened tensor); stays on the kernels")
    if any(type(v) is not int for v in (*spec.dims, *spec.strides, spec.offset, *shifts)):
        raise Unsupported("shape", "aten::roll with symbolic sizes or shifts; stays on the kernels")
    total = [0] * rank
    for d, s in zip(dims, shifts):
        total[d % rank] += s  # a dim named twice rolls by the sum, as torch does
    out = L.new_tensor(fake.dtype, fake.shape)
    out_strides = L.spec(out).strides
    for blocks in itertools.product(*(_segments(n, s) for n, s in zip(spec.dims, total))):
        sizes = tuple(length for _, _, length in blocks)
        if 0 in sizes:
            continue
        source = L.alias(src, sizes, spec.strides, sum(a * st for (a, _, _), st in zip(blocks, spec.strides)))
        L.copy(source, out, sum(b * st for (_, b, _), st in zip(blocks, out_strides)), out_strides)
    return ("t", out)


LOWERINGS["aten::roll"] = lower_roll
