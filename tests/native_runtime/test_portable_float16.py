"""float16 in the portable C++ reductions, matrix products and normalizations, held to the
NumPy kernels of the same keys (which compute float16 in float32, ATen's CPU opmath, and
round once into out).

Tolerance: both sides accumulate in float32 but in another order (NumPy pairwise or BLAS,
the C++ kernels in double or their own blocked GEMM), so a float16 result may land on the
other side of a rounding boundary: at most 1 float16 ulp apart. Accumulating in float16
instead is caught by the long sums (4096 ones sum to 2048 in float16). Maxima, minima,
indices and any/all are exact: they compare the same values.
"""

from __future__ import annotations

import numpy as np
import pytest

from opforge.kernels.portable import portable_kernels
from opforge.runtime.native import NativeLibrary

RNG = np.random.default_rng(4416)
F16 = np.float16


@pytest.fixture(scope="module")
def lib(native_runtime):
    return NativeLibrary(native_runtime.portable_library)


@pytest.fixture(scope="module")
def numpy_kernels():
    return portable_kernels()


def run_both(lib, numpy_kernels, key, args, outs):
    """(NumPy's outs, the C++ kernel's outs) for ``args`` (outs at the ``outs`` indices)."""
    mine = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    theirs = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    with np.errstate(all="ignore"):
        numpy_kernels[key](*theirs)
    lib.kernel(key)(*mine)
    return [theirs[i] for i in outs], [mine[i] for i in outs]


def check(lib, numpy_kernels, key, args, outs, exact=False):
    for want, got in zip(*run_both(lib, numpy_kernels, key, args, outs)):
        assert got.shape == want.shape and got.dtype == want.dtype, (key, got.dtype, want.dtype)
        if exact or want.dtype != F16:
            assert got.tobytes() == want.tobytes(), (key, got, want)
        else:
            np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
            finite = ~np.isnan(want)
            np.testing.assert_array_max_ulp(got[finite], want[finite], maxulp=1)


def half(shape, nan=False):
    x = RNG.standard_normal(shape).astype(F16)
    if nan:
        x.flat[5] = np.nan
    return x


def reduced(shape, dims, keepdim):
    dims = range(len(shape)) if not dims else [d % len(shape) for d in dims]
    return tuple((1 if i in dims else n) for i, n in enumerate(shape) if keepdim or i not in dims)


DIMS = [[-1], [0, 2], None, [1, 2]]


@pytest.mark.parametrize("dims", DIMS, ids=str)
@pytest.mark.parametrize("keepdim", [False, True])
def test_sum_mean_prod(lib, numpy_kernels, dims, keepdim):
    x = half((3, 4, 5))
    shape = reduced(x.shape, dims, keepdim)
    check(lib, numpy_kernels, "aten::sum.IntList_out", [x, dims, keepdim, None, np.empty(shape, F16)], [4])
    check(lib, numpy_kernels, "aten::mean.out", [x, dims, keepdim, None, np.empty(shape, F16)], [4])
    # a float32 out of a float16 sum (dtype=float32): computed in float32, no float16 rounding
    check(lib, numpy_kernels, "aten::sum.IntList_out",
          [x, dims, keepdim, np.float32, np.empty(shape, np.float32)], [4], exact=False)
    check(lib, numpy_kernels, "aten::prod.out", [x[0, 0], None, np.empty((), F16)], [2])


def test_long_sums_accumulate_in_float32(lib, numpy_kernels):
    x = np.ones((2, 4096), F16)
    for key, args in (("aten::sum.IntList_out", [x, [-1], False, None, np.empty(2, F16)]),
                      ("aten::mean.out", [x[:, ::2], [-1], False, None, np.empty(2, F16)])):
        want, got = run_both(lib, numpy_kernels, key, args, [4])
        assert got[0].tobytes() == want[0].tobytes()
    assert got[0][0] == 1.0 and want[0][0] == 1.0
    sums = run_both(lib, numpy_kernels, "aten::sum.IntList_out", [x, [-1], False, None, np.empty(2, F16)], [4])
    assert sums[1][0].tolist() == [4096.0, 4096.0]  # float16 accumulation stalls at 2048


@pytest.mark.parametrize("nan", [False, True])
def test_extremes_and_indices_are_exact(lib, numpy_kernels, nan):
    x = half((4, 6, 5), nan=nan)
    x[1, 2, :] = x[1, 2, 0]  # ties: the first wins
    for key in ("aten::amax.out", "aten::amin.out"):
        check(lib, numpy_kernels, key, [x, [1], False, np.empty((4, 5), F16)], [3], exact=True)
    for key in ("aten::max.unary_out", "aten::min.unary_out"):
        check(lib, numpy_kernels, key, [x, np.empty((), F16)], [1], exact=True)
    for key in ("aten::argmax.out", "aten::argmin.out"):
        check(lib, numpy_kernels, key, [x, -1, False, np.empty((4, 6), np.int64)], [3], exact=True)
        check(lib, numpy_kernels, key, [x, None, False, np.empty((), np.int64)], [3], exact=True)
    for key in ("aten::max.dim_max", "aten::min.dim_min"):
        check(lib, numpy_kernels, key, [x, 2, True, np.empty((4, 6, 1), F16),
                                        np.empty((4, 6, 1), np.int64)], [3, 4], exact=True)
    check(lib, numpy_kernels, "aten::any.dims_out", [x, [0], False, np.empty((6, 5), np.bool_)], [3], exact=True)
    check(lib, numpy_kernels, "aten::all.all_out", [x, np.empty((), np.bool_)], [1], exact=True)


def test_strided_half_input(lib, numpy_kernels):
    x = half((6, 8)).T[::2]  # transposed and stepped: the float32 copy follows the strides
    check(lib, numpy_kernels, "aten::sum.IntList_out", [x, [0], False, None, np.empty(6, F16)], [4])
    check(lib, numpy_kernels, "aten::amax.out", [x, [1], True, np.empty((4, 1), F16)], [3], exact=True)


@pytest.mark.parametrize("correction", [0, 1])
def test_moments(lib, numpy_kernels, correction):
    x = half((3, 40))
    check(lib, numpy_kernels, "aten::var.correction_out", [x, [-1], correction, False, np.empty(3, F16)], [4])
    check(lib, numpy_kernels, "aten::std.correction_out", [x, [-1], correction, True, np.empty((3, 1), F16)], [4])
    check(lib, numpy_kernels, "aten::var_mean.correction_out",
          [x, [0], correction, False, np.empty(40, F16), np.empty(40, F16)], [4, 5])


@pytest.mark.parametrize("ord", [2.0, 1.0, float("inf"), 0.0, 3.0])
def test_logsumexp_and_norms(lib, numpy_kernels, ord):
    x = half((4, 33))
    check(lib, numpy_kernels, "aten::linalg_vector_norm.out", [x, ord, [-1], False, None, np.empty(4, F16)], [5])
    check(lib, numpy_kernels, "aten::linalg_vector_norm.out",
          [x.astype(np.float32), ord, [-1], False, F16, np.empty(4, F16)], [5])
    check(lib, numpy_kernels, "aten::logsumexp.out", [x, [1], False, np.empty(4, F16)], [3])
