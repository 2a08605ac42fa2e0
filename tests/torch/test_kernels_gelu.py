"""Bound GELU (``_normal_cdf``'s tables for the erf form, exp steps for the tanh form)
against PyTorch eager and against the exact erf: every float dtype, sizes on both sides of
the small/large step variants and of the block size, non-contiguous inputs, special values.

Tolerances are those of test_kernels_unary.py (float32 3e-6, float16 2e-3, float64 1e-13);
the erf form is also held to its documented accuracy against ``math.erf``. Special values
are compared with GELU in float64 and stated values at ±inf and NaN, not with PyTorch's
float32/float16 result, which there depends on the CPU's code path (see kernel_check).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from opforge.kernels.portable import activation, portable_kernels
from opforge.kernels.portable._normal_cdf import TABLE32, TABLE64, phi

from kernel_check import float64_reference

KERNELS = portable_kernels()
GELU = KERNELS["aten::gelu.out"]
TOL = {np.float16: 2e-3, np.float32: 3e-6, np.float64: 1e-13}
FLOATS = [np.float32, np.float64, np.float16]


def bind(x, approximate, out):
    fn, args = GELU.bind((x, approximate, out))
    assert fn is not GELU, "the general kernel, not a fast path"
    return lambda: fn(*args)


def layout(shape, dtype, kind, seed, low=-7.0, high=7.0):
    """A ``kind`` array ("contiguous", "transposed", "strided", "sliced") of ``shape``."""
    rng = np.random.default_rng(seed)
    full = {"contiguous": shape, "transposed": shape[::-1],
            "strided": shape[:-1] + (shape[-1] * 2,), "sliced": (shape[0] + 3,) + shape[1:]}
    base = rng.uniform(low, high, full[kind]).astype(dtype)
    view = {"contiguous": base, "transposed": base.T, "strided": base[..., ::2],
            "sliced": base[3:]}[kind]
    assert view.shape == shape
    return view


SHAPES = [(1,), (7,), (4, 128), (3, 5, 7), (4095,), (4097,),
          (activation.GELU_BLOCK + 3,), (3, activation.GELU_BLOCK // 2 + 1)]


@pytest.mark.parametrize("kind", ["contiguous", "transposed", "strided", "sliced"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_bound_gelu_matches_torch(approximate, dtype, shape, kind):
    if kind == "transposed" and len(shape) == 1:
        kind = "strided"
    x = layout(shape, dtype, kind, seed=len(shape) + shape[-1])
    expected = torch.nn.functional.gelu(torch.from_numpy(x), approximate=approximate).numpy()
    general = np.empty(shape, dtype)
    GELU(x, approximate, general)
    out = np.empty(shape, dtype)
    call = bind(x, approximate, out)
    for _ in range(2):  # the second call runs over garbage left in out
        call()
        np.testing.assert_allclose(out, expected, rtol=TOL[dtype], atol=TOL[dtype])
        np.testing.assert_allclose(out, general, rtol=TOL[dtype], atol=TOL[dtype])
        out.fill(7)
    x[...] = -x  # new input values through the same bound buffers
    call()
    expected = torch.nn.functional.gelu(torch.from_numpy(x), approximate=approximate).numpy()
    np.testing.assert_allclose(out, expected, rtol=TOL[dtype], atol=TOL[dtype])


SPECIALS = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-30, -1e-30, 1e-40, 5.9999, 6.0, -6.0,
            -6.0009765625, 7.9, 8.0, -8.0, 88.0, -104.0, 1e4, -1e4, 3e38, -3e38]
# GELU at +inf is +inf. At -inf it is NaN: PyTorch computes x·Phi(x) = -inf·0 in every dtype
# (the limit would be 0), and the portable kernel, tested against PyTorch, does the same.
GELU_AT_INF, GELU_AT_NEG_INF = np.inf, np.nan


@pytest.mark.parametrize("size", [1, 4096, activation.GELU_BLOCK + 1])
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_bound_gelu_special_values(approximate, dtype, size):
    values = np.array(SPECIALS, np.float64)
    with np.errstate(over="ignore"):
        x = np.resize(values.astype(dtype), size) if size > 1 else values.astype(dtype)
    def gelu(t):
        return torch.nn.functional.gelu(t, approximate=approximate)

    expected = float64_reference(gelu, x, GELU_AT_INF, GELU_AT_NEG_INF).numpy()
    out = np.empty_like(x)
    with np.errstate(all="ignore"):
        bind(x, approximate, out)()
    np.testing.assert_array_equal(np.isnan(out), np.isnan(expected))
    np.testing.assert_allclose(out, expected, rtol=TOL[dtype], atol=TOL[dtype])
    # Where no intermediate can overflow, PyTorch in the tested dtype is held to as well.
    ordinary = np.isfinite(x) & (np.abs(x) <= 1e4)
    in_dtype = gelu(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(out[ordinary], in_dtype[ordinary], rtol=TOL[dtype],
                               atol=TOL[dtype])
    finite_negative = np.isfinite(x) & (x < -20)  # far below: exactly 0, not |x| * tiny
    assert np.all(out[finite_negative] == 0)


def reference_gelu(x: np.ndarray) -> np.ndarray:
    return np.array([v * phi(v) for v in x.astype(np.float64).tolist()])


@pytest.mark.parametrize("size", [999, 40_000])  # the small and the blocked step lists
def test_float32_erf_form_is_within_its_error_bound(size):
    rng = np.random.default_rng(size)
    x = np.concatenate([rng.uniform(-9, 9, size - 3), [0.5, -0.25, 6 - 2 ** -12]])
    x = x.astype(np.float32)
    out = np.empty_like(x)
    bind(x, "none", out)()
    exact = reference_gelu(x)
    # |Phi error| < 8e-8 (see _normal_cdf), plus the final rounding of y
    excess = np.abs(out - exact) - np.abs(x.astype(np.float64)) * 8e-8 - np.abs(exact) * 2 ** -24
    assert excess.max() <= 1e-13


@pytest.mark.parametrize("size", [999, 40_000])
def test_float64_erf_form_is_within_1e_15_of_erf(size):
    rng = np.random.default_rng(size)
    x = rng.uniform(-10, 10, size)
    x[:5] = [0.0, -8.0, 8.0, -7.999, 1e-300]
    out = np.empty_like(x)
    bind(x, "none", out)()
    exact = reference_gelu(x)
    assert np.max(np.abs(out - exact) / np.maximum(1.0, np.abs(x))) < 1.5e-15


@pytest.mark.parametrize("table", [TABLE32, TABLE64], ids=["float32", "float64"])
def test_tables_interpolate_phi_across_every_cell(table):
    # A point in every cell, the tail rows included: catches a row off by one.
    from opforge.kernels.portable._normal_cdf import _rows

    rows = _rows(table)
    k = table.cells
    u = 0.3
    j = np.arange(-k - 1, k + 1)
    x = (j + u) / table.cells_per_unit
    value = sum(rows[:, p] * u ** p for p in range(table.degree + 1))
    exact = np.array([phi(v) if -table.limit <= v < table.limit else float(v > 0)
                      for v in x.tolist()])
    assert np.abs(value - exact).max() < (2e-8 if table is TABLE32 else 1e-15)


def test_odd_inputs_fall_back_to_the_general_kernel():
    x = np.ones(4, np.float32)
    assert GELU.bind((x, "none", x))[0] is GELU  # in place: out aliases the input
    assert GELU.bind((x, "cubic", np.empty(4, np.float32)))[0] is GELU
    assert GELU.bind((x.astype(np.int32), "none", np.empty(4, np.int32)))[0] is GELU

