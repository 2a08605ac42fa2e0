"""Convolution (1d, 2d, 3d; strided, padded, dilated, grouped) by im2col + matmul.

The input is padded once, its sliding windows are taken as a strided *view*
(``sliding_window_view`` then a stride/dilation slice, no copy), gathered into one column
matrix per group, and multiplied with the weights by a single batched ``np.matmul`` (BLAS).
Depthwise convolution (groups == channels) is the same computation with one input channel
per group. Transposed convolution is the adjoint: a matmul from the input to columns,
then an overlap-add of the columns into the (padded) output, one kernel tap at a time.

Bound (see ``_binding``; float32/float64, not transposed), the layout work moves to load:
a zero-bordered input buffer whose border is written once (each call copies only the
interior), its sliding windows as a fixed view, and the column buffer. A call is then
1×1 stride-1 unpadded: one ``np.matmul(w, x, out)`` (no columns at all);
depthwise (groups == channels, one filter each): a multiply-accumulate over the kernel
taps, each tap a strided view — for 9 taps much cheaper than building columns;
otherwise: one copy into the columns, laid out (N, G, taps, positions) so that
``np.matmul(w, columns, out)`` writes the (N, C_out, positions) result straight into out.

Stride, padding and dilation come from the program file: the kernel and its binder check
them against the output's shape and the workspace they imply against the memory limit
before allocating anything (``_workspace``).
"""

from __future__ import annotations

import numpy as np

from opforge.errors import KernelError
from opforge.kernels.portable._binding import separate, steps
from opforge.kernels.portable._promotion import accumulate_dtype
from opforge.kernels.portable._registry import Kernel, binder_for, kernel_decorator
from opforge.kernels.portable._workspace import (
    check_convolution, check_workspace, convolution_workspace,
)

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
    _check(api, x, weight, stride, padding, dilation, transposed, output_padding, groups,
           out.shape if batched else (1,) + out.shape, ct.itemsize)
    if transposed:
        y = _transposed(x, weight, stride, padding, dilation, output_padding, groups, ct)
    else:
        y = _convolution(x, weight, stride, padding, dilation, groups, ct)
    if bias is not None:
        y = y + bias.astype(ct, copy=False).reshape((1, -1) + (1,) * spatial)
    np.copyto(out, y.reshape(out.shape), casting="unsafe")


def _check(api, x, weight, stride, padding, dilation, transposed, output_padding, groups,
           out_shape, itemsize) -> None:
    """Geometry, then workspace size (see ``_workspace``), before anything is allocated."""
    check_convolution(api, x.shape, weight.shape, stride, padding, dilation, transposed,
                      output_padding, groups, out_shape)
    nbytes = convolution_workspace(x.shape, weight.shape, stride, padding, dilation,
                                   transposed, output_padding, groups, out_shape, itemsize)
    check_workspace(api, f"workspace for input {x.shape}, weight {weight.shape}, "
                    f"stride={stride}, padding={padding}, dilation={dilation}", nbytes)


# --- bind-time fast paths -------------------------------------------------------------------

def _padded_source(x: np.ndarray, padding, spatial: int) -> tuple[np.ndarray, list]:
    """``x`` itself, or a zero-bordered buffer (allocated here) and the step filling it."""
    if not any(padding):
        return x, []
    buffer = np.zeros(x.shape[:2] + tuple(n + 2 * p for n, p in zip(x.shape[2:], padding)),
                      x.dtype)
    interior = buffer[(slice(None), slice(None)) + tuple(
        slice(p, p + n) for n, p in zip(x.shape[2:], padding))]
    return buffer, [(np.copyto, (interior, x))]


@binder_for(convolution_out)
def _bind_convolution(args):
    (input, weight, bias, stride, padding, dilation, transposed, output_padding, groups,
     out) = args
    dtype = out.dtype
    if input.ndim == weight.ndim and input.ndim >= 3 and out.ndim == input.ndim:
        # refuse a hostile geometry at bind (load), not at the first call
        spatial = input.ndim - 2
        params = [expand_param(v, spatial, name, "aten::convolution.out") for v, name in (
            (stride, "stride"), (padding, "padding"), (dilation, "dilation"),
            (output_padding if transposed else (0,), "output_padding"))]
        _check("aten::convolution.out", input, weight, *params[:3], transposed, params[3],
               groups, out.shape, accumulate_dtype(dtype).itemsize)
    if transposed or input.ndim != weight.ndim or input.ndim < 3 or \
            dtype not in (np.float32, np.float64) or input.dtype != dtype or \
            weight.dtype != dtype or (bias is not None and bias.dtype != dtype) or \
            not weight.flags.c_contiguous or not separate([out], input, weight, bias):
        return convolution_out, args
    api = "aten::convolution.out"
    spatial = input.ndim - 2
    stride = expand_param(stride, spatial, "stride", api)
    padding = expand_param(padding, spatial, "padding", api)
    dilation = expand_param(dilation, spatial, "dilation", api)
    n, c = input.shape[:2]
    out_c, c_per_group = weight.shape[:2]
    kernel_size = weight.shape[2:]
    out_spatial = out.shape[2:]
    positions = int(np.prod(out_spatial))
    bias_steps = [] if bias is None else [
        (np.add, (out, bias.reshape((1, -1) + (1,) * spatial), out))]

    if groups == 1 and all(k == 1 for k in kernel_size) and not any(padding) and \
            all(s == 1 for s in stride) and input.flags.c_contiguous:
        x, y = input.reshape(n, c, positions), out.reshape(n, out_c, positions)
        return steps([(np.matmul, (weight.reshape(out_c, c), x, y))] + bias_steps)

    source, pairs = _padded_source(input, padding, spatial)
    reach = [d * (k - 1) + 1 for k, d in zip(kernel_size, dilation)]
    windows = np.lib.stride_tricks.sliding_window_view(
        source, reach, axis=tuple(range(2, 2 + spatial)))
    windows = windows[(slice(None), slice(None)) + tuple(slice(None, None, s) for s in stride)
                      + tuple(slice(None, None, d) for d in dilation)]
    if windows.shape[2:2 + spatial] != out_spatial:
        return convolution_out, args

    if groups == c and c_per_group == 1 and out_c == c:
        # Depthwise: out[:, ch] = sum over taps of w[ch, tap] * window_tap[:, ch].
        scratch = np.empty(out.shape, dtype)
        taps = list(np.ndindex(*kernel_size))
        for i, tap in enumerate(taps):
            view = windows[(Ellipsis,) + tap]
            w = weight[(slice(None), 0) + tap].reshape((1, c) + (1,) * spatial)
            if i == 0:
                pairs.append((np.multiply, (view, w, out)))
            else:
                pairs += [(np.multiply, (view, w, scratch)), (np.add, (out, scratch, out))]
        return steps(pairs + bias_steps)

    taps = c_per_group * int(np.prod(kernel_size))
    columns = np.empty((n, groups, taps, positions), dtype)
    grouped = windows.reshape((n, groups, c_per_group) + out_spatial + tuple(kernel_size))
    order = (0, 1, 2) + tuple(range(3 + spatial, 3 + 2 * spatial)) + tuple(range(3, 3 + spatial))
    pairs.append((np.copyto, (columns.reshape(grouped.transpose(order).shape),
                              grouped.transpose(order))))
    w = weight.reshape(groups, out_c // groups, taps)
    y = out.reshape(n, groups, out_c // groups, positions)
    pairs.append((np.matmul, (w, columns, y)))
    return steps(pairs + bias_steps)
