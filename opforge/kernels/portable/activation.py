"""Activations and clamps: relu, gelu (erf and tanh), silu, hardtanh, clamp, leaky_relu, …

Everything computes in the output's dtype; float16 evaluates elementwise in float32 where
the formula has several steps (ATen's CPU kernels do the same through their "opmath" type).

Bound (see ``_binding``): relu and the clamps are one or two ufuncs with their bounds
folded; GELU runs as a fixed list of ufunc steps into scratch buffers — for float32 the
exact (erf) form looks the normal CDF up in a table (``_normal_cdf``, error < 1e-7), for
float64 it keeps the general kernel's float64 erf; the tanh form uses
``0.5 (1 + tanh z) = 1 / (1 + exp(-2 z))``.
"""

from __future__ import annotations

import math

import numpy as np

from opforge.errors import KernelError
from opforge.kernels.portable._binding import fold_scalar, separate, steps, ufunc_step
from opforge.kernels.portable._erf import erf
from opforge.kernels.portable._normal_cdf import normal_cdf_steps
from opforge.kernels.portable._promotion import accumulate_dtype, result_type
from opforge.kernels.portable._registry import Kernel, binder_for, kernel_decorator
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


# --- bind-time fast paths -------------------------------------------------------------------

@binder_for(relu_out)
def _bind_relu(args):
    self, out = args
    return steps([ufunc_step(np.maximum, self, np.zeros((), self.dtype), out,
                             dtype=self.dtype)], out)


def _bind_clamp(self, low, high, out, kernel, args):
    if (low is None and high is None) or (isinstance(low, np.ndarray) and low.ndim) or \
            (isinstance(high, np.ndarray) and high.ndim):
        return kernel, args  # tensor bounds: the general kernel
    ct = result_type(self, low, high)
    pairs, x = [], self
    if low is not None:
        pairs.append(ufunc_step(np.maximum, x, fold_scalar(low, ct), out, dtype=ct))
        x = out
    if high is not None:
        pairs.append(ufunc_step(np.minimum, x, fold_scalar(high, ct), out, dtype=ct))
    return steps(pairs, out)


@binder_for(hardtanh_out)
def _bind_hardtanh(args):
    return _bind_clamp(*args, hardtanh_out, args)


@binder_for(clamp_out)
def _bind_clamp_both(args):
    return _bind_clamp(*args, clamp_out, args)


@binder_for(clamp_min_out)
def _bind_clamp_min(args):
    self, low, out = args
    return _bind_clamp(self, low, None, out, clamp_min_out, args)


@binder_for(clamp_max_out)
def _bind_clamp_max(args):
    self, high, out = args
    return _bind_clamp(self, None, high, out, clamp_max_out, args)


@binder_for(gelu_out)
def _bind_gelu(args):
    self, approximate, out = args
    ct = out.dtype
    if self.dtype != ct or ct not in (np.float32, np.float64) or not separate([out], self):
        return gelu_out, args
    if approximate == "tanh":
        # 0.5 (1 + tanh z) = sigmoid(2 z): y = x / (1 + exp(-2 z)), z = c (x + 0.044715 x^3).
        # NumPy's exp is ~2x faster than its tanh; the two forms agree to a few float32
        # ulp. exp overflows (quietly, to the exact -0 result) for x below about -10.
        s = np.empty(self.shape, ct)
        c = math.sqrt(2.0 / math.pi)
        cubic, linear = np.asarray(-2 * c * 0.044715, ct), np.asarray(-2 * c, ct)
        return steps([
            (np.multiply, (self, self, s)), (np.multiply, (s, cubic, s)),
            (np.add, (s, linear, s)), (np.multiply, (s, self, s)),
            (np.exp, (s, s)), (np.add, (s, np.ones((), ct), s)), (np.divide, (self, s, out)),
        ], out, quiet=True)
    if approximate == "none" and ct == np.float32:
        return steps(normal_cdf_steps(self, out))
    return gelu_out, args
