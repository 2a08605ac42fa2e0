"""Portable reduction, softmax and normalisation kernels against PyTorch.

Tolerances: a reduction over K elements accumulates ~sqrt(K) roundings, and NumPy's
pairwise summation and ATen's vectorised one add in different orders, so float32 uses
rtol = atol = 4 * sqrt(K) * eps32 (K <= 64 here: ~4e-6, we use 1e-5); float64 1e-12;
float16 inputs accumulate in float32 on both sides and round once: 2e-3. Integer sums,
arg-reductions and any/all: exact.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kernel_check import check_kernel, make_array

TOL = {np.float16: 2e-3, np.float32: 1e-5, np.float64: 1e-12}


DIMS = [None, (), (0,), (-1,), (0, 2), (1,)]
FLOATS = [np.float32, np.float64, np.float16]


def make(shape, dtype, layout="contiguous", seed=0):
    return make_array(shape, dtype, layout, seed, ints=(-9, 9), bool_p=0.3)


def check(key, expected, *args):
    check_kernel(key, expected, *args, tols=TOL)


@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize("dtype", FLOATS + [np.int32, np.int64, np.bool_])
def test_sum_mean_amax(dtype, dim, keepdim, layout):
    x, tx = make((3, 4, 5), dtype, layout, seed=1)
    tdim = list(dim) if dim is not None else None
    check("aten::sum.IntList_out", torch.sum(tx, tdim, keepdim), x, dim, keepdim, None)
    if dtype in FLOATS:
        check("aten::mean.out", torch.mean(tx, tdim, keepdim), x, dim, keepdim, None)
    if dtype != np.bool_:
        check("aten::sum.IntList_out", torch.sum(tx, tdim, keepdim, dtype=torch.float64),
              x, dim, keepdim, np.dtype(np.float64))
    if dim is not None and dim != ():
        check("aten::amax.out", torch.amax(tx, dim, keepdim), x, dim, keepdim)
        check("aten::amin.out", torch.amin(tx, dim, keepdim), x, dim, keepdim)
        check("aten::any.dims_out", torch.any(tx, dim, keepdim), x, dim, keepdim)
        check("aten::all.dims_out", torch.all(tx, dim, keepdim), x, dim, keepdim)


@pytest.mark.parametrize("dtype", FLOATS + [np.int64, np.bool_])
def test_full_reductions(dtype):
    x, tx = make((4, 6), dtype, "transposed", seed=2)
    check("aten::sum.out", torch.sum(tx), x, None)
    check("aten::any.all_out", torch.any(tx), x)
    check("aten::all.all_out", torch.all(tx), x)
    check("aten::any.out", torch.any(tx, 1, True), x, 1, True)
    check("aten::all.out", torch.all(tx, 0), x, 0, False)
    if dtype != np.bool_:
        check("aten::max.unary_out", torch.max(tx), x)
        check("aten::min.unary_out", torch.min(tx), x)
        check("aten::prod.out", torch.prod(tx), x, None)
        check("aten::prod.int_out", torch.prod(tx, 1, True), x, 1, True, None)
    if dtype in FLOATS:
        check("aten::mean.dtype_out", torch.mean(tx), x, None)


def test_zero_size_sum():
    x, tx = make((0, 3), np.float32, seed=3)
    check("aten::sum.IntList_out", torch.sum(tx, [0]), x, (0,), False, None)
    check("aten::mean.out", torch.mean(tx, [1]), x, (1,), False, None)


@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("dim", [None, 0, 1, -1])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.float16])
def test_argmax_argmin(dtype, dim, keepdim):
    x, tx = make((5, 7), dtype, "transposed", seed=4)
    x = np.asarray(np.round(x / 3), dtype)  # many ties: the first index must win
    tx = torch.from_numpy(x)
    check("aten::argmax.out", torch.argmax(tx, dim, keepdim), x, dim, keepdim)
    check("aten::argmin.out", torch.argmin(tx, dim, keepdim), x, dim, keepdim)


@pytest.mark.parametrize("correction", [None, 0, 1, 2.5])
@pytest.mark.parametrize("dim", [None, (1,), (0, 2)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_var_std(dtype, dim, correction):
    x, tx = make((4, 6, 5), dtype, seed=5)
    tdim = list(dim) if dim is not None else None
    for keepdim in (False, True):
        check("aten::var.correction_out",
              torch.var(tx, tdim, correction=correction, keepdim=keepdim),
              x, dim, correction, keepdim)
        check("aten::std.correction_out",
              torch.std(tx, tdim, correction=correction, keepdim=keepdim),
              x, dim, correction, keepdim)
        check("aten::var_mean.correction_out",
              torch.var_mean(tx, tdim, correction=correction, keepdim=keepdim),
              x, dim, correction, keepdim)
    check("aten::var.out", torch.var(tx, tdim, unbiased=False), x, dim, False, False)


def test_logsumexp():
    x, tx = make((3, 8), np.float32, seed=6)
    x[0] = -np.inf  # a row of -inf: compared with float64, not a vectorised float32 exp
    tx = torch.from_numpy(x).double()
    check("aten::logsumexp.out", torch.logsumexp(tx, [1], True).float(), x, (1,), True)


@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_softmax(dtype, dim, layout):
    x, tx = make((4, 5, 6), dtype, layout, seed=7)
    x = np.asarray(x * 4, dtype)
    tx = torch.from_numpy(x)
    check("aten::_softmax.out", torch.ops.aten._softmax(tx, dim, False), x, dim, False)
    check("aten::_log_softmax.out", torch.ops.aten._log_softmax(tx, dim, False),
          x, dim, False)


def test_softmax_masked_rows():
    x = np.array([[0.0, -np.inf, 1.0], [-np.inf, -np.inf, -np.inf]], np.float32)
    tx = torch.from_numpy(x).double()  # -inf against float64, not a vectorised float32 exp
    check("aten::_softmax.out", torch.ops.aten._softmax(tx, -1, False).float(), x, -1, False)


@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("normalized", [(8,), (3, 8)])
@pytest.mark.parametrize("dtype", FLOATS)
def test_native_layer_norm(dtype, normalized, affine):
    x, tx = make((2, 3, 8), dtype, seed=8)
    w, tw = make(normalized, dtype, seed=9) if affine else (None, None)
    b, tb = make(normalized, dtype, seed=10) if affine else (None, None)
    expected = torch.ops.aten.native_layer_norm(tx, list(normalized), tw, tb, 1e-5)
    check("aten::native_layer_norm.out", expected, x, normalized, w, b, 1e-5)


@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (2, 3, 7), (4, 3)])
@pytest.mark.parametrize("dtype", FLOATS)
def test_batch_norm_no_training(dtype, shape, affine):
    x, tx = make(shape, dtype, seed=11)
    mean, tmean = make((3,), dtype, seed=12)
    var = np.asarray(np.abs(make((3,), dtype, seed=13)[0]) + 0.5, dtype)
    w, tw = make((3,), dtype, seed=14) if affine else (None, None)
    b, tb = make((3,), dtype, seed=15) if affine else (None, None)
    expected = torch.ops.aten._native_batch_norm_legit_no_training(
        tx, tw, tb, tmean, torch.from_numpy(var), 0.1, 1e-5)
    check("aten::_native_batch_norm_legit_no_training.out", expected,
          x, w, b, mean, var, 0.1, 1e-5)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_native_group_norm(dtype):
    x, tx = make((2, 6, 4, 5), dtype, seed=16)
    w, tw = make((6,), dtype, seed=17)
    b, tb = make((6,), dtype, seed=18)
    expected = torch.ops.aten.native_group_norm(tx, tw, tb, 2, 6, 20, 3, 1e-5)
    check("aten::native_group_norm.out", expected, x, w, b, 2, 6, 20, 3, 1e-5)
