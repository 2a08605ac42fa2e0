"""Quantize / dequantize: the reference kernels of quantized programs (NumPy, exact).

Each kernel computes what torch's (``quantized_decomposed``, ``torchao``) functional op
computes, in the same order and the same float precision, so the lean runtime reproduces
torchao's converted model bit for bit:

* quantize:   ``clamp(round_half_even(x * float32(1 / scale)) + zero_point, qmin, qmax)``,
  per tensor (``1 / scale`` in double, then rounded to float32, as torch's scalar
  multiply does) or per channel (``1 / scales`` in the scales' dtype);
* dequantize: ``(float(q) - zero_point) * scale`` per tensor; per channel
  ``float(q - zero_point) * scale`` (the integer difference first, as torch promotes
  ``int8 - int64``); per block (``torchao::dequantize_affine``) ``(float(q) - float(zp)) *
  scale`` with each scale broadcast over its block.

Only IEEE multiplies, subtractions and one rounding per element are involved, so results
do not depend on the CPU's instruction set.
"""

from __future__ import annotations

import numpy as np

from opforge.errors import KernelError
from opforge.kernels.portable._registry import Kernel, kernel_decorator

__all__ = ["KERNELS", "reduction_shape"]

KERNELS: dict[str, Kernel] = {}
kernel = kernel_decorator(KERNELS)


def _float_dtype(out: np.ndarray) -> np.dtype:
    if out.dtype.kind != "f":
        raise KernelError(f"dequantize: out dtype {out.dtype} — valid: a float dtype")
    return out.dtype


def _store(t: np.ndarray, quant_min: int, quant_max: int, out: np.ndarray) -> None:
    np.clip(t, quant_min, quant_max, out=t)
    out[...] = t  # integer-valued floats in [qmin, qmax]: the cast is exact


def _channel_shape(ndim: int, axis: int, channels: int) -> tuple[int, ...]:
    axis = axis + ndim if axis < 0 else axis
    if not 0 <= axis < ndim:
        raise KernelError(f"per-channel (de)quantize: axis {axis} out of range for rank {ndim}")
    shape = [1] * ndim
    shape[axis] = channels
    return tuple(shape)


@kernel("quantized_decomposed::quantize_per_tensor.out")
def quantize_per_tensor_out(x, scale, zero_point, quant_min, quant_max, dtype, out):
    t = np.asarray(x, dtype=np.float32) * np.float32(1.0 / scale)
    np.rint(t, out=t)  # round half to even, like torch.round
    t += np.float32(zero_point)
    _store(t, quant_min, quant_max, out)


@kernel("quantized_decomposed::dequantize_per_tensor.out")
def dequantize_per_tensor_out(q, scale, zero_point, quant_min, quant_max, dtype, out_dtype, out):
    ft = _float_dtype(out)
    t = q.astype(ft)
    t -= ft.type(zero_point)
    t *= ft.type(scale)
    out[...] = t


@kernel("quantized_decomposed::quantize_per_channel.out")
def quantize_per_channel_out(x, scales, zero_points, axis, quant_min, quant_max, dtype, out):
    shape = _channel_shape(x.ndim, axis, scales.shape[0])
    compute = np.result_type(np.float32, scales.dtype)
    inverse = (compute.type(1.0) / scales.astype(compute)).reshape(shape)
    t = np.asarray(x, dtype=compute) * inverse
    np.rint(t, out=t)
    t += zero_points.reshape(shape).astype(compute)
    _store(t, quant_min, quant_max, out)


@kernel("quantized_decomposed::dequantize_per_channel.out")
def dequantize_per_channel_out(q, scales, zero_points, axis, quant_min, quant_max, dtype,
                               out_dtype, out):
    shape = _channel_shape(q.ndim, axis, scales.shape[0])
    compute = np.result_type(np.float32, scales.dtype)
    if zero_points is not None:
        diff = q.astype(np.int64) - zero_points.reshape(shape).astype(np.int64)
    else:
        diff = q
    out[...] = diff.astype(compute) * scales.reshape(shape).astype(compute)


def reduction_shape(block_size, sizes) -> tuple[list[int], list[int]]:
    """torchao's ``_get_reduction_params``: (the shape that splits every blocked dimension
    into (blocks, block), the shape of the scales broadcast over it)."""
    if len(block_size) != len(sizes):
        raise KernelError(f"dequantize_affine: block_size {tuple(block_size)} has "
                          f"{len(block_size)} entries — valid: one per dimension of {tuple(sizes)}")
    split, scales = [], []
    for block, size in zip(block_size, sizes):
        if block != size and block > 1:
            if size % block:
                raise KernelError(f"dequantize_affine: block {block} does not divide size {size}")
            split += [size // block, block]
            scales += [size // block, 1]
        else:
            split.append(size)
            scales.append(1 if block != 1 else size)
    return split, scales


@kernel("torchao::dequantize_affine.out")
def dequantize_affine_out(q, block_size, scale, zero_point, input_dtype, quant_min, quant_max,
                          output_dtype, out):
    ft = _float_dtype(out)
    split, scale_shape = reduction_shape(tuple(block_size), q.shape)
    t = q.astype(ft).reshape(split)
    if zero_point is not None:
        t -= zero_point.astype(ft).reshape(scale_shape)
    t = t * scale.reshape(scale_shape)
    out[...] = t.reshape(q.shape).astype(ft, copy=False)


@kernel("torchao::quantize_affine.out")
def quantize_affine_out(x, block_size, scale, zero_point, output_dtype, quant_min, quant_max, out):
    split, scale_shape = reduction_shape(tuple(block_size), x.shape)
    compute = np.result_type(np.float32, scale.dtype)
    inverse = compute.type(1.0) / scale.astype(compute).reshape(scale_shape)
    t = np.asarray(x, dtype=compute).reshape(split) * inverse
    np.rint(t, out=t)
    if zero_point is not None and zero_point.size:
        t += zero_point.astype(compute).reshape(scale_shape)
    lo = np.iinfo(out.dtype).min if quant_min is None else quant_min
    hi = np.iinfo(out.dtype).max if quant_max is None else quant_max
    t = t.reshape(x.shape)
    _store(t, lo, hi, out)
