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

from tests.native_runtime._portable_compare import lib, numpy_kernels, run_both  # noqa: F401 (fixtures)

RNG = np.random.default_rng(4416)
F16 = np.float16


def check(lib, numpy_kernels, key, args, outs, exact=False):
    for want, got in run_both(lib, numpy_kernels, key, args, outs):
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
        ((want, got),) = run_both(lib, numpy_kernels, key, args, [4])
        assert got.tobytes() == want.tobytes()
    assert got[0] == 1.0 and want[0] == 1.0
    ((_, sums),) = run_both(lib, numpy_kernels, "aten::sum.IntList_out", [x, [-1], False, None, np.empty(2, F16)], [4])
    assert sums.tolist() == [4096.0, 4096.0]  # float16 accumulation stalls at 2048


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


# --- matrix products, normalizations, softmax (kernels/half_compute.h) ---------------------


@pytest.mark.parametrize("key,shapes", [
    ("aten::mm.out", [(5, 300), (300, 7)]),            # 300 terms: float16 sums would drift
    ("aten::bmm.out", [(2, 4, 33), (2, 33, 6)]),
    ("aten::matmul.out", [(3, 4, 16), (16, 5)]),
    ("aten::dot.out", [(257,), (257,)]),
])
def test_products(lib, numpy_kernels, key, shapes):
    a, b = (half(s) for s in shapes)
    out = np.empty(np.matmul(a, b).shape, F16)
    check(lib, numpy_kernels, key, [a, b, out], [2])


def test_addmm_and_linear(lib, numpy_kernels):
    x, w, bias = half((6, 40)), half((9, 40)), half((9,))
    check(lib, numpy_kernels, "aten::addmm.out", [bias, x, w.T, 0.5, 2.0, np.empty((6, 9), F16)], [5])
    check(lib, numpy_kernels, "aten::baddbmm.out",
          [half((2, 3, 4)), half((2, 3, 8)), half((2, 8, 4)), 1.0, 1.0, np.empty((2, 3, 4), F16)], [5])
    # NumPy's linear rounds the product into out, then adds the bias in float16 (two roundings,
    # the C++ kernel one): still at most 1 ulp apart
    check(lib, numpy_kernels, "aten::linear.out", [half((2, 3, 40)), w, bias, np.empty((2, 3, 9), F16)], [3])
    check(lib, numpy_kernels, "aten::linear.out", [x, w, None, np.empty((6, 9), F16)], [3])


def test_long_products_accumulate_in_float32(lib, numpy_kernels):
    a, b = np.ones((1, 4096), F16), np.ones((4096, 2), F16)
    ((want, got),) = run_both(lib, numpy_kernels, "aten::mm.out", [a, b, np.empty((1, 2), F16)], [2])
    assert got.tolist() == want.tolist() == [[4096.0, 4096.0]]


def test_mixed_float16_and_float32_products_are_refused(lib):
    from opforge.errors import KernelError

    with pytest.raises(KernelError, match="one dtype"):
        lib.kernel("aten::mm.out")(half((2, 3)), np.ones((3, 2), np.float32), np.empty((2, 2), F16))


def test_normalizations(lib, numpy_kernels):
    x = half((2, 5, 48))
    w, b = half((48,)), half((48,))
    check(lib, numpy_kernels, "aten::native_layer_norm.out",
          [x, [48], w, b, 1e-5, np.empty_like(x), np.empty((2, 5, 1), F16), np.empty((2, 5, 1), F16)],
          [5, 6, 7])
    image = half((2, 6, 4, 4))
    c = lambda: half((6,))  # noqa: E731
    check(lib, numpy_kernels, "aten::_native_batch_norm_legit_no_training.out",
          [image, c(), c(), c(), np.abs(c()) + F16(0.5), 0.1, 1e-5, np.empty_like(image),
           np.empty(0, F16), np.empty(0, F16)], [7])
    check(lib, numpy_kernels, "aten::_native_batch_norm_legit.no_stats_out",
          [image, c(), c(), True, 0.1, 1e-5, np.empty_like(image), np.empty(6, F16), np.empty(6, F16)],
          [6, 7, 8])
    check(lib, numpy_kernels, "aten::native_group_norm.out",
          [image, c(), c(), 2, 6, 16, 3, 1e-5, np.empty_like(image), np.empty((2, 3), F16),
           np.empty((2, 3), F16)], [8, 9, 10])


@pytest.mark.parametrize("key", ["aten::_softmax.out", "aten::_log_softmax.out"])
def test_softmax(lib, numpy_kernels, key):
    x = half((3, 7, 50)) * F16(4)
    check(lib, numpy_kernels, key, [x, -1, False, np.empty_like(x)], [3])
    check(lib, numpy_kernels, key, [x, 1, False, np.empty_like(x)], [3])
