"""Softmax, log-softmax and the normalisations: layer norm, batch norm (inference), group norm.

Statistics are computed in float32 for float16 inputs (ATen's CPU opmath), in the input's
dtype otherwise, and variances are the biased (population) variance, as in ATen.
"""

from __future__ import annotations

import numpy as np

from opforge.kernels.portable._promotion import accumulate_dtype
from opforge.kernels.portable._registry import Kernel, kernel_decorator

__all__ = ["KERNELS"]

KERNELS: dict[str, Kernel] = {}
kernel = kernel_decorator(KERNELS)


def _shifted(self: np.ndarray, dim: int, out: np.ndarray) -> tuple[np.ndarray, int]:
    x = self.astype(accumulate_dtype(out.dtype), copy=False)
    axis = dim % x.ndim if x.ndim else None
    if x.size == 0:
        return x, axis
    # A row that is all -inf gives nan (-inf - -inf), exactly as ATen does.
    return x - np.max(x, axis=axis, keepdims=True), axis


@kernel("aten::_softmax.out")
def softmax_out(self, dim, half_to_float, out):
    z, axis = _shifted(self, dim, out)
    e = np.exp(z)
    e /= np.sum(e, axis=axis, keepdims=True)
    np.copyto(out, e, casting="unsafe")


@kernel("aten::_log_softmax.out")
def log_softmax_out(self, dim, half_to_float, out):
    z, axis = _shifted(self, dim, out)
    with np.errstate(divide="ignore"):
        z = z - np.log(np.sum(np.exp(z), axis=axis, keepdims=True))
    np.copyto(out, z, casting="unsafe")


@kernel("aten::native_layer_norm.out")
def native_layer_norm_out(input, normalized_shape, weight, bias, eps, out0, out1, out2):
    # mean and rstd keep the leading dims and have size 1 in the normalised ones.
    x = input.astype(accumulate_dtype(input.dtype), copy=False)
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    mean = np.mean(x, axis=axes, keepdims=True)
    centered = x - mean
    var = np.mean(centered * centered, axis=axes, keepdims=True)
    rstd = 1.0 / np.sqrt(var + eps)
    y = centered * rstd
    if weight is not None:
        y *= weight
    if bias is not None:
        y += bias
    np.copyto(out0, y, casting="unsafe")
    np.copyto(out1, mean.reshape(out1.shape), casting="unsafe")
    np.copyto(out2, rstd.reshape(out2.shape), casting="unsafe")


def _per_channel(v: np.ndarray, ndim: int) -> np.ndarray:
    """A (C,) vector shaped to broadcast against (N, C, *spatial)."""
    return v.reshape((1, -1) + (1,) * (ndim - 2))


@kernel("aten::_native_batch_norm_legit_no_training.out")
def batch_norm_no_training_out(input, weight, bias, running_mean, running_var, momentum,
                               eps, out0, out1, out2):
    # Inference: normalise with the running statistics. out1/out2 (the saved mean and
    # invstd of training) are empty (shape (0,)) in ATen and are left untouched.
    ct = accumulate_dtype(input.dtype)
    scale = 1.0 / np.sqrt(running_var.astype(ct) + ct.type(eps))
    if weight is not None:
        scale = scale * weight
    shift = -running_mean.astype(ct) * scale
    if bias is not None:
        shift = shift + bias
    y = input * _per_channel(scale.astype(ct), input.ndim)
    y += _per_channel(shift.astype(ct), input.ndim)
    np.copyto(out0, y, casting="unsafe")


@kernel("aten::native_group_norm.out")
def native_group_norm_out(input, weight, bias, N, C, HxW, group, eps, out0, out1, out2):
    # mean and rstd have shape (N, group).
    ct = accumulate_dtype(input.dtype)
    x = input.astype(ct, copy=False).reshape(N, group, -1)
    mean = np.mean(x, axis=2, keepdims=True)
    centered = x - mean
    var = np.mean(centered * centered, axis=2, keepdims=True)
    rstd = 1.0 / np.sqrt(var + eps)
    y = (centered * rstd).reshape((N, C) + input.shape[2:])
    if weight is not None:
        y *= _per_channel(weight, y.ndim)
    if bias is not None:
        y += _per_channel(bias, y.ndim)
    np.copyto(out0, y, casting="unsafe")
    np.copyto(out1, mean.reshape(out1.shape), casting="unsafe")
    np.copyto(out2, rstd.reshape(out2.shape), casting="unsafe")
