"""Helpers of the portable C++ elementwise kernels' tests: random values with special
values, a bit-for-bit (or ulp) comparison, and running a C++ kernel beside the NumPy kernel
of the same key (the specification)."""

from __future__ import annotations

import numpy as np
import pytest

from opforge.errors import KernelError
from opforge.kernels.portable import portable_kernels

SPEC = portable_kernels()

DTYPES = ["bool", "uint8", "int8", "int32", "int64", "float32", "float64"]
INTS = ["uint8", "int8", "int32", "int64"]
FLOATS = ["float32", "float64"]

# (self shape, other shape): equal, broadcast both ways, zero-dim, empty, size-1 dims
SHAPES = [((), ()), ((7,), (7,)), ((3, 4), (4,)), ((4,), (3, 4)), ((2, 1, 5), (3, 1)),
          ((3, 4), ()), ((), (2, 3)), ((0, 3), (3,)), ((1, 1), (1, 6)), ((37,), (1,)),
          ((2, 3, 70), (2, 3, 70))]


def values(dtype: str, shape: tuple, rng: np.random.Generator, *, special: bool = True,
           nonzero: bool = False) -> np.ndarray:
    """Random values of ``dtype``; floats mix in NaN, +-inf, +-0 and extremes."""
    dt = np.dtype(dtype)
    if dt == np.bool_:
        a = rng.integers(0, 2, shape).astype(bool)
        return np.ones(shape, bool) if nonzero else a
    if dt.kind in "iu":
        info = np.iinfo(dt)
        a = np.asarray(rng.integers(max(info.min, -100), min(info.max, 100), shape,
                                    endpoint=True)).astype(dt)
        if special and a.size > 4:
            flat = a.reshape(-1)
            flat[0], flat[1] = info.min, info.max
            if dt.kind == "i":
                flat[2] = -1
        if nonzero:
            a[a == 0] = 3
        return a
    a = np.asarray(rng.standard_normal(shape) * 4).astype(dt)
    if special and a.size > 8:
        flat = a.reshape(-1)
        specials = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 1e-30, -1e30, 2.5], dt)
        flat[rng.permutation(flat.size)[:8]] = specials
    if nonzero:
        a[a == 0] = 1.5
    return a


def same(got: np.ndarray, want: np.ndarray, ulps: int = 0, what: str = "") -> None:
    """Equal dtype and values: floats bit for bit (NaN as NaN; -0.0 is not 0.0), or
    within ``ulps`` units in the last place."""
    assert got.dtype == want.dtype and got.shape == want.shape, what
    if got.dtype.kind != "f":
        np.testing.assert_array_equal(got, want, err_msg=what)
        return
    nan_got, nan_want = np.isnan(got), np.isnan(want)
    np.testing.assert_array_equal(nan_got, nan_want, err_msg=f"{what}: NaN positions")
    g, w = got[~nan_got], want[~nan_want]
    if ulps == 0:
        bad = (g != w) | (np.signbit(g) != np.signbit(w))
    else:
        bits = {2: np.int16, 4: np.int32, 8: np.int64}[got.itemsize]
        gi, wi = g.view(bits).astype(np.int64), w.view(bits).astype(np.int64)
        # map the sign-magnitude bit patterns onto a line, so that adjacent floats differ by 1
        top = np.int64(np.iinfo(bits).min)
        gi = np.where(gi < 0, top - gi, gi)
        wi = np.where(wi < 0, top - wi, wi)
        bad = (np.abs(gi - wi) > ulps) & ~((g == w) & np.isinf(g))
    if bad.any():
        i = np.flatnonzero(bad)[:5]
        raise AssertionError(f"{what}: {bad.sum()} of {bad.size} differ, e.g. got {g[i]} want {w[i]}")


def compare(lib, key: str, *args, ulps: int = 0, out_dtype=None, out_shape=None) -> None:
    """Run the NumPy and the C++ kernel of ``key`` on ``args`` (the out is appended, with
    the dtype the NumPy kernel's caller would plan); both refuse or both agree."""
    if out_dtype is None or out_shape is None:
        raise ValueError("give the out's dtype and shape")
    want = np.full(out_shape, 7, out_dtype)
    got = want.copy()
    try:
        SPEC[key](*args, want)
    except TypeError as e:
        if "Cannot cast ufunc" in str(e):
            # NumPy's same-kind rule, not an ATen refusal: add's alpha product of an int8
            # 0-d tensor in a uint8 computation (ATen wraps it, as the C++ kernel does)
            lib.kernel(key)(*args, got)
            return "spec-limit"
        with pytest.raises(KernelError):
            lib.kernel(key)(*args, got)
        return type(e)
    except Exception as e:  # noqa: BLE001 - any refusal of the spec
        with pytest.raises(KernelError):
            lib.kernel(key)(*args, got)
        return type(e)
    lib.kernel(key)(*args, got)
    same(got, want, ulps, f"{key} {[getattr(a, 'dtype', a) for a in args]}")
    return None


def torch_dtype_result(*arrays_and_scalars) -> np.dtype:
    from opforge.kernels.portable._promotion import result_type

    return result_type(*arrays_and_scalars)
