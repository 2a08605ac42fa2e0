"""Resampling: nearest, nearest-exact and (bi/tri)linear upsampling of 1-, 2- and 3-d signals.

# Design
#
# Every op gathers with index arrays computed once per spatial axis (no loop over
# elements), reproducing the index arithmetic of ATen's CPU kernels (``UpSampleKernel.cpp``)
# as PyTorch 2.13 runs them on contiguous (NCHW) tensors, checked exhaustively against it:
#
# - The scale of an axis is ATen's ``area_pixel_compute_scale``: ``(in - 1) / (out - 1)``
#   with align_corners (0 when out == 1), else ``1 / scale`` when a positive scale was
#   given (the ``.vec`` overloads pass their scale factors), else ``in / out``; computed
#   in the *opmath* dtype (float32 for float16 and integer inputs, else the input's). The
#   output size is never recomputed: ``out`` already has it.
# - nearest, 1-d and 3-d (the generic N-d path): ``src = min(floor(scale * dst), in - 1)``;
#   nearest-exact ``floor(max(scale * (dst + 0.5) - 0.5, 0) + 0.5)``, its multiply-add
#   fused as ATen's compiled code fuses it. Every real index is rounded to float32 before
#   the floor: ATen floors with ``floorf``, even a double.
# - nearest, 2-d (its own loop, ``nearest_idx`` / ``nearest_exact_idx``): the scale in
#   float32 whatever the dtype, ``src = dst`` when the size is unchanged and ``dst >> 1``
#   when it doubles (whatever scale was passed), else ``floor(scale * dst)``; nearest-exact
#   ``floor((dst + 0.5) * scale)`` (a double product, floored as float32).
# - linear: ``real = scale * dst`` (align_corners) or ``max(scale * (dst + 0.5) - 0.5, 0)``,
#   ``i0 = min(floor(real), in - 1)``, ``i1 = i0 + (i0 < in - 1)``, ``l1 = clip(real - i0,
#   0, 1)``, ``l0 = 1 - l1``; an axis whose size does not change uses ``i0 = i1 = dst``,
#   ``l0 = 1, l1 = 0``. The weights are stored in the input's dtype (float16 weights are
#   rounded, as ATen stores them) and the sums run in opmath: the last axis innermost,
#   ``(x[i0, j0] * w0 + x[i0, j1] * w1) * h0 + (x[i1, j0] * w0 + x[i1, j1] * w1) * h1``,
#   the order of ATen's nested ``Interpolate``. The products are kept even where a weight
#   is 0, so inf and NaN spread exactly as in ATen (inf * 0 is NaN). Values match to a few
#   ulp, not bit for bit: ATen picks between two kernels by thread and channel count, and
#   fuses multiply-adds where NumPy rounds each product.
#
# Linear upsampling of uint8 images takes a separate fixed-point path in ATen (Pillow's
# algorithm) that this module does not reproduce: it raises a KernelError instead.
#
# Bound (see ``_binding``), the index arrays, weights and scratch buffers are made once at
# bind and a call is a fixed list of ``np.take`` / ufunc steps into them.
"""

from __future__ import annotations

import numpy as np

from opforge.errors import KernelError
from opforge.kernels.portable._binding import separate, steps
from opforge.kernels.portable._promotion import is_floating
from opforge.kernels.portable._registry import Kernel, binder_for, kernel_decorator

__all__ = ["KERNELS"]

KERNELS: dict[str, Kernel] = {}
kernel = kernel_decorator(KERNELS)


def _opmath(dtype: np.dtype) -> np.dtype:
    dtype = np.dtype(dtype)
    return dtype if dtype in (np.float32, np.float64) else np.dtype(np.float32)


def _scale(in_size: int, out_size: int, align_corners: bool, scale, ct: np.dtype):
    if align_corners:
        return ct.type(in_size - 1) / ct.type(out_size - 1) if out_size > 1 else ct.type(0)
    if scale is not None and scale > 0:
        return ct.type(1.0 / scale)
    return ct.type(in_size) / ct.type(out_size) if out_size else ct.type(0)


def _fma_shift(s, dst: np.ndarray, ct: np.dtype) -> np.ndarray:
    """``s * dst - 0.5`` rounded once, as the fused multiply-add ATen's float kernels are
    compiled to (exact for float32: the product of two floats fits a double)."""
    if ct == np.float32:
        return (np.float64(s) * dst.astype(np.float64) - 0.5).astype(np.float32)
    return s * dst - ct.type(0.5)


def nearest_indices(in_size: int, out_size: int, scale, ct: np.dtype, exact: bool = False,
                    spatial: int = 1) -> np.ndarray:
    """Source index of each output position along one axis (int64)."""
    if spatial == 2:
        # 2-d has its own loop in ATen (``nearest_idx`` / ``nearest_exact_idx``): the scale
        # in float32 whatever the dtype, and exact copies for sizes 1x and 2x.
        if not exact and out_size == in_size:
            return np.arange(out_size, dtype=np.int64)
        if not exact and out_size == 2 * in_size:
            return np.arange(out_size, dtype=np.int64) >> 1
        s = _scale(in_size, out_size, False, scale, np.dtype(np.float32))
        if exact:  # (dst + 0.5) is a double, so is the product; floorf rounds it to float
            real = ((np.arange(out_size) + 0.5) * np.float64(s)).astype(np.float32)
        else:
            real = np.arange(out_size, dtype=np.float32) * s
    else:
        # 1-d and 3-d take the generic N-d path: the scale in opmath; nearest-exact is
        # floor(max(s * (dst + 0.5) - 0.5, 0) + 0.5), the last sum in double.
        s = _scale(in_size, out_size, False, scale, ct)
        dst = np.arange(out_size, dtype=ct)
        if exact:
            real = np.maximum(_fma_shift(s, dst + ct.type(0.5), ct), ct.type(0))
            real = real.astype(np.float64) + 0.5
        else:
            real = dst * s
        real = real.astype(np.float32)  # ATen floors with floorf, even a double
    return np.minimum(np.floor(real).astype(np.int64), in_size - 1)


def linear_weights(in_size: int, out_size: int, align_corners: bool, scale,
                   dtype: np.dtype) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(i0, i1, l0, l1)`` along one axis; the weights in ``dtype``'s precision, as opmath."""
    ct = _opmath(dtype)
    if in_size == out_size:
        i0 = np.arange(out_size, dtype=np.int64)
        return i0, i0, np.ones(out_size, ct), np.zeros(out_size, ct)
    s = _scale(in_size, out_size, align_corners, scale, ct)
    dst = np.arange(out_size, dtype=ct)
    if align_corners:
        real = dst * s
    else:
        real = np.maximum(_fma_shift(s, dst + ct.type(0.5), ct), ct.type(0))
    i0 = np.minimum(np.floor(real.astype(np.float32)).astype(np.int64), in_size - 1)
    i1 = i0 + (i0 < in_size - 1)
    l1 = np.clip(real - i0.astype(ct), ct.type(0), ct.type(1)).astype(dtype)
    l0 = (np.asarray(1, dtype) - l1).astype(ct)
    return i0, i1, l0, l1.astype(ct)


def _check(api: str, input: np.ndarray, out: np.ndarray, spatial: int) -> None:
    if input.ndim != spatial + 2 or out.ndim != input.ndim or out.shape[:2] != input.shape[:2]:
        raise KernelError(
            f"`{api}`: input — found shape {input.shape} with out {out.shape} — valid: "
            f"(N, C) followed by {spatial} spatial dims, out sharing N and C — "
            "check the exported shapes"
        )
    if any(n == 0 for n in input.shape[2:]) and out.size:
        raise KernelError(
            f"`{api}`: input — found an empty spatial dim in {input.shape} — valid: "
            "non-empty spatial dims (ATen refuses them too) — check the input shape"
        )


def _scales(scales, spatial: int) -> tuple:
    """The per-axis scales of a ``.vec`` overload (``float[]?``) or the ``float?`` ones."""
    if scales is None:
        return (None,) * spatial
    return tuple(scales)


# --- nearest --------------------------------------------------------------------------------

def _nearest(api: str, input, scales, out, exact: bool) -> None:
    spatial = out.ndim - 2
    _check(api, input, out, spatial)
    if out.size == 0:
        return
    ct, x = _opmath(input.dtype), input
    for k, s in enumerate(_scales(scales, spatial)):
        axis = 2 + k
        index = nearest_indices(input.shape[axis], out.shape[axis], s, ct, exact, spatial)
        x = np.take(x, index, axis=axis)
    np.copyto(out, x, casting="unsafe")


@kernel("aten::upsample_nearest1d.out", "aten::upsample_nearest2d.out",
        "aten::upsample_nearest3d.out")
def upsample_nearest_out(self, output_size, *args):
    *scales, out = args
    _nearest("aten::upsample_nearest.out", self, scales, out, exact=False)


@kernel("aten::_upsample_nearest_exact1d.out", "aten::_upsample_nearest_exact2d.out",
        "aten::_upsample_nearest_exact3d.out")
def upsample_nearest_exact_out(self, output_size, *args):
    *scales, out = args
    _nearest("aten::_upsample_nearest_exact.out", self, scales, out, exact=True)


@kernel("aten::upsample_nearest2d.vec_out")
def upsample_nearest_vec_out(input, output_size, scale_factors, out):
    _nearest("aten::upsample_nearest.vec_out", input, scale_factors, out, exact=False)


# --- linear ---------------------------------------------------------------------------------

def _linear_plan(api: str, input, align_corners, scales, out) -> list:
    """Per spatial axis ``(axis, i0, i1, w0, w1)`` with weights shaped to broadcast."""
    spatial = out.ndim - 2
    _check(api, input, out, spatial)
    if not is_floating(input.dtype):
        raise KernelError(
            f"`{api}`: input — found dtype {input.dtype} — valid: float16, float32, float64 "
            "(ATen's uint8 path is fixed-point and not reproduced here) — "
            "convert the input to float before interpolating"
        )
    plan = []
    for k, s in enumerate(_scales(scales, spatial)):
        axis = 2 + k
        i0, i1, l0, l1 = linear_weights(input.shape[axis], out.shape[axis], align_corners, s,
                                        input.dtype)
        shape = (-1,) + (1,) * (out.ndim - 1 - axis)
        plan.append((axis, i0, i1, l0.reshape(shape), l1.reshape(shape)))
    return plan


def _linear(api: str, input, align_corners, scales, out) -> None:
    plan = _linear_plan(api, input, align_corners, scales, out)
    if out.size == 0:
        return
    x = input.astype(_opmath(input.dtype), copy=False)
    for axis, i0, i1, l0, l1 in reversed(plan):  # the last axis innermost, as ATen nests
        x = np.take(x, i0, axis=axis) * l0 + np.take(x, i1, axis=axis) * l1
    np.copyto(out, x, casting="unsafe")


@kernel("aten::upsample_linear1d.out", "aten::upsample_bilinear2d.out",
        "aten::upsample_trilinear3d.out")
def upsample_linear_out(self, output_size, align_corners, *args):
    *scales, out = args
    with np.errstate(invalid="ignore"):
        _linear("aten::upsample_linear.out", self, align_corners, scales, out)


@kernel("aten::upsample_bilinear2d.vec_out")
def upsample_linear_vec_out(input, output_size, align_corners, scale_factors, out):
    with np.errstate(invalid="ignore"):
        _linear("aten::upsample_linear.vec_out", input, align_corners, scale_factors, out)


# --- bind-time fast paths -------------------------------------------------------------------

def _take(a, index, axis, out) -> None:
    np.take(a, index, axis, out, "clip")  # in range by construction; "clip" does not buffer


def _bind_nearest(input, scales, out, exact: bool):
    spatial = out.ndim - 2
    if input.ndim != out.ndim or out.size == 0 or input.dtype != out.dtype or \
            not separate([out], input) or any(n == 0 for n in input.shape[2:]):
        return None
    ct, pairs, x = _opmath(input.dtype), [], input
    scales = _scales(scales, spatial)
    for k in range(spatial):
        axis = 2 + k
        index = nearest_indices(input.shape[axis], out.shape[axis], scales[k], ct, exact,
                                spatial)
        shape = out.shape[:axis + 1] + input.shape[axis + 1:]
        target = out if k == spatial - 1 else np.empty(shape, input.dtype)
        pairs.append((_take, (x, index, axis, target)))
        x = target
    return steps(pairs)


@binder_for(upsample_nearest_out)
def _bind_upsample_nearest(args):
    self, _size, *scales, out = args
    return _bind_nearest(self, scales, out, False) or \
        (upsample_nearest_out, args)


@binder_for(upsample_nearest_exact_out)
def _bind_upsample_nearest_exact(args):
    self, _size, *scales, out = args
    return _bind_nearest(self, scales, out, True) or \
        (upsample_nearest_exact_out, args)


@binder_for(upsample_nearest_vec_out)
def _bind_upsample_nearest_vec(args):
    input, _size, scale_factors, out = args
    return _bind_nearest(input, scale_factors, out, False) or \
        (upsample_nearest_vec_out, args)


def _bind_linear(input, align_corners, scales, out):
    if input.dtype not in (np.float32, np.float64) or out.dtype != input.dtype or \
            input.ndim != out.ndim or out.size == 0 or not separate([out], input) or \
            any(n == 0 for n in input.shape[2:]):
        return None
    plan = _linear_plan("aten::upsample_linear.out", input, align_corners, scales, out)
    dtype, pairs, x = input.dtype, [], input
    for step, (axis, i0, i1, l0, l1) in enumerate(reversed(plan)):
        shape = x.shape[:axis] + (out.shape[axis],) + x.shape[axis + 1:]
        a, b = np.empty(shape, dtype), np.empty(shape, dtype)
        target = out if step == len(plan) - 1 else np.empty(shape, dtype)
        pairs += [(_take, (x, i0, axis, a)), (_take, (x, i1, axis, b)),
                  (np.multiply, (a, l0, a)), (np.multiply, (b, l1, b)),
                  (np.add, (a, b, target))]
        x = target
    return steps(pairs, quiet=True)  # inf * 0 is the NaN ATen gives too


@binder_for(upsample_linear_out)
def _bind_upsample_linear(args):
    self, _size, align_corners, *scales, out = args
    return _bind_linear(self, align_corners, scales, out) or (upsample_linear_out, args)


@binder_for(upsample_linear_vec_out)
def _bind_upsample_linear_vec(args):
    input, _size, align_corners, scale_factors, out = args
    return _bind_linear(input, align_corners, scale_factors, out) or \
        (upsample_linear_vec_out, args)

