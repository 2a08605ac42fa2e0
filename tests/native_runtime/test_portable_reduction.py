"""The portable C++ reductions and pooling (kernels/ops/{reduction,pooling}.cpp) held to the
NumPy kernels of the same keys through the kernel ABI bridge, and the zoo's programs run
with the C++ kernels of these families in place of the NumPy ones.

Tolerances: floating sums accumulate in double here and pairwise in float32 in NumPy, so
float32 results agree to rtol 1e-5 / atol 1e-6 (a wrong index or a dropped element moves
them by O(1)); maxima, minima, indices, integer sums and products are exact.
"""

from __future__ import annotations

import numpy as np
import pytest

from opforge.errors import KernelError
from opforge.runtime.native import kernel_table
from tests.native_runtime._portable_compare import lib, numpy_kernels, run_both  # noqa: F401 (fixtures)

RNG = np.random.default_rng(4402)
FAMILIES = ("linalg", "convolution", "normalization", "softmax", "reduction", "pooling")


def check(lib, numpy_kernels, key, args, outs):
    for want, got in run_both(lib, numpy_kernels, key, args, outs):
        assert got.shape == want.shape and got.dtype == want.dtype
        if want.dtype.kind == "f":
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, equal_nan=True)
        else:
            np.testing.assert_array_equal(got, want)


def data(dtype, shape=(2, 3, 4, 5)):
    if np.dtype(dtype).kind == "f":
        x = RNG.standard_normal(shape).astype(dtype)
        if x.size > 20:
            x.flat[7] = np.nan
        return x
    if dtype == np.bool_:
        return RNG.random(shape) < 0.5
    return RNG.integers(-5, 6, shape).astype(dtype)


def reduced(shape, dims, keepdim):
    dims = range(len(shape)) if dims is None or len(dims) == 0 else [d % len(shape) for d in dims]
    if keepdim:
        return tuple(1 if i in dims else n for i, n in enumerate(shape))
    return tuple(n for i, n in enumerate(shape) if i not in dims)


DIMS = [[-1], [0, 2], None, [], [1, 2, 3]]


@pytest.mark.parametrize("dims", DIMS, ids=str)
@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.bool_])
def test_sum_and_mean(lib, numpy_kernels, dims, keepdim, dtype):
    x = data(dtype)
    shape = reduced(x.shape, dims, keepdim)
    sum_dtype = dtype if np.dtype(dtype).kind == "f" else np.int64
    check(lib, numpy_kernels, "aten::sum.IntList_out",
          [x, dims, keepdim, None, np.empty(shape, sum_dtype)], [4])
    if np.dtype(dtype).kind == "f":
        check(lib, numpy_kernels, "aten::mean.out", [x, dims, keepdim, None, np.empty(shape, dtype)], [4])
    else:
        check(lib, numpy_kernels, "aten::mean.out",
              [x, dims, keepdim, np.float32, np.empty(shape, np.float32)], [4])


def test_whole_sums_means_and_products(lib, numpy_kernels):
    x, xi = data(np.float32), data(np.int8, (3, 7))
    check(lib, numpy_kernels, "aten::sum.out", [x, None, np.empty((), np.float32)], [2])
    check(lib, numpy_kernels, "aten::sum.out", [xi, None, np.empty((), np.int64)], [2])
    check(lib, numpy_kernels, "aten::sum.out", [x, np.float64, np.empty((), np.float64)], [2])
    check(lib, numpy_kernels, "aten::mean.dtype_out", [x, None, np.empty((), np.float32)], [2])
    check(lib, numpy_kernels, "aten::prod.out", [xi, None, np.empty((), np.int64)], [2])
    check(lib, numpy_kernels, "aten::prod.int_out", [xi, 1, False, None, np.empty(3, np.int64)], [4])
    y = RNG.uniform(0.5, 1.5, (4, 6)).astype(np.float32)
    check(lib, numpy_kernels, "aten::prod.int_out", [y, -1, True, None, np.empty((4, 1), np.float32)], [4])


def test_strided_input(lib, numpy_kernels):
    x = data(np.float32, (6, 5, 8)).transpose(2, 0, 1)[::2]
    check(lib, numpy_kernels, "aten::sum.IntList_out", [x, [1], False, None, np.empty((4, 5), np.float32)], [4])
    check(lib, numpy_kernels, "aten::amax.out", [x, [0, 2], False, np.empty(6, np.float32)], [3])


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64, np.uint8])
def test_extremes(lib, numpy_kernels, dtype):
    x = data(dtype)
    for key in ("aten::amax.out", "aten::amin.out"):
        for dims in ([1], [0, 3], []):
            check(lib, numpy_kernels, key, [x, dims, False, np.empty(reduced(x.shape, dims, False), dtype)], [3])
    for key in ("aten::max.unary_out", "aten::min.unary_out"):
        check(lib, numpy_kernels, key, [x, np.empty((), dtype)], [1])
    for key in ("aten::argmax.out", "aten::argmin.out"):
        check(lib, numpy_kernels, key, [x, 2, True, np.empty((2, 3, 1, 5), np.int64)], [3])
        check(lib, numpy_kernels, key, [x, None, False, np.empty((), np.int64)], [3])
    check(lib, numpy_kernels, "aten::max.dim_max",
          [x, -1, False, np.empty((2, 3, 4), dtype), np.empty((2, 3, 4), np.int64)], [3, 4])
    check(lib, numpy_kernels, "aten::min.dim_min",
          [x, 0, True, np.empty((1, 3, 4, 5), dtype), np.empty((1, 3, 4, 5), np.int64)], [3, 4])


def test_ties_and_nan_pick_as_aten(lib, numpy_kernels):
    x = np.array([[1.0, 3.0, 3.0, np.nan, 2.0, np.nan], [0.0, -0.0, -1.0, 0.0, -1.0, 5.0]],
                 np.float32)
    for key in ("aten::argmax.out", "aten::argmin.out"):
        check(lib, numpy_kernels, key, [x, 1, False, np.empty(2, np.int64)], [3])
    check(lib, numpy_kernels, "aten::amax.out", [x, [1], False, np.empty(2, np.float32)], [3])


def test_empty_extremes_are_refused(lib):
    with pytest.raises(KernelError, match="non-empty"):
        lib.kernel("aten::amax.out")(np.empty((3, 0), np.float32), [1], False, np.empty(3, np.float32))
    with pytest.raises(KernelError, match="non-empty"):
        lib.kernel("aten::max.dim_max")(np.empty((3, 0), np.float32), 1, False,
                                        np.empty(3, np.float32), np.empty(3, np.int64))


@pytest.mark.parametrize("dims", [[-1], None, [0, 2]], ids=str)
@pytest.mark.parametrize("correction", [None, 0, 1, 2.5])
def test_moments(lib, numpy_kernels, dims, correction):
    x = RNG.standard_normal((3, 4, 5)).astype(np.float32) * 3 + 2
    shape = reduced(x.shape, dims, True)
    check(lib, numpy_kernels, "aten::var.correction_out", [x, dims, correction, True, np.empty(shape, np.float32)], [4])
    check(lib, numpy_kernels, "aten::std.correction_out", [x, dims, correction, True, np.empty(shape, np.float32)], [4])
    check(lib, numpy_kernels, "aten::var_mean.correction_out",
          [x, dims, correction, True, np.empty(shape, np.float32), np.empty(shape, np.float32)], [4, 5])
    check(lib, numpy_kernels, "aten::var.out", [x, dims, False, True, np.empty(shape, np.float32)], [4])


@pytest.mark.parametrize("dtype", [np.bool_, np.int32, np.float32])
def test_any_all(lib, numpy_kernels, dtype):
    x = data(dtype)
    if dtype != np.bool_:
        x = (x > 0.5).astype(dtype) if dtype == np.float32 else (x > 3).astype(dtype)
    for key in ("aten::any.out", "aten::all.out"):
        check(lib, numpy_kernels, key, [x, 1, False, np.empty((2, 4, 5), np.bool_)], [3])
    for key in ("aten::any.dims_out", "aten::all.dims_out"):
        check(lib, numpy_kernels, key, [x, [0, 3], True, np.empty((1, 3, 4, 1), np.bool_)], [3])
        check(lib, numpy_kernels, key, [x, None, False, np.empty((), np.bool_)], [3])
    for key in ("aten::any.all_out", "aten::all.all_out"):
        check(lib, numpy_kernels, key, [x, np.empty((), np.bool_)], [1])


def test_logsumexp_and_norms(lib, numpy_kernels):
    x = RNG.standard_normal((3, 4, 5)).astype(np.float32) * 10
    x[0, 0, :] = -np.inf
    check(lib, numpy_kernels, "aten::logsumexp.out", [x, [-1], False, np.empty((3, 4), np.float32)], [3])
    check(lib, numpy_kernels, "aten::logsumexp.out", [x, [0, 1], True, np.empty((1, 1, 5), np.float32)], [3])
    y = RNG.standard_normal((3, 4, 5)).astype(np.float32)
    y[1, 2, 3] = 0
    for ord in (2, 1, 0, 3, 0.5, np.inf, -np.inf):
        check(lib, numpy_kernels, "aten::linalg_vector_norm.out",
              [y, ord, [-1], False, None, np.empty((3, 4), np.float32)], [5])
    check(lib, numpy_kernels, "aten::linalg_vector_norm.out",
          [y, 2, None, False, None, np.empty((), np.float32)], [5])


# --- pooling --------------------------------------------------------------------------

def pool_shape(size, k, s, p, d, ceil_mode):
    span = size + 2 * p - d * (k - 1) - 1
    n = (span + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (n - 1) * s >= size + p:
        n -= 1
    return n


def expand(v, n):
    return tuple(v) * n if len(v) == 1 else tuple(v)


MAX_POOLS = [  # shape, kernel, stride, padding, dilation, ceil_mode
    ((2, 3, 8, 8), [2], [2], [0], [1], False),
    ((2, 3, 9, 10), [3], [2], [1], [1], True),
    ((2, 3, 9, 10), [3, 2], [], [1, 1], [2, 1], False),
    ((3, 7, 7), [3], [1], [1], [1], False),
    ((1, 2, 1, 1), [1], [1], [0], [1], False),
    ((2, 2, 5, 6, 7), [2], [2], [1], [1], False),
    ((1, 2, 5, 6, 7), [3, 2, 2], [2, 1, 2], [1, 0, 1], [1, 2, 1], True),
]


@pytest.mark.parametrize("case", MAX_POOLS, ids=lambda c: f"{c[0]}-k{c[1]}s{c[2]}p{c[3]}d{c[4]}")
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32])
def test_max_pool(lib, numpy_kernels, case, dtype):
    shape, k, s, p, d, ceil_mode = case
    n = 3 if len(shape) == 5 or (len(shape) == 4 and len(k) == 3) else 2
    x = data(dtype, shape)
    if dtype != np.int32:
        x.flat[::5] = -np.inf  # windows of nothing but -inf keep their first input
    kk, ss, pp, dd = expand(k, n), expand(s or k, n), expand(p, n), expand(d, n)
    out_size = tuple(pool_shape(*a, ceil_mode) for a in zip(shape[-n:], kk, ss, pp, dd))
    out_shape = shape[:-n] + out_size
    key = f"aten::max_pool{n}d_with_indices.out"
    check(lib, numpy_kernels, key, [x, k, s, p, d, ceil_mode, np.empty(out_shape, dtype),
                                    np.empty(out_shape, np.int64)], [6, 7])


@pytest.mark.parametrize("count_include_pad", [True, False])
@pytest.mark.parametrize("divisor", [None, 3])
@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_avg_pool(lib, numpy_kernels, count_include_pad, divisor, dtype):
    for shape, k, s, p, ceil_mode in (((2, 3, 9, 10), [3], [2], [1], True),
                                      ((2, 3, 8, 8), [2], [], [0], False),
                                      ((1, 2, 5, 6, 7), [3], [2], [1], False)):
        n = len(shape) - 2
        x = data(dtype, shape)
        if dtype == np.float32:
            x = np.nan_to_num(x)
        kk, ss, pp = expand(k, n), expand(s or k, n), expand(p, n)
        out = shape[:2] + tuple(pool_shape(a, b, c, e, 1, ceil_mode) for a, b, c, e in zip(shape[2:], kk, ss, pp))
        check(lib, numpy_kernels, f"aten::avg_pool{n}d.out",
              [x, k, s, p, ceil_mode, count_include_pad, divisor, np.empty(out, dtype)], [7])


@pytest.mark.parametrize("size", [(1, 1), (4, 3), (3, 5), (9, 10), (2, 3, 4)])
def test_adaptive_pools(lib, numpy_kernels, size):
    n = len(size)
    x = data(np.float32, (2, 3, 5, 6, 7)[-(n + 2):] if n == 3 else (2, 3, 9, 10))
    out = x.shape[:2] + size
    check(lib, numpy_kernels, f"aten::_adaptive_avg_pool{n}d.out",
          [np.nan_to_num(x), list(size), np.empty(out, np.float32)], [2])
    check(lib, numpy_kernels, f"aten::adaptive_max_pool{n}d.out",
          [x, list(size), np.empty(out, np.float32), np.empty(out, np.int64)], [2, 3])


def test_pooling_refuses_bad_parameters(lib):
    pool = lib.kernel("aten::max_pool2d_with_indices.out")
    x = data(np.float32, (1, 1, 8, 8))
    with pytest.raises(KernelError, match="half"):  # padding > half the window, as ATen
        pool(x, [2], [2], [2], [1], False, np.empty((1, 1, 6, 6), np.float32),
             np.empty((1, 1, 6, 6), np.int64))
    with pytest.raises(KernelError, match="output spatial size"):
        pool(x, [2], [2], [0], [1], False, np.empty((1, 1, 5, 4), np.float32),
             np.empty((1, 1, 5, 4), np.int64))
    with pytest.raises(KernelError, match="memory limit"):  # a dilation balanced by padding
        pool(x, [3], [1], [2**40], [2**40], False, np.empty((1, 1, 8, 8), np.float32),
             np.empty((1, 1, 8, 8), np.int64))
    with pytest.raises(KernelError, match="output_size"):
        lib.kernel("aten::_adaptive_avg_pool2d.out")(x, [2, 2], np.empty((1, 1, 3, 3), np.float32))


# --- whole programs ---------------------------------------------------------------------

@pytest.mark.parametrize("name", ["mlp", "cnn", "transformer_layer"])
def test_zoo_program_on_the_cpp_kernels(native_runtime, lib, name):
    """The zoo program with this work's C++ kernels (the six families) registered over the
    NumPy ones gives the lean runtime's outputs. Only these families: the library's other
    families are other engineers' work in progress."""
    torch = pytest.importorskip("torch")
    from opforge.examples.zoo import ZOO
    from opforge.export.api import export
    from opforge.runtime import KernelRegistry, load

    mine = {e.key for e in kernel_table(native_runtime.portable_library) if e.source in FAMILIES}
    torch.manual_seed(0)
    model, inputs = ZOO[name]()
    program = export(model.eval(), inputs)
    keys = sorted({o.key for o in program.method("forward").operators})
    registry = KernelRegistry.portable()
    used = [k for k in keys if k in mine]
    assert used  # the model runs some of these kernels natively
    for key in used:
        registry.register(key, lib.kernel(key), origin=str(native_runtime.portable_library),
                          target="native", override=True)
    arrays = [t.numpy() for t in inputs]
    want = load(program).method("forward")(*arrays)
    got = load(program, registry=registry).method("forward")(*arrays)
    for g, w in zip(got, want):
        # float32 products summed in another order: rounding, ~1e-7 on outputs of O(1)
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape,ceil_mode", [((2, 3, 8, 8), False), ((2, 3, 9, 7), True),
                                             ((2, 3, 9, 7), False), ((1, 1, 2, 2), False)])
def test_max_pool_2x2_special_values(lib, numpy_kernels, shape, ceil_mode):
    """The 2x2/stride-2 path: NaN (the last wins), -inf windows, signed zeros, ties, and a
    ceil_mode overhang (which takes the general path)."""
    x = RNG.choice(np.array([0.0, -0.0, 1.0, 1.0, -np.inf, np.nan, 2.0], np.float32), shape)
    out = shape[:2] + tuple(pool_shape(n, 2, 2, 0, 1, ceil_mode) for n in shape[2:])
    check(lib, numpy_kernels, "aten::max_pool2d_with_indices.out",
          [x, [2, 2], [2, 2], [0, 0], [1, 1], ceil_mode, np.empty(out, np.float32),
           np.empty(out, np.int64)], [6, 7])
    theirs, ours = np.empty(out, np.float32), np.empty(out, np.float32)
    numpy_kernels["aten::max_pool2d_with_indices.out"](x, [2, 2], [2, 2], [0, 0], [1, 1], ceil_mode,
                                                        theirs, np.empty(out, np.int64))
    lib.kernel("aten::max_pool2d_with_indices.out")(x, [2, 2], [2, 2], [0, 0], [1, 1], ceil_mode,
                                                     ours, np.empty(out, np.int64))
    assert np.array_equal(np.signbit(ours), np.signbit(theirs))  # the first zero keeps its sign
