"""Activations and clamps: relu, gelu (erf and tanh), silu, hardtanh, clamp, leaky_relu, …

Everything computes in the output's dtype; float16 evaluates elementwise in float32 where
the formula has several steps (ATen's CPU kernels do the same through their "opmath" type).

Bound (see ``_binding``): relu and the clamps are one or two ufuncs with their bounds
folded; GELU runs as a fixed list of ufunc steps into scratch buffers, for every float
dtype — the exact (erf) form looks the normal CDF up in a table of per-cell polynomials
(``_normal_cdf``: |error| < 8e-8 for float16/32, < 1e-15 for float64), the tanh form uses
``0.5 (1 + tanh z) = 1 / (1 + exp(-2 z))`` — and a large tensor runs in cache-sized blocks.
"""

from __future__ import annotations

import math
from functools import partial

import numpy as np

from opforge.errors import KernelError
from opforge.kernels.portable import _binding
from opforge.kernels.portable._binding import (
    constant_operand, prepares, separate, steps, ufunc_step,
)
from opforge.kernels.portable._erf import erf
from opforge.kernels.portable._normal_cdf import gelu_erf_scratch, gelu_erf_steps
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
    zeros = constant_operand(0, self.dtype, out.shape)
    return steps([ufunc_step(np.maximum, self, zeros, out, dtype=self.dtype)], out)


@prepares(_bind_relu)
def _prepare_relu(bound):
    # one step at every size (not cut into chunks) against a prefix of the zeros at the
    # upper bound: only the zeros' view depends on the size
    self, out = bound
    fn, bound_args = _bind_relu(bound)
    if _binding.NUM_THREADS > 1 or len(bound_args) != 3 or bound_args[0] is not self or \
            bound_args[2] is not out:
        return None
    zeros = bound_args[1].reshape(-1)
    return lambda args: (fn, (args[0], zeros[:args[1].size].reshape(args[1].shape), args[1]))


def _bound(value, ct: np.dtype, out: np.ndarray) -> np.ndarray:
    """A clamp bound as a full-shape constant (see ``constant_operand``); a 0-d array
    bound stays as it is (a program input: its value may change between calls)."""
    if isinstance(value, np.ndarray):
        return value
    return constant_operand(value, ct, out.shape)


def _bind_clamp(self, low, high, out, kernel, args):
    if (low is None and high is None) or (isinstance(low, np.ndarray) and low.ndim) or \
            (isinstance(high, np.ndarray) and high.ndim):
        return kernel, args  # tensor bounds: the general kernel
    ct = result_type(self, low, high)
    pairs, x = [], self
    if low is not None:
        pairs.append(ufunc_step(np.maximum, x, _bound(low, ct, out), out, dtype=ct))
        x = out
    if high is not None:
        pairs.append(ufunc_step(np.minimum, x, _bound(high, ct, out), out, dtype=ct))
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


# Elements per block of a bound GELU on a large tensor: each block runs the whole step list
# while its scratch (40 bytes an element for float32, 90 for float64) stays in cache, and
# its 10-20 ufunc calls cost little next to the block's work. Measured on the 2-core
# benchmark machine, 1M elements, erf form: float32 5.7 ms whole, 3.4 / 3.1 / 3.0 ms in
# blocks of 16K / 32K / 64K; float64 24 ms whole, ~10 ms in blocks (tanh form: 2.4 ms
# whole, 2.2 ms in blocks).
GELU_BLOCK = 1 << 15


def _blocked(self: np.ndarray, out: np.ndarray, make_scratch, make_steps, *,
             quiet: bool = False, elementwise: bool = False) -> tuple:
    """The steps of ``make_steps(x, out, scratch, large=...)`` over the whole op: at most
    GELU_BLOCK elements in one piece, else in blocks of GELU_BLOCK (a non-contiguous input
    first copied into a contiguous buffer). ``make_scratch(shape)`` allocates the scratch,
    once; ``large`` is true from 4096 elements.

    ``elementwise`` steps (every array shaped like out) stay whole when threads are on and
    the op is large enough to split: ``steps`` then cuts them into one chunk per thread."""
    threaded = _binding.NUM_THREADS > 1 and out.size >= _binding.PARALLEL_MIN
    if self.size <= GELU_BLOCK or (elementwise and threaded):
        pairs = make_steps(self, out, make_scratch(self.shape), large=self.size >= 4096)
        return steps(pairs, out if elementwise else None, quiet=quiet)
    pairs = []
    if not self.flags.c_contiguous:
        contiguous = np.empty(self.shape, self.dtype)
        pairs.append((np.copyto, (contiguous, self)))
        self = contiguous
    x, y = self.reshape(-1), out.reshape(-1)
    scratch = make_scratch((GELU_BLOCK,))
    for lo in range(0, x.size, GELU_BLOCK):
        hi = min(lo + GELU_BLOCK, x.size)
        block = tuple(a[:hi - lo] for a in scratch)
        pairs += make_steps(x[lo:hi], y[lo:hi], block, large=True)
    return steps(pairs, quiet=quiet)


def _gelu_tanh_scratch(shape: tuple, dtype: np.dtype) -> tuple[np.ndarray, ...]:
    ct = accumulate_dtype(dtype)
    return (np.empty(shape, ct),) + ((np.empty(shape, ct),) if ct != dtype else ())


def _gelu_tanh_steps(x: np.ndarray, out: np.ndarray, scratch: tuple, *,
                     large: bool = False) -> list[tuple]:
    # 0.5 (1 + tanh z) = sigmoid(2 z): y = x / (1 + exp(-2 z)), z = c (x + 0.044715 x^3).
    # NumPy's exp is ~2x faster than its tanh; the two forms agree to a few float32
    # ulp. exp overflows (quietly, to the exact -0 result) for x below about -10.
    s = scratch[0]
    ct = s.dtype
    pairs = []
    if len(scratch) > 1:  # float16: evaluate in float32, round once into out
        pairs.append((np.copyto, (scratch[1], x)))
        x = scratch[1]
    c = math.sqrt(2.0 / math.pi)
    cubic, linear = np.asarray(-2 * c * 0.044715, ct), np.asarray(-2 * c, ct)
    divide = np.divide if out.dtype == ct else _divide_rounding
    return pairs + [
        (np.multiply, (x, x, s)), (np.multiply, (s, cubic, s)),
        (np.add, (s, linear, s)), (np.multiply, (s, x, s)),
        (np.exp, (s, s)), (np.add, (s, np.ones((), ct), s)), (divide, (x, s, out)),
    ]


def _divide_rounding(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    np.divide(a, b, out=out, casting="same_kind")


@binder_for(gelu_out)
def _bind_gelu(args):
    self, approximate, out = args
    ct = out.dtype
    if self.dtype != ct or ct not in (np.float16, np.float32, np.float64) or \
            approximate not in ("none", "tanh") or not out.flags.c_contiguous or \
            not separate([out], self):
        return gelu_out, args
    if approximate == "tanh":
        return _blocked(self, out, partial(_gelu_tanh_scratch, dtype=ct), _gelu_tanh_steps,
                        quiet=True, elementwise=True)
    return _blocked(self, out, partial(gelu_erf_scratch, dtype=ct), gelu_erf_steps)
