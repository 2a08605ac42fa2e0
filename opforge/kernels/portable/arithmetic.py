"""Binary arithmetic: add, sub, rsub, mul, div (all rounding modes), pow, remainder, atan2, …

Each kernel computes in the dtype ATen promotes its operands to (``_promotion``) and
lets the ufunc cast into ``out`` (``casting="unsafe"``), so ``int + 0.5`` computes in
float32 and ``bool + bool`` is a logical or, as in ATen. Broadcasting is NumPy's, which
is ATen's. Scalars are converted to the compute dtype first: NumPy 2 refuses a Python
int that does not fit the array's dtype, ATen wraps it.

Bound (see ``_binding``): promotion, scalar conversion and ``alpha`` are settled at load,
so an ``add`` of same-dtype tensors runs as the bare ``np.add(a, b, out)``. Integer
division, remainder and power keep their per-call checks (the general kernel).
"""

from __future__ import annotations

import numpy as np

from opforge.errors import KernelError
from opforge.kernels.portable._binding import fold_scalar, shape_generic, steps, ufunc_step
from opforge.kernels.portable._promotion import Operand, is_floating, result_type
from opforge.kernels.portable._registry import Kernel, binder_for, kernel_decorator

__all__ = ["KERNELS"]

KERNELS: dict[str, Kernel] = {}
kernel = kernel_decorator(KERNELS)


def as_operand(value: Operand, dtype: np.dtype) -> np.ndarray:
    """A tensor stays as it is; a Python scalar becomes a 0-d array of ``dtype``."""
    if isinstance(value, np.ndarray):
        return value
    return np.asarray(value).astype(dtype)


def _binary(ufunc: np.ufunc, a: Operand, b: Operand, out: np.ndarray,
            compute: np.dtype | None = None) -> None:
    ct = compute if compute is not None else result_type(a, b)
    with np.errstate(all="ignore"):
        ufunc(as_operand(a, ct), as_operand(b, ct), out=out, dtype=ct, casting="unsafe")


def _scaled(b: Operand, alpha: bool | int | float, ct: np.dtype) -> Operand:
    """``alpha * b`` in the compute dtype (skipped when alpha is 1, the common case)."""
    if alpha == 1:  # also True and 1.0: the identity
        return b
    with np.errstate(all="ignore"):
        return np.multiply(as_operand(b, ct), as_operand(alpha, ct), dtype=ct)


@kernel("aten::add.out", "aten::add.Scalar_out")
def add_out(self, other, alpha, out):
    ct = result_type(self, other)
    _binary(np.add, self, _scaled(other, alpha, ct), out, ct)


@kernel("aten::sub.out", "aten::sub.Scalar_out")
def sub_out(self, other, alpha, out):
    ct = result_type(self, other)
    _binary(np.subtract, self, _scaled(other, alpha, ct), out, ct)


@kernel("aten::rsub.Tensor_out", "aten::rsub.Scalar_out")
def rsub_out(self, other, alpha, out):
    ct = result_type(self, other)
    _binary(np.subtract, other, _scaled(self, alpha, ct), out, ct)


@kernel("aten::mul.out", "aten::mul.Scalar_out")
def mul_out(self, other, out):
    _binary(np.multiply, self, other, out)


def _true_divide_dtype(a: Operand, b: Operand) -> np.dtype:
    ct = result_type(a, b)
    return ct if is_floating(ct) else np.dtype(np.float32)


def _check_integer_divisor(b: Operand, ct: np.dtype, api: str) -> None:
    if not is_floating(ct) and np.any(as_operand(b, ct) == 0):
        raise KernelError(
            f"`{api}`: integer division — a divisor is zero — "
            "integer division needs non-zero divisors — mask the zeros or divide in floating point"
        )


def _divide(self: Operand, other: Operand, rounding_mode: str | None, out: np.ndarray,
            api: str) -> None:
    if rounding_mode is None:
        _binary(np.true_divide, self, other, out, _true_divide_dtype(self, other))
        return
    ct = result_type(self, other)
    if rounding_mode == "floor":
        _check_integer_divisor(other, ct, api)
        _binary(np.floor_divide, self, other, out, ct)
    elif rounding_mode == "trunc":
        _check_integer_divisor(other, ct, api)
        a, b = as_operand(self, ct), as_operand(other, ct)
        with np.errstate(all="ignore"):
            if is_floating(ct):
                np.trunc(np.true_divide(a, b, dtype=ct), out=out, casting="unsafe")
            else:
                # floor quotient, then step towards zero where the remainder is non-zero
                # and the operands' signs differ: C's truncating integer division.
                q = np.floor_divide(a, b, dtype=ct)
                q += ((a - q * b) != 0) & ((a < 0) != (b < 0))
                np.copyto(out, q, casting="unsafe")
    else:
        raise KernelError(
            f"`{api}`: rounding_mode={rounding_mode!r} — is not a rounding mode — "
            "valid: None, 'trunc', 'floor' — pass one of these"
        )


@kernel("aten::div.out", "aten::div.Scalar_out")
def div_out(self, other, out):
    _divide(self, other, None, out, "aten::div.out")


@kernel("aten::div.out_mode", "aten::div.Scalar_mode_out")
def div_mode_out(self, other, rounding_mode, out):
    _divide(self, other, rounding_mode, out, "aten::div.out_mode")


@kernel("aten::floor_divide.out", "aten::floor_divide.Scalar_out")
def floor_divide_out(self, other, out):
    _divide(self, other, "floor", out, "aten::floor_divide.out")


@kernel("aten::pow.Tensor_Tensor_out", "aten::pow.Tensor_Scalar_out", "aten::pow.Scalar_out")
def pow_out(self, exponent, out):
    ct = result_type(self, exponent)
    if not is_floating(ct) and np.any(as_operand(exponent, ct) < 0):
        if not isinstance(exponent, np.ndarray):  # ATen refuses only a scalar exponent
            raise KernelError(
                "`aten::pow.out`: integer power — a negative exponent of an integer base — "
                "integer bases need exponents >= 0 — cast the base to a floating dtype"
            )
        # ATen's integer pow with a negative exponent: 1 for base 1, +-1 for base -1 by
        # the exponent's parity, 0 for every other base (1 / b**|e| truncated).
        base, e = np.broadcast_arrays(as_operand(self, ct), as_operand(exponent, ct))
        negative = e < 0
        with np.errstate(all="ignore"):
            result = np.power(base, np.where(negative, 0, e), dtype=ct)
        at_negative = np.where(base == 1, 1, np.where(base == -1, 1 - 2 * (e & 1), 0))
        np.copyto(out, np.where(negative, at_negative, result), casting="unsafe")
        return
    _binary(np.power, self, exponent, out, ct)


@kernel("aten::remainder.Tensor_out", "aten::remainder.Scalar_out",
        "aten::remainder.Scalar_Tensor_out")
def remainder_out(self, other, out):
    ct = result_type(self, other)
    _check_integer_divisor(other, ct, "aten::remainder.out")
    _binary(np.remainder, self, other, out, ct)


@kernel("aten::fmod.Tensor_out", "aten::fmod.Scalar_out")
def fmod_out(self, other, out):
    ct = result_type(self, other)
    _check_integer_divisor(other, ct, "aten::fmod.out")
    _binary(np.fmod, self, other, out, ct)


@kernel("aten::maximum.out", "aten::max.out")
def maximum_out(self, other, out):
    _binary(np.maximum, self, other, out)


@kernel("aten::minimum.out", "aten::min.out")
def minimum_out(self, other, out):
    _binary(np.minimum, self, other, out)


@kernel("aten::atan2.out")
def atan2_out(self, other, out):
    # A floating op: integer and bool operands compute in float32, as in true division.
    _binary(np.arctan2, self, other, out, _true_divide_dtype(self, other))


# --- bind-time fast paths -------------------------------------------------------------------

def bind_binary(ufunc: np.ufunc, a: Operand, b: Operand, out: np.ndarray,
                ct: np.dtype | None = None):
    """``ufunc(a, b) -> out`` computed in ``ct`` (ATen's promotion by default), bound."""
    ct = result_type(a, b) if ct is None else ct
    a, b = fold_scalar(a, ct), fold_scalar(b, ct)
    return steps([ufunc_step(ufunc, a, b, out, dtype=ct)], out)


def _bind_scaled(ufunc: np.ufunc, a: Operand, b: Operand, alpha, out: np.ndarray):
    """``ufunc(a, alpha * b) -> out``: alpha folded into a scalar ``b`` at bind, or
    applied into a scratch buffer allocated here for a tensor ``b``."""
    ct = result_type(a, b)
    if alpha == 1:
        return bind_binary(ufunc, a, b, out, ct)
    alpha = fold_scalar(alpha, ct)
    if not isinstance(b, np.ndarray) or b.ndim == 0:
        with np.errstate(all="ignore"):
            scaled = np.multiply(fold_scalar(b, ct), alpha, dtype=ct)
        return bind_binary(ufunc, a, np.asarray(scaled), out, ct)
    scratch = np.empty(b.shape, ct)
    a = fold_scalar(a, ct)
    return steps([ufunc_step(np.multiply, b, alpha, scratch, dtype=ct),
                  ufunc_step(ufunc, a, scratch, out, dtype=ct)], out)


@binder_for(add_out)
@shape_generic
def _bind_add(args):
    self, other, alpha, out = args
    return _bind_scaled(np.add, self, other, alpha, out)


@binder_for(sub_out)
@shape_generic
def _bind_sub(args):
    self, other, alpha, out = args
    return _bind_scaled(np.subtract, self, other, alpha, out)


@binder_for(rsub_out)
@shape_generic
def _bind_rsub(args):
    self, other, alpha, out = args
    return _bind_scaled(np.subtract, other, self, alpha, out)


def _simple(kernel: Kernel, ufunc: np.ufunc) -> None:
    @binder_for(kernel)
    @shape_generic
    def bind(args):
        self, other, out = args
        return bind_binary(ufunc, self, other, out)


_simple(mul_out, np.multiply)
_simple(maximum_out, np.maximum)
_simple(minimum_out, np.minimum)


@binder_for(div_out)
@shape_generic
def _bind_div(args):
    self, other, out = args
    return bind_binary(np.true_divide, self, other, out, _true_divide_dtype(self, other))


@binder_for(atan2_out)
@shape_generic
def _bind_atan2(args):
    self, other, out = args
    return bind_binary(np.arctan2, self, other, out, _true_divide_dtype(self, other))


def _bind_floating_only(kernel: Kernel, ufunc: np.ufunc) -> None:
    """Floating operands need no per-call check; integer ones keep the general kernel's."""
    @binder_for(kernel)
    @shape_generic
    def bind(args):
        self, other, out = args
        ct = result_type(self, other)
        if not is_floating(ct):
            return kernel, args
        return bind_binary(ufunc, self, other, out, ct)


_bind_floating_only(floor_divide_out, np.floor_divide)
_bind_floating_only(pow_out, np.power)
_bind_floating_only(remainder_out, np.remainder)
_bind_floating_only(fmod_out, np.fmod)


@binder_for(div_mode_out)
def _bind_div_mode(args):
    self, other, rounding_mode, out = args
    ct = result_type(self, other)
    if rounding_mode is None:
        return _bind_div((self, other, out))
    if is_floating(ct) and rounding_mode == "floor":
        return bind_binary(np.floor_divide, self, other, out, ct)
    if is_floating(ct) and rounding_mode == "trunc" and out.dtype == ct \
            and not any(isinstance(v, np.ndarray) and np.may_share_memory(v, out)
                        for v in (self, other)):
        a, b = fold_scalar(self, ct), fold_scalar(other, ct)
        return steps([ufunc_step(np.true_divide, a, b, out, dtype=ct),
                      (np.trunc, (out, out))], out)
    return div_mode_out, args
