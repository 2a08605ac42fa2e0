"""Activations and clamps: relu, gelu (erf and tanh), silu, hardtanh, clamp, leaky_relu, …

Everything computes in the output's dtype; float16 evaluates elementwise in float32 where
the formula has several steps (ATen's CPU kernels do the same through their "opmath" type).
"""

from __future__ import annotations

import math

import numpy as np

from opforge.errors import KernelError
from opforge.kernels.portable._erf import erf
from opforge.kernels.portable._promotion import accumulate_dtype, result_type
from opforge.kernels.portable._registry import Kernel, kernel_decorator
from opforge.kernels.portable.arithmetic import as_operand

__all__ = ["KERNELS"]

KERNELS: dict[str, Kernel] = {}
kernel = kernel_decorator(KERNELS)


def _opmath(x: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``x`` in the dtype a multi-step formula should run in for ``out``."""
    return x.astype(accumulate_dtype(out.dtype), copy=False)


@kernel("aten::relu.out")
def relu_out(self, out):
    np.maximum(self, as_operand(0, self.dtype), out=out, casting="unsafe")  # NaN stays NaN


@kernel("aten::hardtanh.out")
def hardtanh_out(self, min_val, max_val, out):
    _clamp(self, min_val, max_val, out)


def _clamp(self, low, high, out) -> None:
    ct = result_type(self, low, high)
    x = self
    if low is not None:
        np.maximum(x, as_operand(low, ct), out=out, dtype=ct, casting="unsafe")
        x = out
    if high is not None:
        np.minimum(x, as_operand(high, ct), out=out, dtype=ct, casting="unsafe")
    elif low is None:
        raise KernelError(
            "`aten::clamp.out`: min and max — both are None — "
            "at least one bound is needed — pass min, max or both"
        )


@kernel("aten::clamp.out", "aten::clamp.Tensor_out")
def clamp_out(self, min, max, out):  # noqa: A002 - the schema's argument names
    # min(max(x, lo), hi): with lo > hi every element becomes hi, as in ATen.
    _clamp(self, min, max, out)


@kernel("aten::clamp_min.out", "aten::clamp_min.Tensor_out")
def clamp_min_out(self, min, out):  # noqa: A002
    _clamp(self, min, None, out)


@kernel("aten::clamp_max.out", "aten::clamp_max.Tensor_out")
def clamp_max_out(self, max, out):  # noqa: A002
    _clamp(self, None, max, out)


@kernel("aten::gelu.out")
def gelu_out(self, approximate, out):
    x = _opmath(self, out)
    if approximate == "none":
        # 0.5 x (1 + erf(x / sqrt 2)), erf in float64 to < 1e-14 (see _erf).
        y = x * (0.5 * (1.0 + erf(x * (1.0 / math.sqrt(2.0)))))
    elif approximate == "tanh":
        inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)
        y = 0.5 * x * (1.0 + np.tanh(inner))
    else:
        raise KernelError(
            f"`aten::gelu.out`: approximate={approximate!r} — is not a GELU approximation — "
            "valid: 'none', 'tanh' — pass one of these"
        )
    np.copyto(out, y, casting="unsafe")


@kernel("aten::silu.out")
def silu_out(self, out):
    x = _opmath(self, out)
    with np.errstate(over="ignore"):
        np.copyto(out, x / (1.0 + np.exp(-x)), casting="unsafe")


@kernel("aten::leaky_relu.out")
def leaky_relu_out(self, negative_slope, out):
    x = _opmath(self, out)
    np.copyto(out, np.where(x > 0, x, x * negative_slope), casting="unsafe")


@kernel("aten::elu.out")
def elu_out(self, alpha, scale, input_scale, out):
    x = _opmath(self, out)
    with np.errstate(over="ignore"):
        negative = alpha * np.expm1(x * input_scale)
    np.copyto(out, scale * np.where(x > 0, x, negative), casting="unsafe")


@kernel("aten::hardsigmoid.out")
def hardsigmoid_out(self, out):
    x = _opmath(self, out)
    np.copyto(out, np.clip(x + 3.0, 0.0, 6.0) / 6.0, casting="unsafe")


@kernel("aten::hardswish.out")
def hardswish_out(self, out):
    x = _opmath(self, out)
    np.copyto(out, x * np.clip(x + 3.0, 0.0, 6.0) / 6.0, casting="unsafe")


@kernel("aten::softplus.out")
def softplus_out(self, beta, threshold, out):
    x = _opmath(self, out)
    bx = x * beta
    with np.errstate(over="ignore"):
        soft = np.log1p(np.exp(bx)) / beta
    np.copyto(out, np.where(bx > threshold, x, soft), casting="unsafe")
