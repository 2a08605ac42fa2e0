"""Pointwise math on one tensor: neg, abs, exp, log, sqrt, rsqrt, erf, trig, rounding,
isnan/isinf, …

Floating ops on integer or bool inputs compute in float32 (ATen's default dtype) and
write whatever floating dtype ``out`` has; float16 computes through NumPy's float16 loops,
which — like ATen's CPU kernels — evaluate each element in float32 and round once.

Bound (see ``_binding``), each op is its bare ufunc with the compute dtype settled at load.
"""

from __future__ import annotations

import numpy as np

from opforge.kernels.portable._binding import shape_generic, steps, ufunc_step
from opforge.kernels.portable._erf import erf
from opforge.kernels.portable._promotion import float_compute_dtype, is_floating
from opforge.kernels.portable._registry import Kernel, binder_for, kernel_decorator

__all__ = ["KERNELS"]

KERNELS: dict[str, Kernel] = {}
kernel = kernel_decorator(KERNELS)


def _compute_dtype(self: np.ndarray, out: np.ndarray) -> np.dtype:
    return out.dtype if is_floating(out.dtype) else float_compute_dtype(self.dtype)


def _floating(name: str, ufunc: np.ufunc) -> None:
    """Register ``aten::<name>.out`` as a floating ufunc (int inputs -> float32)."""

    def floating_out(self, out):
        with np.errstate(all="ignore"):
            ufunc(self, out=out, dtype=_compute_dtype(self, out), casting="unsafe")

    @binder_for(floating_out)
    @shape_generic  # decisions by dtype only
    def bind(args):
        self, out = args
        return steps([ufunc_step(ufunc, self, out, dtype=_compute_dtype(self, out))], out)

    floating_out.__name__ = floating_out.__qualname__ = f"{name}_out"
    kernel(f"aten::{name}.out")(floating_out)


for _name, _ufunc in (
    ("exp", np.exp), ("exp2", np.exp2), ("expm1", np.expm1), ("log", np.log),
    ("log2", np.log2), ("log10", np.log10), ("log1p", np.log1p), ("sqrt", np.sqrt),
    ("sin", np.sin), ("cos", np.cos), ("tan", np.tan), ("tanh", np.tanh),
    ("asin", np.arcsin), ("acos", np.arccos), ("atan", np.arctan),
    ("sinh", np.sinh), ("cosh", np.cosh), ("reciprocal", np.reciprocal),
):
    _floating(_name, _ufunc)


def _nan_to_zero(out: np.ndarray) -> None:
    """ATen's sign is (x > 0) - (x < 0), 0 for NaN; NumPy's np.sign(NaN) is NaN."""
    np.nan_to_num(out, copy=False, nan=0.0, posinf=np.inf, neginf=-np.inf)


def _same_dtype(name: str, ufunc: np.ufunc) -> None:
    """Register ``aten::<name>.out`` for ops that keep integer dtypes integer."""

    def same_dtype_out(self, out):
        if self.dtype == np.bool_:  # sign(bool) is the identity (ATen refuses neg/abs)
            np.copyto(out, self, casting="unsafe")
            return
        with np.errstate(all="ignore"):
            ufunc(self, out=out, casting="unsafe")
        if ufunc is np.sign and is_floating(out.dtype):
            _nan_to_zero(out)

    @binder_for(same_dtype_out)
    @shape_generic  # decisions by dtype only
    def bind(args):
        self, out = args
        if self.dtype != out.dtype or self.dtype == np.bool_:
            return same_dtype_out, args
        pairs = [(ufunc, (self, out))]
        if ufunc is np.sign and is_floating(out.dtype):
            pairs.append((_nan_to_zero, (out,)))
        return steps(pairs, out)

    same_dtype_out.__name__ = same_dtype_out.__qualname__ = f"{name}_out"
    kernel(f"aten::{name}.out")(same_dtype_out)


for _name, _ufunc in (("neg", np.negative), ("abs", np.absolute), ("sign", np.sign)):
    _same_dtype(_name, _ufunc)


def _rounding(name: str, ufunc: np.ufunc) -> None:
    """floor/ceil/round/trunc: the identity on integer tensors, as in ATen."""

    def rounding_out(self, out):
        if is_floating(self.dtype):
            ufunc(self, out=out, casting="unsafe")
        else:
            np.copyto(out, self, casting="unsafe")

    @binder_for(rounding_out)
    @shape_generic  # decisions by dtype only
    def bind(args):
        self, out = args
        if not is_floating(self.dtype) or self.dtype != out.dtype:
            return rounding_out, args
        return steps([(ufunc, (self, out))], out)

    rounding_out.__name__ = rounding_out.__qualname__ = f"{name}_out"
    kernel(f"aten::{name}.out")(rounding_out)


# np.rint rounds half to even, like ATen's nearbyint-based round.
for _name, _ufunc in (("floor", np.floor), ("ceil", np.ceil), ("round", np.rint),
                      ("trunc", np.trunc)):
    _rounding(_name, _ufunc)


def _classify(name: str, ufunc: np.ufunc) -> None:
    """isnan/isinf: bool results; never true for integer and bool tensors."""

    def classify_out(self, out):
        if is_floating(self.dtype):
            ufunc(self, out=out, casting="unsafe")
        else:
            out.fill(False)

    @binder_for(classify_out)
    @shape_generic  # decisions by dtype only
    def bind(args):
        self, out = args
        if not is_floating(self.dtype) or out.dtype != np.bool_:
            return classify_out, args
        return steps([(ufunc, (self, out))], out)

    classify_out.__name__ = classify_out.__qualname__ = f"{name}_out"
    kernel(f"aten::{name}.out")(classify_out)


for _name, _ufunc in (("isnan", np.isnan), ("isinf", np.isinf)):
    _classify(_name, _ufunc)


@kernel("aten::round.decimals_out")
def round_decimals_out(self, decimals, out):
    # ATen scales by 10**decimals, rounds half to even and scales back, as np.round does.
    np.round(self, decimals, out=out)


def _through_compute_dtype(fn, self, out, ct) -> None:
    """A several-step op into an integer ``out``: every step in ``ct``, one cast at the end,
    as the one-ufunc ops cast (the steps done in ``out`` rounded in between: rsqrt of 0.25
    took the reciprocal of int(0.5) = 0; fuzz/native_exec_fuzz.py's case 3420)."""
    computed = np.empty(out.shape, ct)
    fn(self, computed)
    with np.errstate(all="ignore"):  # NaN and out-of-range values: NumPy's (x86's) minimum
        np.copyto(out, computed, casting="unsafe")


@kernel("aten::rsqrt.out")
def rsqrt_out(self, out):
    ct = _compute_dtype(self, out)
    if out.dtype != ct:
        return _through_compute_dtype(rsqrt_out, self, out, ct)
    with np.errstate(all="ignore"):
        np.sqrt(self, out=out, dtype=ct, casting="unsafe")
        np.reciprocal(out, out=out)


@kernel("aten::erf.out")
def erf_out(self, out):
    # _erf computes in float64 (|error| < 1e-14), then rounds once into out.
    np.copyto(out, erf(self), casting="unsafe")


@kernel("aten::sigmoid.out")
def sigmoid_out(self, out):
    ct = _compute_dtype(self, out)
    if out.dtype != ct:
        return _through_compute_dtype(sigmoid_out, self, out, ct)
    # 1 / (1 + exp(-x)): exp overflows to inf for x << 0 and the result is the exact 0.
    with np.errstate(all="ignore"):
        np.negative(self, out=out, dtype=ct, casting="unsafe")
        np.exp(out, out=out)
        np.add(out, 1, out=out)
        np.reciprocal(out, out=out)


@binder_for(sigmoid_out)
def _bind_sigmoid(args):
    self, out = args
    ct = _compute_dtype(self, out)
    if out.dtype != ct:
        return sigmoid_out, args
    one = np.ones((), ct)
    # quiet: the overflow of exp(-x) for x << 0 is how the exact 0 comes out.
    return steps([ufunc_step(np.negative, self, out, dtype=ct), (np.exp, (out, out)),
                  (np.add, (out, one, out)), (np.reciprocal, (out, out))], out, quiet=True)


@binder_for(rsqrt_out)
def _bind_rsqrt(args):
    self, out = args
    ct = _compute_dtype(self, out)
    if out.dtype != ct:
        return rsqrt_out, args
    return steps([ufunc_step(np.sqrt, self, out, dtype=ct), (np.reciprocal, (out, out))], out)
