"""The portable C++ matrix products, convolution, normalisations and softmax
(kernels/ops/{linalg,convolution,normalization,softmax}.cpp, kernels/gemm.cpp), loaded
through the kernel ABI bridge and held to the NumPy kernels of the same keys — the living
specification — and, for float32 products, to a float64 reference.

Tolerances:
- float32 GEMM and convolution against float64: |got - exact| <= 2 * K * eps32 * (|a| @ |b|)
  + tiny, the textbook bound for a K-term float sum (gamma_K ~ K * u, u = eps / 2), doubled
  for the rounding of the reference itself; K is the reduction length (a convolution's
  taps: C_in/groups * prod(kernel)). The blocked sum does better in practice, but any
  summation order must meet this.
- against the NumPy kernel: the two sum in different orders (OpenBLAS's blocks vs ours;
  NumPy's pairwise sums vs double accumulators), so rtol 1e-5 / atol 1e-5 for float32
  (~100 ulp on values of order 1, far below any real bug such as a wrong index or a
  dropped term, which moves results by O(1)), 1e-12 for float64; integer products exact.
"""

from __future__ import annotations

import numpy as np
import pytest

from opforge.errors import KernelError
from tests.native_runtime._portable_compare import lib, numpy_kernels, run_both  # noqa: F401 (fixtures)


RNG = np.random.default_rng(44)


def tol(dtype):
    return dict(rtol=1e-5, atol=1e-5) if dtype == np.float32 else dict(rtol=1e-12, atol=1e-12)


def check(lib, numpy_kernels, key, args, outs, exact=False):
    for want, got in run_both(lib, numpy_kernels, key, args, outs):
        assert got.shape == want.shape and got.dtype == want.dtype
        if exact:
            np.testing.assert_array_equal(got, want)
        else:
            np.testing.assert_allclose(got, want, equal_nan=True, **tol(want.dtype))


def gemm_bound(a64, b64, k):
    eps = np.finfo(np.float32).eps
    return 2 * max(k, 1) * eps * (np.abs(a64) @ np.abs(b64)) + 1e-30


def randn(shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


# --- the GEMM ---------------------------------------------------------------------------

GEMM_SHAPES = [(4, 64, 128), (128, 768, 768), (1, 768, 3072), (32, 64, 32), (1, 1, 1),
               (3, 5, 7), (257, 300, 129), (17, 1, 33), (9, 513, 5), (2, 3, 40)]


@pytest.mark.parametrize("m,k,n", GEMM_SHAPES)
@pytest.mark.parametrize("layout", ["rows", "b_transposed", "strided"])
def test_mm_float32_within_the_summation_bound(lib, m, k, n, layout):
    a, b = randn((m, k)), randn((k, n))
    if layout == "b_transposed":  # linear's weight view: columns contiguous
        b = np.ascontiguousarray(b.T).T
    elif layout == "strided":
        a = randn((m, 2 * k))[:, ::2]
        b = np.asfortranarray(b)
    out = np.full((m, n), np.nan, np.float32)  # NaN in out must not leak
    lib.kernel("aten::mm.out")(a, b, out)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    assert np.all(np.abs(out - exact) <= gemm_bound(a, b, k))


@pytest.mark.parametrize("m,k,n", [(4, 64, 128), (33, 17, 65), (1, 100, 1), (40, 300, 70)])
def test_mm_float64_and_the_numpy_kernel(lib, numpy_kernels, m, k, n):
    check(lib, numpy_kernels, "aten::mm.out",
          [randn((m, k), np.float64), randn((k, n), np.float64), np.empty((m, n))], [2])
    bt = np.ascontiguousarray(randn((n, k), np.float64)).T  # a transposed view
    check(lib, numpy_kernels, "aten::mm.out", [randn((m, k), np.float64), bt, np.empty((m, n))], [2])


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint8, np.bool_])
def test_mm_integers_wrap_exactly_as_numpy(lib, numpy_kernels, dtype):
    if dtype == np.bool_:
        a, b = RNG.random((5, 7)) < 0.3, RNG.random((7, 3)) < 0.3
    else:
        info = np.iinfo(dtype)
        a = RNG.integers(info.min // 2, info.max // 2, (5, 7), dtype=dtype, endpoint=True)
        b = RNG.integers(info.min // 2, info.max // 2, (7, 3), dtype=dtype, endpoint=True)
    check(lib, numpy_kernels, "aten::mm.out", [a, b, np.empty((5, 3), dtype)], [2], exact=True)


def test_empty_products(lib):
    out = np.full((3, 4), np.nan, np.float32)
    lib.kernel("aten::mm.out")(np.empty((3, 0), np.float32), np.empty((0, 4), np.float32), out)
    assert np.array_equal(out, np.zeros((3, 4), np.float32))  # K = 0: the empty sum
    lib.kernel("aten::mm.out")(np.empty((0, 5), np.float32), randn((5, 4)),
                               np.empty((0, 4), np.float32))
    lib.kernel("aten::bmm.out")(np.empty((0, 2, 3)), np.empty((0, 3, 4)), np.empty((0, 2, 4)))


@pytest.mark.parametrize("shape_a,shape_b", [((8, 32, 64), (8, 64, 32)), ((3, 1, 5), (3, 5, 7)),
                                             ((2, 9, 4), (2, 4, 1))])
def test_bmm(lib, numpy_kernels, shape_a, shape_b):
    a, b = randn(shape_a), randn(shape_b)
    check(lib, numpy_kernels, "aten::bmm.out",
          [a, b, np.empty(shape_a[:2] + shape_b[2:], np.float32)], [2])
    # a transposed batch (k^T of attention) too
    bt = np.ascontiguousarray(b.transpose(0, 2, 1)).transpose(0, 2, 1)
    check(lib, numpy_kernels, "aten::bmm.out",
          [a, bt, np.empty(shape_a[:2] + shape_b[2:], np.float32)], [2])


@pytest.mark.parametrize("shape_a,shape_b", [
    ((5,), (5,)), ((5,), (5, 3)), ((4, 5), (5,)), ((2, 3, 4, 5), (5, 6)), ((5,), (2, 5, 3)),
    ((2, 1, 4, 5), (3, 5, 2)), ((7, 4, 5), (5, 6))])
def test_matmul_shapes_broadcast_as_numpy(lib, numpy_kernels, shape_a, shape_b):
    a, b = randn(shape_a, np.float64), randn(shape_b, np.float64)
    out = np.empty(np.matmul(a, b).shape)
    check(lib, numpy_kernels, "aten::matmul.out", [a, b, out], [2])


def test_dot(lib, numpy_kernels):
    check(lib, numpy_kernels, "aten::dot.out", [randn(100), randn(100), np.empty((), np.float32)], [2])


@pytest.mark.parametrize("beta,alpha", [(1, 1), (0.5, 2.0), (0, 1), (1, -1.5)])
def test_addmm(lib, numpy_kernels, beta, alpha):
    self = randn((6,))
    if beta == 0:
        self[2] = np.nan  # beta == 0 ignores self, even its NaNs
    check(lib, numpy_kernels, "aten::addmm.out",
          [self, randn((5, 9)), randn((9, 6)), beta, alpha, np.empty((5, 6), np.float32)], [5])
    check(lib, numpy_kernels, "aten::baddbmm.out",
          [randn((2, 5, 6)), randn((2, 5, 9)), randn((2, 9, 6)), beta, alpha,
           np.empty((2, 5, 6), np.float32)], [5])


def test_addmm_integers_truncate_the_scalars(lib, numpy_kernels):
    a = RNG.integers(-9, 9, (4, 3))
    b = RNG.integers(-9, 9, (3, 5))
    check(lib, numpy_kernels, "aten::addmm.out",
          [RNG.integers(-9, 9, (5,)), a, b, 2.7, 3.2, np.empty((4, 5), np.int64)], [5], exact=True)


@pytest.mark.parametrize("shape", [(4, 64), (2, 3, 64), (1, 64), (0, 64)])
@pytest.mark.parametrize("bias", [True, False])
def test_linear(lib, numpy_kernels, shape, bias):
    w = randn((48, 64))
    check(lib, numpy_kernels, "aten::linear.out",
          [randn(shape), w, randn(48) if bias else None, np.empty(shape[:-1] + (48,), np.float32)], [3])


def test_products_refuse_mixed_dtypes_and_bad_shapes(lib):
    mm = lib.kernel("aten::mm.out")
    with pytest.raises(KernelError, match="one dtype"):
        mm(randn((2, 3)), randn((3, 4), np.float64), np.empty((2, 4), np.float32))
    with pytest.raises(KernelError, match="inner dimensions"):
        mm(randn((2, 3)), randn((4, 4)), np.empty((2, 4), np.float32))
    with pytest.raises(KernelError, match="out has shape"):
        mm(randn((2, 3)), randn((3, 4)), np.empty((2, 5), np.float32))
    with pytest.raises(KernelError, match="rank"):
        lib.kernel("aten::bmm.out")(randn((2, 3)), randn((3, 4)), np.empty((2, 4), np.float32))


def test_out_overlapping_an_operand_gets_the_product(lib):
    a = randn((6, 6))
    want = a @ a
    lib.kernel("aten::mm.out")(a, a.copy(), a)  # out is self
    np.testing.assert_allclose(a, want, rtol=1e-5, atol=1e-5)
    c, m1, m2 = randn((5, 7)), randn((5, 3)), randn((3, 7))
    want = 0.5 * c + 2.0 * (m1 @ m2)
    lib.kernel("aten::addmm.out")(c, m1, m2, 0.5, 2.0, c)  # an in-place addmm: out is self
    np.testing.assert_allclose(c, want, rtol=1e-5, atol=1e-5)


# --- convolution ------------------------------------------------------------------------

def conv_out_shape(x, w, stride, padding, dilation, transposed, output_padding, groups):
    spatial = w.ndim - 2
    batched = x.ndim == w.ndim
    xs = x.shape[2:] if batched else x.shape[1:]
    e = lambda v: tuple(v) * spatial if len(v) == 1 else tuple(v)
    s, p, d, op = e(stride), e(padding), e(dilation), e(output_padding)
    k = w.shape[2:]
    if transposed:
        size = tuple((i - 1) * s_ - 2 * p_ + d_ * (k_ - 1) + o_ + 1
                     for i, s_, p_, d_, k_, o_ in zip(xs, s, p, d, k, op))
        c = w.shape[1] * groups
    else:
        size = tuple((i + 2 * p_ - d_ * (k_ - 1) - 1) // s_ + 1
                     for i, s_, p_, d_, k_ in zip(xs, s, p, d, k))
        c = w.shape[0]
    return ((x.shape[0], c) if batched else (c,)) + size


CONVS = [  # x shape, w shape, stride, padding, dilation, transposed, output_padding, groups
    ((2, 3, 9, 10), (4, 3, 3, 3), [1], [1], [1], False, [0], 1),
    ((2, 3, 9, 10), (4, 3, 3, 3), [2, 1], [0, 2], [2, 1], False, [0], 1),
    ((1, 8, 7, 7), (16, 8, 1, 1), [1], [0], [1], False, [0], 1),      # 1x1: no columns
    ((1, 8, 7, 7), (16, 8, 1, 1), [2], [0], [1], False, [0], 1),      # strided 1x1
    ((2, 6, 8, 8), (6, 1, 3, 3), [1], [1], [1], False, [0], 6),       # depthwise
    ((2, 6, 9, 8), (6, 1, 3, 3), [2], [1], [2], False, [0], 6),       # depthwise, strided
    ((2, 6, 8, 8), (12, 1, 3, 3), [1], [1], [1], False, [0], 6),      # channel multiplier
    ((2, 6, 8, 8), (4, 3, 3, 3), [1], [0], [1], False, [0], 2),       # grouped
    ((3, 9, 8), (4, 3, 3, 3), [1], [4], [1], False, [0], 1),          # unbatched, wide pad
    ((2, 4, 20), (5, 4, 5), [3], [2], [1], False, [0], 1),            # 1-d
    ((1, 2, 5, 6, 7), (3, 2, 2, 3, 3), [1, 2, 1], [1], [1], False, [0], 1),  # 3-d
    ((1, 3, 1, 1), (4, 3, 1, 1), [1], [0], [1], False, [0], 1),       # 1x1 image
    ((2, 3, 5, 6), (3, 2, 3, 3), [2], [1], [1], True, [1], 1),        # transposed
    ((2, 4, 5, 6), (4, 1, 3, 3), [1], [0], [2], True, [0], 2),        # transposed, grouped
    ((2, 4, 7), (4, 3, 4), [2], [1], [1], True, [1], 1),              # transposed 1-d
]


@pytest.mark.parametrize("case", CONVS, ids=lambda c: f"{c[0]}x{c[1]}-s{c[2]}p{c[3]}d{c[4]}"
                         f"{'T' if c[5] else ''}g{c[7]}")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_convolution_against_the_numpy_kernel(lib, numpy_kernels, case, dtype):
    xs, ws, stride, padding, dilation, transposed, output_padding, groups = case
    x, w = randn(xs, dtype), randn(ws, dtype)
    bias = randn((w.shape[1] * groups if transposed else w.shape[0],), dtype)
    out = np.empty(conv_out_shape(x, w, stride, padding, dilation, transposed,
                                  output_padding, groups), dtype)
    check(lib, numpy_kernels, "aten::convolution.out",
          [x, w, bias, stride, padding, dilation, transposed, output_padding, groups, out], [9])


@pytest.mark.parametrize("case", [CONVS[0], CONVS[1], CONVS[7], CONVS[12]])
def test_convolution_float32_within_the_summation_bound(lib, numpy_kernels, case):
    """Against the NumPy kernel run in float64: K is the taps each output sums."""
    xs, ws, stride, padding, dilation, transposed, output_padding, groups = case
    x, w = randn(xs), randn(ws)
    shape = conv_out_shape(x, w, stride, padding, dilation, transposed, output_padding, groups)
    args = [None, stride, padding, dilation, transposed, output_padding, groups]
    exact, bound = np.empty(shape), np.empty(shape)
    numpy_kernels["aten::convolution.out"](x.astype(np.float64), w.astype(np.float64), *args, exact)
    numpy_kernels["aten::convolution.out"](np.abs(x).astype(np.float64),
                                           np.abs(w).astype(np.float64), *args, bound)
    got = np.empty(shape, np.float32)
    lib.kernel("aten::convolution.out")(x, w, *args, got)
    k = (w.shape[0] // groups if transposed else w.shape[1]) * int(np.prod(w.shape[2:]))
    assert np.all(np.abs(got - exact) <= 2 * k * np.finfo(np.float32).eps * bound + 1e-30)


def test_convolution_channels_last_tensors(lib, numpy_kernels):
    x = np.ascontiguousarray(randn((2, 9, 10, 3))).transpose(0, 3, 1, 2)   # NHWC memory
    for w_shape, groups in (((4, 3, 3, 3), 1), ((3, 1, 3, 3), 3), ((5, 3, 1, 1), 1)):
        w = randn(w_shape)
        k = w_shape[-1]
        out = np.empty((2, 9, 10, w_shape[0]), np.float32).transpose(0, 3, 1, 2)
        check(lib, numpy_kernels, "aten::convolution.out",
              [x, w, None, [1], [k // 2], [1], False, [0], groups, out], [9])
        # an out whose positions do not merge into one stride (W outermost)
        out = np.empty((2, 10, w_shape[0], 9), np.float32).transpose(0, 2, 3, 1)
        check(lib, numpy_kernels, "aten::convolution.out",
              [x, w, None, [1], [k // 2], [1], False, [0], groups, out], [9])


def test_convolution_refuses_bad_geometry(lib):
    conv = lib.kernel("aten::convolution.out")
    x, w = randn((1, 3, 8, 8)), randn((4, 3, 3, 3))
    with pytest.raises(KernelError, match="output spatial dim"):
        conv(x, w, None, [1], [1], [1], False, [0], 1, np.empty((1, 4, 7, 8), np.float32))
    with pytest.raises(KernelError, match="channels"):
        conv(x, w, None, [1], [1], [1], False, [0], 2, np.empty((1, 4, 8, 8), np.float32))
    with pytest.raises(KernelError, match="stride"):
        conv(x, w, None, [0], [1], [1], False, [0], 1, np.empty((1, 4, 8, 8), np.float32))
    # a hostile padding balanced by a dilation: the right output shape, an absurd workspace
    with pytest.raises(KernelError, match="memory limit"):
        conv(x, w, None, [1], [2**40], [2**40], False, [0], 1, np.empty((1, 4, 8, 8), np.float32))
    with pytest.raises(KernelError, match="float32 or float64"):
        conv(x.astype(np.int32), w.astype(np.int32), None, [1], [1], [1], False, [0], 1,
             np.empty((1, 4, 8, 8), np.int32))


# --- normalisation and softmax ----------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape,k", [((2, 5, 7), 1), ((2, 5, 7), 2), ((4, 768), 1), ((3,), 1)])
def test_layer_norm(lib, numpy_kernels, dtype, shape, k):
    x = randn(shape, dtype) * 3 + 1
    ns = list(shape[len(shape) - k:])
    keep = shape[:len(shape) - k] + (1,) * k
    for w, b in ((randn(ns, dtype), randn(ns, dtype)), (None, None)):
        check(lib, numpy_kernels, "aten::native_layer_norm.out",
              [x, ns, w, b, 1e-5, np.empty(shape, dtype), np.empty(keep, dtype),
               np.empty(keep, dtype)], [5, 6, 7])


def test_layer_norm_strided_input(lib, numpy_kernels):
    x = randn((6, 8, 4)).transpose(1, 0, 2)[:, ::2]  # not contiguous
    check(lib, numpy_kernels, "aten::native_layer_norm.out",
          [x, [3, 4], randn((3, 4)), None, 1e-5, np.empty(x.shape, np.float32),
           np.empty((8, 1, 1), np.float32), np.empty((8, 1, 1), np.float32)], [5, 6, 7])


@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (4, 3), (1, 3, 1, 1), (0, 3, 2, 2)])
def test_batch_norm_inference(lib, numpy_kernels, shape):
    c = shape[1]
    x = randn(shape)
    check(lib, numpy_kernels, "aten::_native_batch_norm_legit_no_training.out",
          [x, randn(c), randn(c), randn(c), np.abs(randn(c)) + 0.1, 0.1, 1e-5,
           np.empty(shape, np.float32), np.empty(0, np.float32), np.empty(0, np.float32)], [7])
    xc = np.ascontiguousarray(randn((2, 4, 5, c))).transpose(0, 3, 1, 2)  # channels-last
    check(lib, numpy_kernels, "aten::_native_batch_norm_legit_no_training.out",
          [xc, None, None, randn(c), np.abs(randn(c)) + 0.1, 0.1, 1e-5,
           np.empty(xc.shape, np.float32), np.empty(0, np.float32), np.empty(0, np.float32)], [7])


def test_batch_norm_with_batch_statistics(lib, numpy_kernels):
    x = randn((2, 3, 4, 5)) * 2 + 0.5
    check(lib, numpy_kernels, "aten::_native_batch_norm_legit.no_stats_out",
          [x, randn(3), randn(3), True, 0.1, 1e-5, np.empty_like(x), np.empty(3, np.float32),
           np.empty(3, np.float32)], [6, 7, 8])
    with pytest.raises(KernelError, match="training=False"):
        lib.kernel("aten::_native_batch_norm_legit.no_stats_out")(
            x, None, None, False, 0.1, 1e-5, np.empty_like(x), np.empty(3, np.float32),
            np.empty(3, np.float32))


@pytest.mark.parametrize("groups", [1, 2, 6])
def test_group_norm(lib, numpy_kernels, groups):
    x = randn((2, 6, 4, 5))
    check(lib, numpy_kernels, "aten::native_group_norm.out",
          [x, randn(6), randn(6), 2, 6, 20, groups, 1e-5, np.empty_like(x),
           np.empty((2, groups), np.float32), np.empty((2, groups), np.float32)], [8, 9, 10])


@pytest.mark.parametrize("key", ["aten::_softmax.out", "aten::_log_softmax.out"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape,dim", [((2, 5, 7), -1), ((2, 5, 7), 0), ((2, 5, 7), 1),
                                       ((8, 16, 16), -1), ((3, 1000), -1), ((), 0)])
def test_softmax(lib, numpy_kernels, key, dtype, shape, dim):
    x = np.array(randn(shape, dtype) * 4, dtype)  # (a 0-d array stays an array)
    check(lib, numpy_kernels, key, [x, dim, False, np.empty(shape, dtype)], [3])


@pytest.mark.parametrize("key", ["aten::_softmax.out", "aten::_log_softmax.out"])
def test_softmax_masked_rows_and_nan(lib, numpy_kernels, key):
    x = randn((4, 9))
    x[0, :3] = -np.inf                   # masked attention positions: exactly 0 (or -inf)
    x[1, :] = -np.inf                    # a fully masked row: NaN, as ATen
    x[2, 4] = np.nan                     # a NaN poisons its row
    x[3, 2] = 80.0                       # exp's large range
    with np.errstate(all="ignore"):
        pairs = run_both(lib, numpy_kernels, key, [x, -1, False, np.empty_like(x)], [3])
    for want, got in pairs:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, equal_nan=True)
        assert np.array_equal(np.isnan(got), np.isnan(want))
        assert np.array_equal(got[0, :3], want[0, :3])


def test_exp_is_within_one_ulp(lib):
    """The softmax's float32 exp, seen through a two-element row (softmax([x, -inf]) is
    [1, 0]; log_softmax([0, x]) needs exp(x) for the log of 1 + exp(x))."""
    x = np.linspace(-100, 80, 20001, dtype=np.float32)
    rows = np.stack([x, np.zeros_like(x)], axis=1)
    out = np.empty_like(rows)
    lib.kernel("aten::_softmax.out")(rows, 1, False, out)
    exact = 1 / (1 + np.exp(-x.astype(np.float64)))  # softmax's first entry, sigmoid(x)
    # exp within 1 ulp, then a sum and a division: within a few float32 ulps of the value
    assert np.all(np.abs(out[:, 0] - exact) <= 4 * np.finfo(np.float32).eps * exact + 1e-44)


_OTHER_ISA_SCRIPT = r"""
import sys
import numpy as np
from opforge.kernels.portable import portable_kernels
from opforge.runtime.native import NativeLibrary
lib, spec = NativeLibrary(sys.argv[1]), portable_kernels()
rng = np.random.default_rng(1)
for m, k, n in [(4, 64, 128), (37, 300, 65), (1, 768, 100), (9, 17, 33)]:
    for dtype in (np.float32, np.float64):
        a = rng.standard_normal((m, k)).astype(dtype)
        for b in (rng.standard_normal((k, n)).astype(dtype),
                  np.ascontiguousarray(rng.standard_normal((n, k)).astype(dtype)).T):
            out = np.empty((m, n), dtype)
            lib.kernel("aten::mm.out")(a, b, out)
            exact = a.astype(np.float64) @ b.astype(np.float64)
            bound = 2 * k * np.finfo(dtype).eps * (np.abs(a) @ np.abs(b)).astype(np.float64)
            assert np.all(np.abs(out - exact) <= bound + 1e-30), (m, k, n, dtype)
x = rng.standard_normal((3, 77)).astype(np.float32) * 5
for key in ("aten::_softmax.out", "aten::_log_softmax.out"):
    want, got = np.empty_like(x), np.empty_like(x)
    spec[key](x, -1, False, want)
    lib.kernel(key)(x, -1, False, got)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
w, b = rng.standard_normal(77).astype(np.float32), rng.standard_normal(77).astype(np.float32)
outs = [[np.empty_like(x), np.empty((3, 1), np.float32), np.empty((3, 1), np.float32)] for _ in range(2)]
spec["aten::native_layer_norm.out"](x, [77], w, b, 1e-5, *outs[0])
lib.kernel("aten::native_layer_norm.out")(x, [77], w, b, 1e-5, *outs[1])
for want, got in zip(*outs):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
print("ok")
"""


@pytest.mark.parametrize("capability", ["default", "avx2"])
def test_other_instruction_sets(native_runtime, capability):
    """The GEMM and vector loops compiled for the build's baseline (what an aarch64 build
    runs: 16-byte vectors) and for AVX2, chosen with OPFORGE_CPU_CAPABILITY in a fresh
    process (the choice is made once per process)."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, OPFORGE_CPU_CAPABILITY=capability, OMP_NUM_THREADS="1")
    run = subprocess.run([sys.executable, "-c", _OTHER_ISA_SCRIPT, str(native_runtime.portable_library)],
                         env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-2000:]
