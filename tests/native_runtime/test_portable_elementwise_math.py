"""The portable C++ unary math and activation kernels against the NumPy kernels of the same
keys (test_portable_elementwise.py holds the binary, comparison and logical families, the
key set and the whole programs): every function over the dtypes, zero-dim, empty and strided
tensors and special values; the transcendental functions within the stated ulps of NumPy's
SIMD loops; GELU within the reference's own error; float16 through float32.
"""

from __future__ import annotations

import numpy as np
import pytest

from opforge.errors import KernelError
from opforge.runtime.native import NativeLibrary
from tests.native_runtime.elementwise_support import DTYPES, INTS, SPEC, compare, values


@pytest.fixture(scope="module")
def lib(native_runtime):
    return NativeLibrary(native_runtime.portable_library)


# --- unary math -------------------------------------------------------------------------------

# ulps allowed between the C++ kernel and NumPy's float32 loop, per function. The C++
# kernels use glibc (<= 1 ulp for these float32 functions; exp/sigmoid: elementwise_math's
# exp, <= 1 ulp measured) and NumPy its own SIMD loops on this machine (exp <= 2 ulp, atan2
# 3 ulp measured), so each bound is NumPy's error + the C++ kernel's + 1 for reciprocal and
# add steps rounded after them (sigmoid: 1/(1 + e)).
TRANSCENDENTAL = {"exp": 3, "exp2": 3, "expm1": 3, "log": 3, "log2": 3, "log10": 3, "log1p": 3,
                  "sin": 3, "cos": 3, "tan": 4, "tanh": 3, "asin": 3, "acos": 3, "atan": 3,
                  "sinh": 3, "cosh": 3, "sigmoid": 4}
EXACT_UNARY = ["sqrt", "reciprocal", "rsqrt", "neg", "abs", "sign", "floor", "ceil", "round",
               "trunc", "isnan", "isinf"]


def unary_out_dtype(name: str, x: np.ndarray) -> np.dtype:
    if name in ("isnan", "isinf"):
        return np.dtype(bool)
    if name in ("neg", "abs", "sign", "floor", "ceil", "round", "trunc"):
        return x.dtype
    return x.dtype if x.dtype.kind == "f" else np.dtype(np.float32)


@pytest.mark.parametrize("name", sorted(TRANSCENDENTAL) + EXACT_UNARY + ["erf"])
def test_unary(lib, name):
    rng = np.random.default_rng(10)
    ulps = TRANSCENDENTAL.get(name, 0)
    for dtype in DTYPES:
        for shape in [(), (0,), (5, 33), (3, 1, 8)]:
            x = values(dtype, shape, rng)
            if dtype.startswith("float") and x.size > 20:  # the functions' interesting ranges
                x.reshape(-1)[:10] = np.array([0.5, -0.5, 1.0, -1.0, 1e-7, 88.0, -88.0, 100, 710, -750],
                                               np.float64).astype(dtype)
            if name == "erf":
                check_erf(lib, x, unary_out_dtype(name, x))
                continue
            compare(lib, f"aten::{name}.out", x, out_dtype=unary_out_dtype(name, x),
                    out_shape=shape, ulps=ulps)
    x = values("float32", (4, 6), rng)[:, ::2]  # strided, and into a float64 out (computed in float64)
    if name == "erf":
        check_erf(lib, x, np.dtype(np.float64))
        return
    compare(lib, f"aten::{name}.out", x, out_dtype="float64" if name not in ("isnan", "isinf") else "bool",
            out_shape=x.shape, ulps=ulps)


def check_erf(lib, x: np.ndarray, out: np.dtype) -> None:
    # The NumPy kernel's erf is within 3e-15 of erf, absolutely (its docstring; erf(0) is
    # 3e-16 there), glibc's within 1 ulp: both round into out once.
    want, got = np.empty(x.shape, out), np.empty(x.shape, out)
    SPEC["aten::erf.out"](x, want)
    lib.kernel("aten::erf.out")(x, got)
    np.testing.assert_allclose(got, want, rtol=np.finfo(out).eps, atol=4e-15)


def test_exp_range(lib):
    """The vectorized float32 exp over its whole range, subnormal results and overflow."""
    x = np.concatenate([np.linspace(-110, 95, 200_001, dtype=np.float32),
                        np.array([np.nan, np.inf, -np.inf, 0.0, -0.0], np.float32)])
    compare(lib, "aten::exp.out", x, out_dtype="float32", out_shape=x.shape, ulps=3)
    compare(lib, "aten::sigmoid.out", x, out_dtype="float32", out_shape=x.shape, ulps=4)
    # tanh: its polynomial below 0.625, 1 - 2 / (exp(2|x|) + 1) above, tiny values, -0.0
    t = np.concatenate([np.linspace(-12, 12, 100_001, dtype=np.float32),
                        np.geomspace(1e-30, 1, 10_000, dtype=np.float32),
                        -np.geomspace(1e-30, 1, 1_000, dtype=np.float32), x[-5:]])
    compare(lib, "aten::tanh.out", t, out_dtype="float32", out_shape=t.shape, ulps=3)


def test_round_decimals(lib):
    rng = np.random.default_rng(11)
    for dtype in ["float32", "float64"]:
        x = values(dtype, (50,), rng) * 37
        for decimals in [0, 1, 2, 5, -1, -2]:
            compare(lib, "aten::round.decimals_out", x, decimals, out_dtype=dtype, out_shape=x.shape)
    i = values("int32", (9,), rng)
    compare(lib, "aten::round.decimals_out", i, 2, out_dtype="int32", out_shape=i.shape)
    with pytest.raises(TypeError):  # NumPy cannot cast its float64 quotient into the int out
        SPEC["aten::round.decimals_out"](i, -1, np.empty(9, np.int32))
    with pytest.raises(KernelError, match="decimals"):
        lib.kernel("aten::round.decimals_out")(i, -1, np.empty(9, np.int32))


def test_integer_neg_abs_wrap(lib):
    for dt in INTS:
        info = np.iinfo(dt)
        x = np.array([info.min, info.max, 0, 1, -1 if dt != "uint8" else 2], dt)
        for name in ["neg", "abs", "sign"]:
            compare(lib, f"aten::{name}.out", x, out_dtype=dt, out_shape=x.shape)


# --- activations --------------------------------------------------------------------------------

def gelu_close(got: np.ndarray, want: np.ndarray, x: np.ndarray, approximate: str) -> None:
    """GELU's tolerance. The NumPy kernel computes 0.5 x (1 + erf(x / sqrt 2)) with its erf
    3e-15 off (absolute), and 0.5 x (1 + tanh z) in float32; both cancel for x << 0, where
    1 + erf and 1 + tanh are tiny, so the reference itself is off by |x| times that error
    there (measured: millions of ulp near x = -8). The C++ kernel is within 1 ulp of the
    exact x Phi(x) (erf form) and computes x / (1 + exp(-2z)) (tanh form, no cancellation).
    Allowed: 2 ulp of the result plus |x| times the reference's absolute error (3e-15 in
    erf; float32's 6e-8 in tanh near -1, doubled)."""
    assert got.dtype == want.dtype
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    g, w, xs = got[~nan].astype(np.float64), want[~nan].astype(np.float64), x[~nan].astype(np.float64)
    spacing = np.spacing(np.abs(want[~nan])).astype(np.float64)
    ref_error = 3e-15 if approximate == "none" else (2 * 6e-8 if got.dtype == np.float32 else 4e-16)
    with np.errstate(invalid="ignore"):
        bad = ~(np.abs(g - w) <= 2 * spacing + np.abs(xs) * ref_error) & ~(g == w)
    assert not bad.any(), (xs[bad][:5], g[bad][:5], w[bad][:5])


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_gelu(lib, approximate, dtype):
    rng = np.random.default_rng(12)
    x = np.concatenate([np.linspace(-20, 20, 100_001), rng.standard_normal(10_000) * 3,
                        [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-30, -1e-30]]).astype(dtype)
    want, got = np.empty_like(x), np.empty_like(x)
    SPEC["aten::gelu.out"](x, approximate, want)
    lib.kernel("aten::gelu.out")(x, approximate, got)
    gelu_close(got, want, x, approximate)
    xi = values("int32", (5, 4), rng)  # integer input into a float32 out
    want, got = np.empty((5, 4), np.float32), np.empty((5, 4), np.float32)
    SPEC["aten::gelu.out"](xi, approximate, want)
    lib.kernel("aten::gelu.out")(xi, approximate, got)
    gelu_close(got, want, xi, approximate)
    with pytest.raises(KernelError, match="approximation"):
        lib.kernel("aten::gelu.out")(x, "fast", got.reshape(-1)[:0].reshape(0) if False else np.empty_like(x))


CLAMPS = [("aten::hardtanh.out", (-1, 1)), ("aten::hardtanh.out", (-0.5, 2.5)),
          ("aten::clamp.out", (None, 3)), ("aten::clamp.out", (-2.5, None)),
          ("aten::clamp.out", (2, -2)), ("aten::clamp.out", (float("nan"), 1)),
          ("aten::clamp_min.out", (0.0,)), ("aten::clamp_max.out", (-0.0,)),
          ("aten::clamp_min.out", (True,)), ("aten::clamp_max.out", (300,))]


@pytest.mark.parametrize("dtype", DTYPES)
def test_relu_and_clamps(lib, dtype):
    from opforge.kernels.portable._promotion import result_type

    rng = np.random.default_rng(13)
    for shape in [(), (0, 2), (4, 17)]:
        x = values(dtype, shape, rng)
        compare(lib, "aten::relu.out", x, out_dtype=dtype, out_shape=shape)
        for key, bounds in CLAMPS:
            compare(lib, key, x, *bounds, out_dtype=result_type(x, *bounds), out_shape=shape)
    x = values(dtype, (3, 4), rng)
    lo, hi = values(dtype, (4,), rng), values("float32", (3, 1), rng)
    for key, args in [("aten::clamp.Tensor_out", (lo, hi)), ("aten::clamp.Tensor_out", (None, hi)),
                      ("aten::clamp.Tensor_out", (lo, None)), ("aten::clamp_min.Tensor_out", (lo,)),
                      ("aten::clamp_max.Tensor_out", (hi,))]:
        compare(lib, key, x, *args, out_dtype=result_type(x, *args),
                out_shape=np.broadcast_shapes(x.shape, *[a.shape for a in args if a is not None]))
    assert compare(lib, "aten::clamp.out", x, None, None, out_dtype=dtype, out_shape=x.shape) \
        is KernelError


ACTIVATIONS = [("aten::silu.out", (), 4), ("aten::leaky_relu.out", (0.01,), 0),
               ("aten::leaky_relu.out", (2,), 0), ("aten::elu.out", (1.0, 1.0, 1.0), 3),
               ("aten::elu.out", (0.5, 2, 1.5), 3), ("aten::hardsigmoid.out", (), 0),
               ("aten::hardswish.out", (), 0), ("aten::softplus.out", (1.0, 20.0), 4),
               ("aten::softplus.out", (2, 5), 4)]


@pytest.mark.parametrize("key,params,ulps", ACTIVATIONS)
def test_activations(lib, key, params, ulps):
    """Computed in out's dtype; silu, elu and softplus go through exp/expm1/log1p (NumPy's
    SIMD loops against glibc and elementwise_math's exp: the ulps of test_unary)."""
    rng = np.random.default_rng(14)
    for dtype in ["float32", "float64"]:
        for shape in [(), (0,), (7, 33)]:
            x = values(dtype, shape, rng)
            compare(lib, key, x, *params, out_dtype=dtype, out_shape=shape, ulps=ulps)
    x = values("int8", (9,), rng)
    compare(lib, key, x, *params, out_dtype="float32", out_shape=x.shape, ulps=ulps)
    x = values("float32", (6, 8), rng)[::2, ::3]
    compare(lib, key, x, *params, out_dtype="float64", out_shape=x.shape, ulps=ulps)


def test_float16(lib):
    """float16 computes in float32 and rounds once into out, as NumPy's float16 loops do:
    bit for bit for + - * / and the comparisons; within 1 ulp of float16 where the float32
    value is itself a rounded one (exp, sigmoid, gelu: float64 -> float32 -> float16)."""
    rng = np.random.default_rng(16)
    a, b = values("float16", (4, 33), rng), values("float16", (33,), rng)
    a[0, :4], b[:4] = [-0.0, 0.0, -0.0, 1.0], [0.0, -0.0, -0.0, 1.0]  # ties of maximum / relu
    for key, args in [("aten::add.out", (a, b, 1)), ("aten::sub.out", (a, b, 2)),
                      ("aten::mul.out", (a, b)), ("aten::div.out", (a, b)),
                      ("aten::maximum.out", (a, b)), ("aten::minimum.out", (a, b)),
                      ("aten::mul.Scalar_out", (a, 2.5)), ("aten::clamp.out", (a, 0.0, None)),
                      ("aten::relu.out", (a,)), ("aten::neg.out", (a,)), ("aten::floor.out", (a,)),
                      ("aten::hardtanh.out", (a, -1, 1))]:
        compare(lib, key, *args, out_dtype="float16", out_shape=(4, 33))
    compare(lib, "aten::lt.Tensor_out", a, b, out_dtype="bool", out_shape=(4, 33))
    compare(lib, "aten::add.out", a, values("float32", (33,), rng), 1, out_dtype="float32",
            out_shape=(4, 33))
    for key, args in [("aten::exp.out", (a,)), ("aten::sigmoid.out", (a,)), ("aten::tanh.out", (a,)),
                      ("aten::gelu.out", (a, "none")), ("aten::silu.out", (a,))]:
        compare(lib, key, *args, out_dtype="float16", out_shape=(4, 33), ulps=1)
