"""Portable matmul, convolution and pooling kernels against PyTorch.

Tolerances: a dot product of length K accumulates ~sqrt(K) roundings and BLAS and ATen
block the sums differently: float32 rtol = atol = 4 * sqrt(K) * eps32 with K <= 300
(~8e-6; we use 2e-5); float64 1e-11; float16 accumulates in float32 and rounds once
(2e-3 relative, atol 4e-3 for sums of O(1) terms near zero). Pooling selects or averages
<= 9 values: float32 1e-6; max pooling and its indices: exact.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kernel_check import check_kernel, make_array

TOL = {np.float16: 4e-3, np.float32: 2e-5, np.float64: 1e-11}


MATMUL_DTYPES = [np.float32, np.float64, np.float16, np.int64]


def make(shape, dtype, layout="contiguous", seed=0):
    return make_array(shape, dtype, layout, seed)


def check(key, expected, *args, tol=None):
    check_kernel(key, expected, *args, tols=TOL, tol=tol)


@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
@pytest.mark.parametrize("m, k, n", [(3, 4, 5), (1, 64, 1), (7, 0, 3), (16, 300, 8)])
@pytest.mark.parametrize("dtype", MATMUL_DTYPES)
def test_mm_addmm(dtype, m, k, n, layout):
    a, ta = make((m, k), dtype, layout, seed=1)
    b, tb = make((k, n), dtype, layout, seed=2)
    check("aten::mm.out", torch.mm(ta, tb), a, b)
    bias, tbias = make((n,), dtype, seed=3)
    check("aten::addmm.out", torch.addmm(tbias, ta, tb), bias, a, b, 1, 1)
    if dtype != np.int64:
        check("aten::addmm.out", torch.addmm(tbias, ta, tb, beta=0.5, alpha=2.0),
              bias, a, b, 0.5, 2.0)
    c, tc = make((m, n), dtype, seed=4)
    check("aten::addmm.out", torch.addmm(tc, ta, tb, beta=0, alpha=1), c, a, b, 0, 1)


def test_addmm_beta_zero_ignores_nan():
    a, ta = make((2, 3), np.float32, seed=5)
    b, tb = make((3, 4), np.float32, seed=6)
    c = np.full((2, 4), np.nan, np.float32)
    check("aten::addmm.out", torch.addmm(torch.from_numpy(c), ta, tb, beta=0), c, a, b, 0, 1)


@pytest.mark.parametrize("dtype", MATMUL_DTYPES)
def test_bmm_baddbmm_linear(dtype):
    a, ta = make((3, 5, 4), dtype, seed=7)
    b, tb = make((3, 6, 4), dtype, seed=8)
    bt, tbt = b.transpose(0, 2, 1), tb.transpose(1, 2)
    check("aten::bmm.out", torch.bmm(ta, tbt), a, bt)
    c, tc = make((5, 6), dtype, seed=9)
    check("aten::baddbmm.out", torch.baddbmm(tc, ta, tbt), c, a, bt, 1, 1)
    if dtype != np.int64:
        w, tw = make((6, 4), dtype, seed=10)
        bias, tbias = make((6,), dtype, seed=11)
        check("aten::linear.out", torch.nn.functional.linear(ta, tw, tbias), a, w, bias)
        check("aten::linear.out", torch.nn.functional.linear(ta, tw), a, w, None)


CONV2D = [  # (in_shape, weight_shape, stride, padding, dilation, groups)
    ((1, 3, 8, 8), (4, 3, 3, 3), (1,), (1,), (1,), 1),
    ((2, 4, 9, 7), (6, 2, 3, 2), (2, 1), (1, 0), (1, 1), 2),
    ((1, 8, 10, 10), (8, 1, 3, 3), (1, 1), (2, 2), (2, 2), 8),  # depthwise, dilated
    ((2, 6, 5, 5), (3, 6, 1, 1), (2, 2), (0, 0), (1, 1), 1),    # pointwise, strided
    ((1, 3, 7, 6), (2, 3, 4, 3), (3, 2), (2, 1), (1, 2), 1),
]


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("case", CONV2D)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_conv2d(dtype, case, bias):
    shape, wshape, stride, padding, dilation, groups = case
    x, tx = make(shape, dtype, seed=12)
    w, tw = make(wshape, dtype, seed=13)
    b, tb = make((wshape[0],), dtype, seed=14) if bias else (None, None)
    expected = torch.ops.aten.convolution(tx, tw, tb, list(stride), list(padding),
                                          list(dilation), False, [0], groups)
    check("aten::convolution.out", expected, x, w, b, stride, padding, dilation, False,
          (0,), groups)


def test_conv2d_strided_input():
    x, tx = make((1, 3, 8, 8), np.float32, "transposed", seed=15)
    w, tw = make((4, 3, 3, 3), np.float32, seed=16)
    expected = torch.ops.aten.convolution(tx, tw, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    check("aten::convolution.out", expected, x, w, None, (1, 1), (1, 1), (1, 1), False,
          (0, 0), 1)


@pytest.mark.parametrize("stride, padding, dilation, groups",
                         [(1, 0, 1, 1), (2, 1, 1, 2), (1, 2, 2, 4), (3, 0, 1, 1)])
def test_conv1d(stride, padding, dilation, groups):
    x, tx = make((2, 4, 11), np.float32, seed=17)
    w, tw = make((4, 4 // groups, 3), np.float32, seed=18)
    b, tb = make((4,), np.float32, seed=19)
    expected = torch.ops.aten.convolution(tx, tw, tb, [stride], [padding], [dilation],
                                          False, [0], groups)
    check("aten::convolution.out", expected, x, w, b, (stride,), (padding,), (dilation,),
          False, (0,), groups)


@pytest.mark.parametrize("stride, padding, dilation, output_padding, groups",
                         [(1, 0, 1, 0, 1), (2, 1, 1, 1, 1), (2, 0, 2, 0, 2), (3, 1, 1, 2, 1)])
def test_conv_transpose2d(stride, padding, dilation, output_padding, groups):
    x, tx = make((2, 4, 5, 4), np.float64, seed=20)
    w, tw = make((4, 6 // groups, 3, 3), np.float64, seed=21)
    b, tb = make((6 // groups * groups,), np.float64, seed=22)
    expected = torch.ops.aten.convolution(tx, tw, tb, [stride] * 2, [padding] * 2,
                                          [dilation] * 2, True, [output_padding] * 2, groups)
    check("aten::convolution.out", expected, x, w, b, (stride,), (padding,), (dilation,),
          True, (output_padding,), groups)


POOLS = [  # kernel, stride, padding, dilation, ceil_mode
    ((2,), (), (0,), (1,), False), ((3, 3), (2, 2), (1, 1), (1, 1), False),
    ((3, 2), (2, 1), (1, 0), (2, 1), False), ((2, 2), (2, 2), (0, 0), (1, 1), True),
    ((3, 3), (2, 2), (1, 1), (1, 1), True), ((2,), (3,), (1,), (1,), True),
]


@pytest.mark.parametrize("shape", [(2, 3, 7, 8), (3, 5, 5)])
@pytest.mark.parametrize("pool", POOLS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
def test_max_pool2d_with_indices(dtype, pool, shape):
    x, tx = make(shape, dtype, seed=23)
    expected = torch.ops.aten.max_pool2d_with_indices(tx, *[list(p) for p in pool[:4]], pool[4])
    check("aten::max_pool2d_with_indices.out", expected, x, *pool, tol=0)


@pytest.mark.parametrize("divisor_override", [None, 3])
@pytest.mark.parametrize("count_include_pad", [True, False])
@pytest.mark.parametrize("pool", POOLS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_avg_pool2d(dtype, pool, count_include_pad, divisor_override):
    kernel, stride, padding, _, ceil_mode = pool
    x, tx = make((2, 3, 7, 8), dtype, seed=24)
    expected = torch.ops.aten.avg_pool2d(tx, list(kernel), list(stride), list(padding),
                                         ceil_mode, count_include_pad, divisor_override)
    check("aten::avg_pool2d.out", expected, x, kernel, stride, padding, ceil_mode,
          count_include_pad, divisor_override, tol=1e-6 if dtype == np.float32 else 1e-12)


@pytest.mark.parametrize("output_size", [(1,), (1, 1), (2, 3), (3, 3), (5, 4), (7, 8)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_adaptive_avg_pool2d(dtype, output_size):
    x, tx = make((2, 3, 7, 8), dtype, seed=25)
    expected = torch.ops.aten._adaptive_avg_pool2d(tx, list(output_size) * (3 - len(output_size)))
    check("aten::_adaptive_avg_pool2d.out", expected, x, output_size)
