"""Convolution (1d, 2d, 3d; strided, padded, dilated, grouped) by im2col + matmul.

The input is padded once, its sliding windows are taken as a strided *view*
(``sliding_window_view`` then a stride/dilation slice, no copy), gathered into one column
matrix per group, and multiplied with the weights by a single batched ``np.matmul`` (BLAS).
Depthwise convolution (groups == channels) is the same computation with one input channel
per group. Transposed convolution is the adjoint: a matmul from the input to columns,
then an overlap-add of the columns into the (padded) output, one kernel tap at a time.
"""

from __future__ import annotations

import numpy as np

from opforge.errors import KernelError
from opforge.kernels.portable._promotion import accumulate_dtype
from opforge.kernels.portable._registry import Kernel, kernel_decorator

__all__ = ["KERNELS", "expand_param"]

KERNELS: dict[str, Kernel] = {}
kernel = kernel_decorator(KERNELS)


def expand_param(value, spatial: int, name: str, api: str) -> tuple[int, ...]:
    """An ``int[n]`` argument: a 1-tuple broadcasts over the spatial dims, as in ATen."""
    value = tuple(int(v) for v in ((value,) if isinstance(value, int) else value))
    if len(value) == 1:
        return value * spatial
    if len(value) != spatial:
        raise KernelError(
            f"`{api}`: {name}={value} — has {len(value)} entries for {spatial} spatial dims — "
            f"valid: 1 or {spatial} entries — pass one value per spatial dimension"
        )
    return value


def _convolution(x, weight, stride, padding, dilation, groups, ct) -> np.ndarray:
    n, c = x.shape[:2]
    spatial = x.ndim - 2
    out_c, c_per_group = weight.shape[:2]
    kernel_size = weight.shape[2:]
    xp = np.pad(x.astype(ct, copy=False), [(0, 0), (0, 0)] + [(p, p) for p in padding])
    reach = [d * (k - 1) + 1 for k, d in zip(kernel_size, dilation)]
    windows = np.lib.stride_tricks.sliding_window_view(
        xp, reach, axis=tuple(range(2, 2 + spatial))
    )
    pick = (slice(None), slice(None))
    pick += tuple(slice(None, None, s) for s in stride)
    pick += tuple(slice(None, None, d) for d in dilation)
    windows = windows[pick]  # (N, C, *out_spatial, *kernel_size), still a view
    out_spatial = windows.shape[2:2 + spatial]
    positions = int(np.prod(out_spatial))
    taps = c_per_group * int(np.prod(kernel_size))
    windows = windows.reshape((n, groups, c_per_group) + out_spatial + tuple(kernel_size))
    order = (0, 1) + tuple(range(3, 3 + spatial)) + (2,) + tuple(range(3 + spatial, 3 + 2 * spatial))
    columns = windows.transpose(order).reshape(n, groups, positions, taps)  # the one copy
    w = weight.astype(ct, copy=False).reshape(groups, out_c // groups, taps)
    result = np.matmul(columns, w.transpose(0, 2, 1))  # (N, G, positions, out_c / G)
    return result.transpose(0, 1, 3, 2).reshape((n, out_c) + out_spatial)


def _transposed(x, weight, stride, padding, dilation, output_padding, groups, ct):
    n, c = x.shape[:2]
    # The transposed weight is (C_in, C_out / groups, *kernel_size).
    c_per_group, out_per_group = weight.shape[0] // groups, weight.shape[1]
    kernel_size = weight.shape[2:]
    in_spatial = x.shape[2:]
    full = [(i - 1) * s + d * (k - 1) + 1 + op
            for i, s, d, k, op in zip(in_spatial, stride, dilation, kernel_size, output_padding)]
    taps = int(np.prod(kernel_size))
    xg = x.astype(ct, copy=False).reshape((n, groups, c_per_group, -1))
    w = weight.astype(ct, copy=False).reshape(groups, c_per_group, out_per_group * taps)
    columns = np.matmul(w.transpose(0, 2, 1)[None], xg)  # (N, G, out/G * taps, positions)
    columns = columns.reshape((n, groups * out_per_group, taps) + tuple(in_spatial))
    canvas = np.zeros((n, groups * out_per_group) + tuple(full), dtype=ct)
    # Overlap-add: one strided slice assignment per kernel tap (a loop over the taps only).
    for tap, offsets in enumerate(np.ndindex(*kernel_size)):
        target = (slice(None), slice(None)) + tuple(
            slice(o * d, o * d + (i - 1) * s + 1, s)
            for o, d, i, s in zip(offsets, dilation, in_spatial, stride)
        )
        canvas[target] += columns[:, :, tap]
    crop = (slice(None), slice(None)) + tuple(slice(p, f - p) for p, f in zip(padding, full))
    return canvas[crop]


@kernel("aten::convolution.out")
def convolution_out(input, weight, bias, stride, padding, dilation, transposed,
                    output_padding, groups, out):
    api = "aten::convolution.out"
    batched = input.ndim == weight.ndim
    x = input if batched else input[None]
    spatial = x.ndim - 2
    stride = expand_param(stride, spatial, "stride", api)
    padding = expand_param(padding, spatial, "padding", api)
    dilation = expand_param(dilation, spatial, "dilation", api)
    ct = accumulate_dtype(out.dtype)
    if transposed:
        output_padding = expand_param(output_padding, spatial, "output_padding", api)
        y = _transposed(x, weight, stride, padding, dilation, output_padding, groups, ct)
    else:
        y = _convolution(x, weight, stride, padding, dilation, groups, ct)
    if bias is not None:
        y = y + bias.astype(ct, copy=False).reshape((1, -1) + (1,) * spatial)
    np.copyto(out, y.reshape(out.shape), casting="unsafe")
