"""Portable unary-math and activation kernels (and the vectorised erf) against PyTorch.

Tolerances: NumPy and ATen use different libm implementations (ATen vectorises exp, log,
tanh with SLEEF-style polynomials), each accurate to ~1-2 ulp, so float32 allows 4 ulp
(rtol 5e-7 relative; 1e-6 with atol 1e-6 for results near zero). Multi-step formulas
(gelu, silu, softplus, …) round a few times: rtol/atol 3e-6. float64: 1e-12 (erf-based
GELU: 1e-13, the erf error bound). float16: 2e-3 (two float16 roundings). Special values
are compared with the op in float64 and stated values at ±inf and NaN, not with PyTorch's
float32 result, which there depends on the CPU's code path (see kernel_check).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from opforge.kernels.portable._erf import erf

from kernel_check import check_kernel, float64_reference, make_array

TOL = {np.float16: 2e-3, np.float32: 3e-6, np.float64: 1e-12}


CASES = [((4, 7), "contiguous"), ((3, 5), "transposed"), ((2, 3, 4), "strided"),
         ((0, 4), "contiguous"), ((), "contiguous")]
FLOATS = [np.float32, np.float64, np.float16]

# (name, torch function, input range)
FLOATING_OPS = [
    ("exp", torch.exp, (-5, 5)), ("exp2", torch.exp2, (-5, 5)),
    ("expm1", torch.expm1, (-3, 3)), ("log", torch.log, (0.1, 10)),
    ("log2", torch.log2, (0.1, 10)), ("log10", torch.log10, (0.1, 10)),
    ("log1p", torch.log1p, (-0.5, 5)), ("sqrt", torch.sqrt, (0, 10)),
    ("rsqrt", torch.rsqrt, (0.1, 10)), ("sin", torch.sin, (-4, 4)),
    ("cos", torch.cos, (-4, 4)), ("tan", torch.tan, (-1, 1)), ("tanh", torch.tanh, (-5, 5)),
    ("asin", torch.asin, (-0.9, 0.9)), ("acos", torch.acos, (-0.9, 0.9)),
    ("atan", torch.atan, (-4, 4)), ("sinh", torch.sinh, (-3, 3)),
    ("cosh", torch.cosh, (-3, 3)), ("reciprocal", torch.reciprocal, (0.2, 5)),
    ("sigmoid", torch.sigmoid, (-20, 20)), ("erf", torch.erf, (-4, 4)),
]


def make(shape, dtype, layout="contiguous", seed=0, low=-3.0, high=3.0):
    return make_array(shape, dtype, layout, seed, ints=(int(low), int(high)),
                      floats=(low, high))


def check(key, expected, *args, tol=None):
    check_kernel(key, expected, *args, tols=TOL, tol=tol)


@pytest.mark.parametrize("shape, layout", CASES)
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("name, fn, bounds", FLOATING_OPS, ids=[c[0] for c in FLOATING_OPS])
def test_floating_unary(name, fn, bounds, dtype, shape, layout):
    x, tx = make(shape, dtype, layout, seed=1, low=bounds[0], high=bounds[1])
    check(f"aten::{name}.out", fn(tx), x)


@pytest.mark.parametrize("name", ["exp", "sqrt", "sigmoid", "erf", "log1p"])
def test_floating_unary_on_integers_computes_in_float32(name):
    x, tx = make((3, 4), np.int64, seed=2, low=0, high=9)
    check(f"aten::{name}.out", getattr(torch, name)(tx), x)


@pytest.mark.parametrize("dtype", FLOATS + [np.int32, np.int64])
@pytest.mark.parametrize("name", ["neg", "abs", "sign", "floor", "ceil", "round", "trunc"])
def test_same_dtype_unary(name, dtype):
    x, tx = make((4, 6), dtype, "transposed", seed=3, low=-5, high=5)
    if dtype in FLOATS:
        x = np.asarray(np.round(x * 2) / 2, dtype)  # exact halves test round-half-even
        tx = torch.from_numpy(x)
    check(f"aten::{name}.out", getattr(torch, name)(tx), x)


def test_round_decimals():
    x, tx = make((5, 5), np.float64, seed=4)
    check("aten::round.decimals_out", torch.round(tx, decimals=2), x, 2)


# (name, torch function, extra kernel arguments, value at +inf, value at -inf); NaN gives NaN.
SPECIAL_OPS = [
    ("exp", torch.exp, (), np.inf, 0.0), ("tanh", torch.tanh, (), 1.0, -1.0),
    ("sigmoid", torch.sigmoid, (), 1.0, 0.0), ("erf", torch.erf, (), 1.0, -1.0),
    ("neg", torch.neg, (), -np.inf, np.inf), ("abs", torch.abs, (), np.inf, np.inf),
    ("relu", torch.relu, (), np.inf, 0.0),
    # -inf·Phi(-inf) = -inf·0: NaN in PyTorch in every dtype, and in the portable kernel
    ("gelu", torch.nn.functional.gelu, ("none",), np.inf, np.nan),
]


@pytest.mark.parametrize("name, fn, extra, at_inf, at_neg_inf", SPECIAL_OPS,
                         ids=[c[0] for c in SPECIAL_OPS])
def test_special_values(name, fn, extra, at_inf, at_neg_inf):
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 88.0, -104.0], np.float32)
    with np.errstate(all="ignore"):  # -inf·0 in gelu
        check(f"aten::{name}.out", float64_reference(fn, x, at_inf, at_neg_inf), x, *extra)
    finite = x[np.isfinite(x)]  # and PyTorch in float32 where the input is finite
    check(f"aten::{name}.out", fn(torch.from_numpy(finite)), finite, *extra)


@pytest.mark.parametrize("shape, layout", CASES)
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu(approximate, dtype, shape, layout):
    x, tx = make(shape, dtype, layout, seed=5, low=-6, high=6)
    tol = 1e-13 if dtype == np.float64 else None
    check("aten::gelu.out", torch.nn.functional.gelu(tx, approximate=approximate),
          x, approximate, tol=tol)


ACTIVATIONS = [
    ("relu", lambda t: torch.relu(t), ()),
    ("silu", lambda t: torch.nn.functional.silu(t), ()),
    ("hardtanh", lambda t: torch.nn.functional.hardtanh(t, -1.5, 2.0), (-1.5, 2.0)),
    ("hardtanh", lambda t: torch.nn.functional.hardtanh(t, 0.0, 6.0), (0.0, 6.0)),
    ("leaky_relu", lambda t: torch.nn.functional.leaky_relu(t, 0.1), (0.1,)),
    ("elu", lambda t: torch.nn.functional.elu(t, 0.7), (0.7, 1, 1)),
    ("hardsigmoid", lambda t: torch.nn.functional.hardsigmoid(t), ()),
    ("hardswish", lambda t: torch.nn.functional.hardswish(t), ()),
    ("softplus", lambda t: torch.nn.functional.softplus(t, 2.0, 5.0), (2.0, 5.0)),
]


@pytest.mark.parametrize("shape, layout", CASES[:4])
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("name, fn, extra", ACTIVATIONS,
                         ids=[f"{a[0]}{i}" for i, a in enumerate(ACTIVATIONS)])
def test_activation(name, fn, extra, dtype, shape, layout):
    x, tx = make(shape, dtype, layout, seed=6, low=-8, high=8)
    check(f"aten::{name}.out", fn(tx), x, *extra)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_relu_integers(dtype):
    x, tx = make((4, 4), dtype, seed=7, low=-5, high=5)
    check("aten::relu.out", torch.relu(tx), x)


@pytest.mark.parametrize("dtype", FLOATS + [np.int64])
@pytest.mark.parametrize("low, high", [(-1, 1), (None, 0.5), (-2, None), (2, -2), (0, 3.5)])
def test_clamp_scalar(dtype, low, high):
    x, tx = make((5, 3), dtype, "transposed", seed=8)
    check("aten::clamp.out", torch.clamp(tx, low, high), x, low, high)
    if low is not None:
        check("aten::clamp_min.out", torch.clamp_min(tx, low), x, low)
    if high is not None:
        check("aten::clamp_max.out", torch.clamp_max(tx, high), x, high)


@pytest.mark.parametrize("dtype", FLOATS + [np.int32])
def test_clamp_tensor(dtype):
    x, tx = make((4, 5), dtype, seed=9)
    lo, tlo = make((5,), dtype, seed=10, low=-2, high=0)
    hi, thi = make((4, 1), dtype, seed=11, low=0, high=2)
    check("aten::clamp.Tensor_out", torch.clamp(tx, tlo, thi), x, lo, hi)
    check("aten::clamp.Tensor_out", torch.clamp(tx, None, thi), x, None, hi)
    check("aten::clamp_min.Tensor_out", torch.clamp_min(tx, tlo), x, lo)


def test_clamp_propagates_nan():
    x = np.array([np.nan, 1.0, -5.0], np.float32)
    check("aten::clamp.out", torch.clamp(torch.from_numpy(x), -1, 1), x, -1, 1)
    check("aten::hardtanh.out", torch.nn.functional.hardtanh(torch.from_numpy(x)), x, -1, 1)


def test_erf_accuracy_float64():
    # The documented bound: |erf - reference| < 1e-14 (required: 1e-7).
    x = np.linspace(-8, 8, 200_001)
    ref = torch.erf(torch.from_numpy(x)).numpy()
    assert np.abs(erf(x) - ref).max() < 1e-14
    edge = np.array([0.0, 1e-300, 5.99999, 6.0, 6.00001, 30.0])
    assert np.abs(erf(edge) - np.array([math.erf(v) for v in edge])).max() < 1e-14
