"""2-d pooling: max pool with indices, average pool, adaptive average pool.

Windows are strided views of the padded input (``sliding_window_view``), reduced along the
window axes in one NumPy call. Output sizes follow ATen's ``pooling_output_shape``: with
``ceil_mode`` the last window may hang over the right edge, but must start inside the
input or its left padding. Inputs are (N, C, H, W) or (C, H, W).

Bound max pooling (see ``_binding``) scans the kernel taps instead of reducing windows:
each tap is a fixed strided view of the input (or of a ``fill``-bordered buffer whose
border is written once), and a tap replaces the running maximum and its index where it is
greater or NaN — ATen's CPU rule (``val > max || isnan(val)``): the first maximum wins
ties, and the *last* NaN of a window gives the index (the general kernel's argmax reports
the first; the values agree). The flat input index of every tap is precomputed.
"""

from __future__ import annotations

import numpy as np

from opforge.kernels.portable._binding import separate, steps
from opforge.kernels.portable._promotion import accumulate_dtype, is_floating
from opforge.kernels.portable._registry import Kernel, binder_for, kernel_decorator
from opforge.kernels.portable.convolution import expand_param

__all__ = ["KERNELS"]

KERNELS: dict[str, Kernel] = {}
kernel = kernel_decorator(KERNELS)


def _output_size(size: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    span = size + 2 * p - d * (k - 1) - 1
    n = (span + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (n - 1) * s >= size + p:
        n -= 1
    return n


def _windows(x: np.ndarray, k, s, p, d, out_hw, fill) -> np.ndarray:
    """(…, OH, OW, KH*KW) windows of ``x`` padded with ``fill`` (room for ceil_mode)."""
    pads = []
    for axis in range(2):
        need = (out_hw[axis] - 1) * s[axis] + d[axis] * (k[axis] - 1) + 1
        right = max(need - x.shape[-2 + axis] - p[axis], p[axis])
        pads.append((p[axis], right))
    xp = np.pad(x, [(0, 0)] * (x.ndim - 2) + pads, constant_values=fill)
    reach = (d[0] * (k[0] - 1) + 1, d[1] * (k[1] - 1) + 1)
    w = np.lib.stride_tricks.sliding_window_view(xp, reach, axis=(-2, -1))
    w = w[..., : (out_hw[0] - 1) * s[0] + 1: s[0], : (out_hw[1] - 1) * s[1] + 1: s[1],
          :: d[0], :: d[1]]
    return w.reshape(w.shape[:-2] + (k[0] * k[1],))


def _params(kernel_size, stride, padding, dilation, api):
    k = expand_param(kernel_size, 2, "kernel_size", api)
    s = expand_param(stride, 2, "stride", api) if len(stride) else k
    p = expand_param(padding, 2, "padding", api)
    d = expand_param(dilation, 2, "dilation", api)
    return k, s, p, d


@kernel("aten::max_pool2d_with_indices.out")
def max_pool2d_with_indices_out(self, kernel_size, stride, padding, dilation, ceil_mode,
                                out, indices):
    k, s, p, d = _params(kernel_size, stride, padding, dilation,
                         "aten::max_pool2d_with_indices.out")
    h, w = self.shape[-2:]
    out_hw = tuple(_output_size(n, *a, ceil_mode) for n, a in zip((h, w), zip(k, s, p, d)))
    fill = -np.inf if is_floating(self.dtype) else np.iinfo(self.dtype).min
    windows = _windows(self, k, s, p, d, out_hw, fill)
    local = np.argmax(windows, axis=-1)  # first maximum wins ties, as in ATen
    np.copyto(out, np.take_along_axis(windows, local[..., None], axis=-1)[..., 0],
              casting="unsafe")
    # Indices are flat offsets into the input's H*W plane.
    oh = np.arange(out_hw[0])[:, None]
    ow = np.arange(out_hw[1])[None, :]
    row = oh * s[0] - p[0] + (local // k[1]) * d[0]
    col = ow * s[1] - p[1] + (local % k[1]) * d[1]
    np.copyto(indices, row * w + col, casting="unsafe")


@kernel("aten::avg_pool2d.out")
def avg_pool2d_out(self, kernel_size, stride, padding, ceil_mode, count_include_pad,
                   divisor_override, out):
    k, s, p, _ = _params(kernel_size, stride, padding, (1,), "aten::avg_pool2d.out")
    h, w = self.shape[-2:]
    out_hw = tuple(_output_size(n, *a, 1, ceil_mode) for n, a in zip((h, w), zip(k, s, p)))
    ct = accumulate_dtype(out.dtype)
    windows = _windows(self.astype(ct, copy=False), k, s, p, (1, 1), out_hw, 0)
    total = windows.sum(axis=-1)
    if divisor_override:
        divisor = divisor_override
    else:
        counts = []
        for axis, n in enumerate((h, w)):
            start = np.arange(out_hw[axis]) * s[axis] - p[axis]
            end = np.minimum(start + k[axis], n + p[axis])  # padded extent of the window
            if count_include_pad:
                counts.append(end - start)
            else:
                counts.append(np.minimum(end, n) - np.maximum(start, 0))
        divisor = counts[0][:, None] * counts[1][None, :]
    np.copyto(out, total / divisor if is_floating(ct) else total // divisor, casting="unsafe")


def _adaptive_bounds(size: int, out_size: int) -> tuple[np.ndarray, np.ndarray]:
    i = np.arange(out_size)
    return (i * size) // out_size, -((-(i + 1) * size) // out_size)  # floor, ceil


@kernel("aten::_adaptive_avg_pool2d.out")
def adaptive_avg_pool2d_out(self, output_size, out):
    oh, ow = expand_param(output_size, 2, "output_size", "aten::_adaptive_avg_pool2d.out")
    h, w = self.shape[-2:]
    ct = accumulate_dtype(out.dtype)
    x = self.astype(ct, copy=False)
    if h % oh == 0 and w % ow == 0:
        # Equal, non-overlapping bins (the common case, e.g. global pooling): exact means.
        bins = x.reshape(x.shape[:-2] + (oh, h // oh, ow, w // ow))
        np.copyto(out, bins.mean(axis=(-3, -1)), casting="unsafe")
        return
    # General bins by prefix sums in float64: sum[a:b] = S[b] - S[a].
    prefix = np.zeros(x.shape[:-2] + (h + 1, w + 1), dtype=np.float64)
    np.cumsum(np.cumsum(x, axis=-2, dtype=np.float64), axis=-1, out=prefix[..., 1:, 1:])
    r0, r1 = _adaptive_bounds(h, oh)
    c0, c1 = _adaptive_bounds(w, ow)
    r0, r1, c0, c1 = r0[:, None], r1[:, None], c0[None, :], c1[None, :]
    sums = prefix[..., r1, c1] - prefix[..., r0, c1] - prefix[..., r1, c0] + prefix[..., r0, c0]
    np.copyto(out, sums / ((r1 - r0) * (c1 - c0)), casting="unsafe")


# --- bind-time fast paths -------------------------------------------------------------------

def _copy_where(dst: np.ndarray, src: np.ndarray, where: np.ndarray) -> None:
    np.copyto(dst, src, where=where)


@binder_for(max_pool2d_with_indices_out)
def _bind_max_pool2d(args):
    self, kernel_size, stride, padding, dilation, ceil_mode, out, indices = args
    if self.ndim not in (3, 4) or out.dtype != self.dtype or indices.dtype != np.int64 or \
            self.size == 0 or not separate([out, indices], self):
        return max_pool2d_with_indices_out, args
    k, s, p, d = _params(kernel_size, stride, padding, dilation,
                         "aten::max_pool2d_with_indices.out")
    h, w = self.shape[-2:]
    out_hw = tuple(_output_size(n, *a, ceil_mode) for n, a in zip((h, w), zip(k, s, p, d)))
    if out.shape[-2:] != out_hw:
        return max_pool2d_with_indices_out, args
    floating = is_floating(self.dtype)
    pads = []
    for axis in range(2):
        need = (out_hw[axis] - 1) * s[axis] + d[axis] * (k[axis] - 1) + 1
        pads.append((p[axis], max(need - self.shape[-2 + axis] - p[axis], p[axis])))
    pairs = []
    source = self
    if any(lo or hi for lo, hi in pads):
        fill = -np.inf if floating else np.iinfo(self.dtype).min
        source = np.full(self.shape[:-2] + (h + sum(pads[0]), w + sum(pads[1])), fill,
                         self.dtype)
        pairs.append((np.copyto, (source[..., p[0]:p[0] + h, p[1]:p[1] + w], self)))
    oh = np.arange(out_hw[0])[:, None] * s[0] - p[0]
    ow = np.arange(out_hw[1])[None, :] * s[1] - p[1]
    better = np.empty(out.shape, np.bool_)
    nan = np.empty(out.shape, np.bool_)
    for i in range(k[0]):
        for j in range(k[1]):
            r0, c0 = i * d[0], j * d[1]
            tap = source[..., r0: r0 + (out_hw[0] - 1) * s[0] + 1: s[0],
                         c0: c0 + (out_hw[1] - 1) * s[1] + 1: s[1]]
            flat = np.broadcast_to((oh + r0) * w + (ow + c0), out_hw).astype(np.int64)
            if i == 0 and j == 0:
                pairs += [(np.copyto, (out, tap)), (np.copyto, (indices, flat))]
                continue
            if floating:  # ATen's CPU loop: val > max || isnan(val)
                pairs += [(np.greater, (tap, out, better)), (np.isnan, (tap, nan)),
                          (np.logical_or, (better, nan, better))]
            else:
                pairs.append((np.greater, (tap, out, better)))
            pairs += [(_copy_where, (out, tap, better)), (_copy_where, (indices, flat, better))]
    return steps(pairs)
