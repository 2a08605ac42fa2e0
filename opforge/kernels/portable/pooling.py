"""2-d and 3-d pooling: max pool with indices, adaptive max pool, average pool, adaptive
average pool.

One n-d implementation of each serves both ranks: the spatial dims are the input's last
n (n = 2: (N, C, H, W) or (C, H, W); n = 3: (N, C, D, H, W) or (C, D, H, W)), and the
2-d and 3-d kernels differ only in n. Windows are strided views of the padded input
(``sliding_window_view``), reduced along the flattened window axis in one NumPy call.
Output sizes follow ATen's ``pooling_output_shape``: with ``ceil_mode`` the last window
may hang over the right edge, but must start inside the input or its left padding.
Adaptive bin i of n over a size-m axis spans ``[floor(i m / n), ceil((i + 1) m / n))``.

Max pooling follows ATen's CPU scan (``val > max || isnan(val)``, from the window's first
input inside the input, in row-major window order): the first maximum wins ties and keeps
its sign of zero, the *last* NaN of a window gives the index, and a window of nothing but
the padding's fill keeps its first input. Indices are flat offsets into the input's
spatial volume (H*W, or D*H*W).

Adaptive average pooling sums its bins one axis at a time (a box is a product of
intervals): one masked tap per position of the longest bin, so an inf reaches only the
bins that hold it. Where the bins tile an axis evenly it is a reshape and a mean.

Bound 2-d max pooling (see ``_binding``) scans the kernel taps instead of reducing windows:
each tap is a fixed strided view of the input (or of a ``fill``-bordered buffer whose
border is written once) with its flat input indices precomputed. The fast scans assume no
NaN — 3 ufunc calls a tap, or a tournament for 2x2/stride 2 — and a call whose result
holds a NaN reruns the exact scan (5 calls a tap, with the NaN rule). Bound adaptive max
pooling is a max pool where the bins tile the input, else a scan of gathered taps. 3-d
pooling has no bound fast path: its kernels run as they are.

Kernel size, stride, padding and dilation come from the program file: every kernel and
binder checks them (ATen's ranges, the output's shape) and the padded workspace they imply
(against the memory limit) before allocating anything (``_workspace``).
"""

from __future__ import annotations

import math
import sys
from functools import cache, lru_cache

import numpy as np

from opforge.kernels.portable._binding import separate, steps
from opforge.kernels.portable._promotion import accumulate_dtype, is_floating
from opforge.kernels.portable._registry import Kernel, binder_for, kernel_decorator
from opforge.kernels.portable._workspace import (
    check_output_size, check_pooling, check_workspace, padded_elements,
)
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


def _pooled_shape(sizes, k, s, p, d, ceil_mode: bool) -> tuple[int, ...]:
    """The output's spatial shape for an input whose spatial shape is ``sizes``."""
    return tuple(_output_size(n, *a, ceil_mode) for n, a in zip(sizes, zip(k, s, p, d)))


def _windows(x: np.ndarray, k, s, p, d, out_size, fill) -> np.ndarray:
    """(…, *out_size, prod(k)) windows over the last len(k) axes of ``x`` padded with
    ``fill`` (room for ceil_mode), each flattened in row-major order."""
    n = len(k)
    pads = []
    for axis in range(n):
        need = (out_size[axis] - 1) * s[axis] + d[axis] * (k[axis] - 1) + 1
        right = max(need - x.shape[axis - n] - p[axis], p[axis])
        pads.append((p[axis], right))
    xp = np.pad(x, [(0, 0)] * (x.ndim - n) + pads, constant_values=fill)
    reach = tuple(di * (ki - 1) + 1 for ki, di in zip(k, d))
    w = np.lib.stride_tricks.sliding_window_view(xp, reach, axis=tuple(range(-n, 0)))
    w = w[(...,) + tuple(slice(None, o * si, si) for o, si in zip(out_size, s))
          + tuple(slice(None, None, di) for di in d)]
    return w.reshape(w.shape[:-n] + (math.prod(k),))


def _params(kernel_size, stride, padding, dilation, spatial: int, api: str):
    k = expand_param(kernel_size, spatial, "kernel_size", api)
    s = expand_param(stride, spatial, "stride", api) if len(stride) else k
    p = expand_param(padding, spatial, "padding", api)
    d = expand_param(dilation, spatial, "dilation", api)
    return k, s, p, d


def _geometry(api, x, k, s, p, d, ceil_mode, out, *, average: bool) -> tuple[int, ...]:
    """The output's spatial shape, once parameters and workspace are checked (the general
    kernels' padded input, its windows gathered, and a byte per window element)."""
    n = len(k)
    sizes = x.shape[-n:]
    out_size = check_pooling(
        api, sizes, k, s, p, d, out.shape[-n:],
        lambda *a: _pooled_shape(*a, ceil_mode), average=average)
    lead = math.prod(x.shape[:-n])
    itemsize = accumulate_dtype(x.dtype).itemsize if average else x.itemsize
    windows = lead * math.prod(out_size) * math.prod(k)
    copied = lead * math.prod(sizes) if average else 0  # the input in its compute dtype
    nbytes = (padded_elements(lead, sizes, k, s, p, d, out_size) + windows + copied) * itemsize \
        + windows
    check_workspace(api, f"workspace for input {x.shape}, kernel_size={k}, stride={s}, "
                    f"padding={p}, dilation={d}", nbytes)
    return out_size


def _max_pool(self, k, s, p, d, ceil_mode, out, indices,
              api="aten::max_pool2d_with_indices.out") -> None:
    n = len(k)
    sizes = self.shape[-n:]
    out_size = _geometry(api, self, k, s, p, d, ceil_mode, out, average=False)
    fill = -np.inf if is_floating(self.dtype) else np.iinfo(self.dtype).min
    windows = _windows(self, k, s, p, d, out_size, fill)
    local = np.argmax(windows, axis=-1)  # first maximum wins ties, as in ATen
    if is_floating(self.dtype):  # ATen's scan (val > max || isnan(val)): the last NaN wins
        nan = np.isnan(windows)
        last_nan = windows.shape[-1] - 1 - np.argmax(nan[..., ::-1], axis=-1)
        local = np.where(nan.any(axis=-1), last_nan, local)
    np.copyto(out, np.take_along_axis(windows, local[..., None], axis=-1)[..., 0],
              casting="unsafe")
    # Indices are flat offsets into the input's spatial volume.
    flat, inside = 0, True
    for axis, tap in enumerate(np.unravel_index(local, k)):
        origin = np.arange(out_size[axis]) * s[axis] - p[axis]
        coord = origin.reshape((-1,) + (1,) * (n - 1 - axis)) + tap * d[axis]
        inside = inside & (coord >= 0) & (coord < sizes[axis])
        flat = flat * sizes[axis] + coord
    # A window whose inputs all equal the padding's fill keeps its first input, as in ATen
    np.copyto(indices, np.where(inside, flat, _first_inside(out_size, sizes, s, p, d)),
              casting="unsafe")


def _first_inside(out_size, sizes, s, p, d) -> np.ndarray:
    """(*out_size) flat index of each window's first element inside the input (ATen starts
    its scan there: ``while (ih0 < 0) ih0 += dilation``)."""
    flat = np.zeros((), np.int64)
    for axis, size in enumerate(sizes):
        origin = np.arange(out_size[axis]) * s[axis] - p[axis]
        start = origin + -(-np.maximum(-origin, 0) // d[axis]) * d[axis]
        flat = flat[..., None] * size + start
    return flat


@kernel("aten::max_pool2d_with_indices.out")
def max_pool2d_with_indices_out(self, kernel_size, stride, padding, dilation, ceil_mode,
                                out, indices):
    params = _params(kernel_size, stride, padding, dilation, 2,
                     "aten::max_pool2d_with_indices.out")
    _max_pool(self, *params, ceil_mode, out, indices, "aten::max_pool2d_with_indices.out")


@kernel("aten::max_pool3d_with_indices.out")
def max_pool3d_with_indices_out(self, kernel_size, stride, padding, dilation, ceil_mode,
                                out, indices):
    params = _params(kernel_size, stride, padding, dilation, 3,
                     "aten::max_pool3d_with_indices.out")
    _max_pool(self, *params, ceil_mode, out, indices, "aten::max_pool3d_with_indices.out")


def _avg_pool(self, k, s, p, ceil_mode, count_include_pad, divisor_override, out,
              api) -> None:
    n = len(k)
    sizes = self.shape[-n:]
    d = (1,) * n
    out_size = _geometry(api, self, k, s, p, d, ceil_mode, out, average=True)
    ct = accumulate_dtype(out.dtype)
    total = _windows(self.astype(ct, copy=False), k, s, p, d, out_size, 0).sum(axis=-1)
    if divisor_override:
        divisor = divisor_override
    else:  # ATen's count per window: a product of per-axis counts
        divisor = np.ones((), np.int64)
        for axis, size in enumerate(sizes):
            start = np.arange(out_size[axis]) * s[axis] - p[axis]
            end = np.minimum(start + k[axis], size + p[axis])  # padded extent of the window
            if not count_include_pad:
                start, end = np.maximum(start, 0), np.minimum(end, size)
            divisor = divisor[..., None] * (end - start)
    if is_floating(ct):
        np.copyto(out, total / divisor, casting="unsafe")
    else:  # ATen divides integers in C: truncating towards zero, not flooring
        quotient = np.abs(total) // np.abs(divisor)  # (divisor_override may be negative)
        np.copyto(out, np.sign(total) * np.sign(divisor) * quotient, casting="unsafe")


@kernel("aten::avg_pool2d.out")
def avg_pool2d_out(self, kernel_size, stride, padding, ceil_mode, count_include_pad,
                   divisor_override, out):
    k, s, p, _ = _params(kernel_size, stride, padding, (1,), 2, "aten::avg_pool2d.out")
    _avg_pool(self, k, s, p, ceil_mode, count_include_pad, divisor_override, out,
              "aten::avg_pool2d.out")


@kernel("aten::avg_pool3d.out")
def avg_pool3d_out(self, kernel_size, stride, padding, ceil_mode, count_include_pad,
                   divisor_override, out):
    k, s, p, _ = _params(kernel_size, stride, padding, (1,), 3, "aten::avg_pool3d.out")
    _avg_pool(self, k, s, p, ceil_mode, count_include_pad, divisor_override, out,
              "aten::avg_pool3d.out")


def _adaptive_bounds(size: int, out_size: int) -> tuple[np.ndarray, np.ndarray]:
    i = np.arange(out_size)
    return (i * size) // out_size, -((-(i + 1) * size) // out_size)  # floor, ceil


def _tiles(sizes, out_size) -> bool:
    """Whether the adaptive bins are equal and tile the input on every axis."""
    return all(m % o == 0 for m, o in zip(sizes, out_size))


def _adaptive_avg_pool(self, out_size, out) -> None:
    n = len(out_size)
    sizes = self.shape[-n:]
    if out.size == 0:
        return
    ct = accumulate_dtype(out.dtype)
    total = self.astype(ct, copy=False)
    if _tiles(sizes, out_size):  # equal, non-overlapping bins (e.g. global pooling)
        split = sum(((o, m // o) for m, o in zip(sizes, out_size)), ())
        bins = total.reshape(total.shape[:-n] + split)
        np.copyto(out, bins.mean(axis=tuple(range(1 - 2 * n, 0, 2))), casting="unsafe")
        return
    divisor = np.ones((), np.int64)
    for axis, (m, o) in enumerate(zip(sizes, out_size)):  # sum the bins of one axis
        start, end = _adaptive_bounds(m, o)
        where = total.ndim - n + axis
        acc = np.zeros(total.shape[:where] + (o,) + total.shape[where + 1:], ct)
        for a in range(int((end - start).max())):
            tap = np.take(total, np.minimum(start + a, m - 1), axis=where)
            acc += np.where((start + a < end).reshape((o,) + (1,) * (n - 1 - axis)), tap, 0)
        total = acc
        divisor = divisor[..., None] * (end - start)
    np.copyto(out, total / divisor, casting="unsafe")


def _adaptive_size(output_size, spatial: int, out, api: str) -> tuple[int, ...]:
    """``output_size`` expanded, refused unless it is ``out``'s spatial shape."""
    size = expand_param(output_size, spatial, "output_size", api)
    check_output_size(api, size, out.shape[-spatial:])
    return size


@kernel("aten::_adaptive_avg_pool2d.out")
def adaptive_avg_pool2d_out(self, output_size, out):
    _adaptive_avg_pool(self, _adaptive_size(output_size, 2, out,
                                          "aten::_adaptive_avg_pool2d.out"), out)


@kernel("aten::_adaptive_avg_pool3d.out")
def adaptive_avg_pool3d_out(self, output_size, out):
    _adaptive_avg_pool(self, _adaptive_size(output_size, 3, out,
                                          "aten::_adaptive_avg_pool3d.out"), out)


def _adaptive_taps(sizes, out_size) -> list[np.ndarray]:
    """The flat volume index of each tap of every adaptive bin, in ATen's scan order
    (row-major over the largest bin); a bin smaller than the largest reads index
    prod(sizes) — a sentinel slot that never wins — where it has no tap."""
    bounds = [_adaptive_bounds(m, o) for m, o in zip(sizes, out_size)]
    taps = []
    for offset in np.ndindex(*(int((end - start).max()) for start, end in bounds)):
        flat, inside = np.zeros((), np.int64), np.ones((), np.bool_)
        for (start, end), size, a in zip(bounds, sizes, offset):
            flat = flat[..., None] * size + (start + a)
            inside = inside[..., None] & (start + a < end)
        taps.append(np.where(inside, flat, math.prod(sizes)))
    return taps


def _with_sentinel(x: np.ndarray, spatial: int, fill) -> np.ndarray:
    """``x``'s spatial volumes (its last ``spatial`` axes) flattened, each with one more
    slot holding ``fill``."""
    volume = math.prod(x.shape[-spatial:])
    planes = np.empty(x.shape[:-spatial] + (volume + 1,), x.dtype)
    planes[..., -1] = fill
    planes[..., :-1].reshape(x.shape)[...] = x
    return planes


def _adaptive_max_pool(self, out_size, out, indices) -> None:
    # Bin i of n over a size-m axis spans [floor(i m / n), ceil((i + 1) m / n)), as in
    # adaptive average pooling; the maximum follows ATen's CPU rule, as max pooling does.
    n = len(out_size)
    sizes = self.shape[-n:]
    if out.size == 0:
        return
    if _tiles(sizes, out_size):  # equal bins that tile the input: a max pool
        k = tuple(m // o for m, o in zip(sizes, out_size))
        _max_pool(self, k, k, (0,) * n, (1,) * n, False, out, indices)
        return
    floating = is_floating(self.dtype)
    planes = _with_sentinel(self, n, -np.inf if floating else np.iinfo(self.dtype).min)
    taps = _adaptive_taps(sizes, out_size)
    best = np.take(planes, taps[0], axis=-1)
    index = np.broadcast_to(taps[0], best.shape)
    for flat in taps[1:]:
        value = np.take(planes, flat, axis=-1)
        better = value > best
        if floating:
            better |= np.isnan(value)  # the last NaN of a bin wins
        best = np.where(better, value, best)
        index = np.where(better, flat, index)
    np.copyto(out, best, casting="unsafe")
    np.copyto(indices, index, casting="unsafe")


@kernel("aten::adaptive_max_pool2d.out")
def adaptive_max_pool2d_out(self, output_size, out, indices):
    _adaptive_max_pool(self, _adaptive_size(output_size, 2, out,
                                          "aten::adaptive_max_pool2d.out"), out, indices)


@kernel("aten::adaptive_max_pool3d.out")
def adaptive_max_pool3d_out(self, output_size, out, indices):
    _adaptive_max_pool(self, _adaptive_size(output_size, 3, out,
                                          "aten::adaptive_max_pool3d.out"), out, indices)


# --- bind-time fast paths -------------------------------------------------------------------

def _copy_where(dst: np.ndarray, src: np.ndarray, where: np.ndarray) -> None:
    np.copyto(dst, src, where=where)


@cache
def _tie_keeping_maximum(dtype: np.dtype):
    """``f(later, earlier, out)``: np.maximum returning ``earlier`` on ties (+0 vs -0, whose
    signs ATen keeps as found first), or None where NumPy's choice is not an operand order.
    """
    probe = np.array([0.0, -0.0], dtype)
    first, second = np.maximum(probe[:1], probe[1:]), np.maximum(probe[1:], probe[:1])
    if np.signbit(first[0]) and not np.signbit(second[0]):  # returns its second operand
        return _maximum
    if not np.signbit(first[0]) and np.signbit(second[0]):  # returns its first operand
        return _maximum_swapped
    return None


def _maximum(later, earlier, out) -> None:
    np.maximum(later, earlier, out=out)


def _maximum_swapped(later, earlier, out) -> None:
    np.maximum(earlier, later, out=out)


def _tap_scan(taps, flats, out: np.ndarray, indices: np.ndarray, floating: bool,
              gathers=None, first=None) -> list:
    """Steps scanning ``taps`` (arrays shaped like out, in ATen's order) into ``out`` and
    ``indices``, exactly as ATen's CPU loop: ``flats[i]`` is the input index each element
    of ``taps[i]`` reads, ``gathers[i]``, if given, the step that fills ``taps[i]`` first,
    and ``first`` the index kept where nothing beats the first tap (default flats[0])."""
    gathers = gathers or [None] * len(taps)
    better = np.empty(out.shape, np.bool_)
    nan = np.empty(out.shape, np.bool_)
    pairs = [g for g in gathers[:1] if g is not None]
    pairs += [(np.copyto, (out, taps[0])),
              (np.copyto, (indices, flats[0] if first is None else first))]
    for tap, flat, gather in zip(taps[1:], flats[1:], gathers[1:]):
        if gather is not None:
            pairs.append(gather)
        if floating:  # ATen's CPU loop: val > max || isnan(val)
            pairs += [(np.greater, (tap, out, better)), (np.isnan, (tap, nan)),
                      (np.logical_or, (better, nan, better))]
        else:
            pairs.append((np.greater, (tap, out, better)))
        pairs += [(_copy_where, (out, tap, better)), (_copy_where, (indices, flat, better))]
    return pairs


def _fast_scan(taps, flats, first, out: np.ndarray, indices: np.ndarray, maximum) -> list:
    """``_tap_scan`` for inputs without NaN, in 3 ufunc calls a tap instead of 5: the
    maximum through ``maximum`` (``_tie_keeping_maximum``), the index where greater."""
    better = np.empty(out.shape, np.bool_)
    pairs = [(np.copyto, (out, taps[0])), (np.copyto, (indices, first))]
    for tap, flat in zip(taps[1:], flats[1:]):
        pairs += [(np.greater, (tap, out, better)), (maximum, (tap, out, out)),
                  (_copy_where, (indices, flat, better))]
    return pairs


@binder_for(max_pool2d_with_indices_out)
def _bind_max_pool2d(args):
    self, kernel_size, stride, padding, dilation, ceil_mode, out, indices = args
    api = "aten::max_pool2d_with_indices.out"
    k, s, p, d = _params(kernel_size, stride, padding, dilation, 2, api)
    if self.ndim >= 2 and out.ndim == self.ndim:  # refuse a hostile geometry at bind
        _geometry(api, self, k, s, p, d, ceil_mode, out, average=False)
    if self.ndim not in (3, 4) or out.dtype != self.dtype or indices.dtype != np.int64 or \
            self.size == 0 or not separate([out, indices], self):
        return max_pool2d_with_indices_out, args
    h, w = self.shape[-2:]
    out_hw = _pooled_shape((h, w), k, s, p, d, ceil_mode)
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
    taps, flats = [], []
    for i in range(k[0]):
        for j in range(k[1]):
            r0, c0 = i * d[0], j * d[1]
            taps.append(source[..., r0: r0 + (out_hw[0] - 1) * s[0] + 1: s[0],
                               c0: c0 + (out_hw[1] - 1) * s[1] + 1: s[1]])
            flats.append(np.broadcast_to((oh + r0) * w + (ow + c0), out_hw).astype(np.int64))
    first = _first_inside(out_hw, (h, w), s, p, d).astype(np.int64)
    exact = steps(pairs + _tap_scan(taps, flats, out, indices, floating, first=first))
    maximum = _tie_keeping_maximum(self.dtype) if floating else _maximum
    if maximum is None or self.dtype == np.bool_:
        return exact
    if k == s == (2, 2) and d == (1, 1) and not pairs:
        fast = _max_pool_2x2(self, out, indices, maximum)
    else:
        fast = pairs + _fast_scan(taps, flats, first, out, indices, maximum)
    if fast is None or not out.flags.c_contiguous:
        return exact
    if not floating:  # no NaN: the fast steps are exact
        return steps(fast)
    return _run_checked, (tuple(fast), out.reshape(-1), exact)


# The 2x2, stride-2 max pool (VGG, LeNet, most small CNNs). One strided copy gathers the
# four taps into rows of a (4, M) buffer; then a tournament on contiguous rows: each row
# of the window keeps its first maximum, then the bottom row replaces the top only where
# strictly greater — the order ATen's scan meets them in, so the same element wins. The
# three comparisons land in three bytes of one intp per window, which a table turns into
# the window offset (0, 1, W or W + 1) of the winner: ~8 ufunc calls for the tap scan's
# 17 with its masked copies. NaN breaks strict comparisons (ATen takes a window's *last*
# NaN), so a call whose result holds a NaN reruns the exact tap scan.

@lru_cache(maxsize=64)
def _window_offsets(w: int) -> np.ndarray:
    """Offset of a 2x2 window's winner in the input plane, by the intp whose bytes 0, 1
    and 2 hold: top right > top left, bottom right > bottom left, bottom > top."""
    table = np.zeros(65536 + 256 + 2, np.intp)
    for top, bottom, lower in np.ndindex(2, 2, 2):
        code = np.zeros(np.dtype(np.intp).itemsize, np.bool_)
        code[:3] = top, bottom, lower
        table[code.view(np.intp)[0]] = w + bottom if lower else top
    table.flags.writeable = False
    return table


def _has_nan(values: np.ndarray) -> bool:
    total = np.dot(values, values) if values.dtype != np.float16 else values.max()
    return bool(np.isnan(total))  # inf * inf is inf: only a NaN makes the sum NaN


def _run_checked(fast: tuple, values: np.ndarray, exact: tuple) -> None:
    """Run the fast steps; where a NaN came out (``values``: out, flat), rerun the exact
    scan over them."""
    for fn, args in fast:
        fn(*args)
    if _has_nan(values):
        exact[0](*exact[1])


def _max_pool_2x2(self, out, indices, maximum):
    """The steps of a bound 2x2/stride-2 max pool (no NaN), or None where they do not
    apply."""
    if sys.byteorder != "little" or not (out.flags.c_contiguous and
                                         indices.flags.c_contiguous):
        return None
    oh, ow = out.shape[-2:]
    lead, size = self.shape[:-2], out.size
    sh, sw = self.strides[-2:]
    taps = np.lib.stride_tricks.as_strided(
        self, (2, 2) + lead + (oh, ow), (sh, sw) + self.strides[:-2] + (2 * sh, 2 * sw),
        writeable=False)
    rows = np.empty((4, size), self.dtype)  # taps top left, top right, bottom left, right
    row_max = np.empty((2, size), self.dtype)
    code = np.zeros((size, np.dtype(np.intp).itemsize), np.bool_)
    w = self.shape[-1]
    origin = np.arange(oh)[:, None] * 2 * w + np.arange(ow)[None, :] * 2
    origin = np.ascontiguousarray(np.broadcast_to(origin, out.shape), np.intp).reshape(-1)
    flat = indices.reshape(-1)
    return [
        (np.copyto, (rows.reshape((2, 2) + lead + (oh, ow)), taps)),
        (np.greater, (rows[1::2], rows[0::2], code.T[:2])),  # right > left, per row
        (maximum, (rows[1::2], rows[0::2], row_max)),
        (np.greater, (row_max[1], row_max[0], code[:, 2])),  # bottom > top
        (maximum, (row_max[1], row_max[0], out.reshape(-1))),
        (_window_offsets(w).take, (code.view(np.intp)[:, 0], 0, flat, "clip")),
        (np.add, (flat, origin, flat)),
    ]


def _bind_adaptive_taps(self, oh, ow, out, indices, floating):
    planes = _with_sentinel(self, 2, -np.inf if floating else np.iinfo(self.dtype).min)
    flats = _adaptive_taps(self.shape[-2:], (oh, ow))
    taps = [np.empty(out.shape, self.dtype) for _ in flats]
    gathers = [(planes.take, (flat, -1, tap, "clip")) for flat, tap in zip(flats, taps)]
    copy = (np.copyto, (planes[..., :-1].reshape(self.shape), self))
    return steps([copy] + _tap_scan(taps, flats, out, indices, floating, gathers))


@binder_for(adaptive_max_pool2d_out)
def _bind_adaptive_max_pool2d(args):
    self, output_size, out, indices = args
    if self.ndim not in (3, 4) or out.dtype != self.dtype or indices.dtype != np.int64 or \
            out.size == 0 or not separate([out, indices], self):
        return adaptive_max_pool2d_out, args
    oh, ow = _adaptive_size(output_size, 2, out, "aten::adaptive_max_pool2d.out")
    h, w = self.shape[-2:]
    if h % oh == 0 and w % ow == 0:  # equal bins that tile the input: a max pool
        k = (h // oh, w // ow)
        return _bind_max_pool2d((self, k, k, (0, 0), (1, 1), False, out, indices))
    return _bind_adaptive_taps(self, oh, ow, out, indices, is_floating(self.dtype))
