"""Reductions at the edges the main reduction tests do not reach: 1-d inputs reduced over
dim -1 (where ``dim % ndim`` is the whole story), and float32 means that must accumulate in
float32 as ATen does, not in float64.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kernel_check import check_kernel

TOL = {np.float32: 1e-6, np.float64: 1e-13}


def check(key, expected, *args):
    check_kernel(key, expected, *args, tols=TOL)


@pytest.mark.parametrize("dim", [-1, 0])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_one_dimensional_reductions(dtype, dim):
    x = np.array([0.5, -2.0, 3.0, 1.5, -0.25], dtype)
    t = torch.from_numpy(x)
    check("aten::sum.IntList_out", torch.sum(t, [dim]), x, [dim], False, None)
    check("aten::mean.out", torch.mean(t, [dim]), x, [dim], False, None)
    check("aten::amax.out", torch.amax(t, [dim]), x, [dim], False)
    check("aten::amin.out", torch.amin(t, [dim]), x, [dim], False)
    check("aten::prod.int_out", torch.prod(t, dim), x, dim, False, None)
    check("aten::prod.int_out", torch.prod(t, dim, True), x, dim, True, None)
    check("aten::argmax.out", torch.argmax(t, dim), x, dim, False)
    check("aten::argmin.out", torch.argmin(t, dim, True), x, dim, True)
    check("aten::logsumexp.out", torch.logsumexp(t, [dim]), x, [dim], False)
    check("aten::var.correction_out", torch.var(t, [dim], correction=1), x, [dim], 1, False)


def test_float32_mean_accumulates_in_float32():
    # (1e8 + 1) - 1e8 is 0 in float32: ATen's mean of these three is 0, a float64 one 1/3.
    x = np.array([1e8, 1.0, -1e8], np.float32)
    t = torch.from_numpy(x)
    assert torch.mean(t).item() == 0.0
    check("aten::mean.out", torch.mean(t, [0]), x, [0], False, None)
    check("aten::mean.dtype_out", torch.mean(t), x, None)


@pytest.mark.parametrize("scale", [100.0, 1e4])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_logsumexp_of_extreme_logits(dtype, scale):
    # exp overflows without the maximum subtracted (float32 above ~88, float64 above ~709),
    # and a wrong maximum (the minimum, another row's) shows as inf or -inf.
    x = np.array([[scale, 0.0, 1.0, -scale], [-scale, -scale - 1, -np.inf, -scale],
                  [-np.inf] * 4, [scale, scale, -np.inf, 0.0], [np.inf, 0.0, 1.0, 2.0]], dtype)
    want = torch.logsumexp(torch.from_numpy(x.astype(np.float64)), [1])
    check("aten::logsumexp.out", want.to(torch.from_numpy(x).dtype), x, [1], False)
    want = torch.logsumexp(torch.from_numpy(x[:3].astype(np.float64)), [0], True)
    check("aten::logsumexp.out", want.to(torch.from_numpy(x).dtype), x[:3], [0], True)


@pytest.mark.parametrize("shape, dim", [((0, 3), [0]), ((3, 0), [1]), ((0,), [0])], ids=str)
def test_logsumexp_of_nothing_is_minus_inf(shape, dim):
    x = np.empty(shape, np.float32)
    check("aten::logsumexp.out", torch.logsumexp(torch.from_numpy(x), dim), x, dim, False)


def test_arg_reductions_of_a_0d_tensor_along_dim_0():
    x = np.array(3.0, np.float32)
    t = torch.from_numpy(x)
    check("aten::argmax.out", torch.argmax(t, 0), x, 0, False)
    check("aten::argmin.out", torch.argmin(t, 0, True), x, 0, True)


@pytest.mark.parametrize("unbiased", [True, False])
def test_var_out_unbiased_flag(unbiased):
    x = np.array([[1.0, 2.0, 4.0], [0.5, -1.0, 3.0]], np.float64)
    t = torch.from_numpy(x)
    check("aten::var.out", torch.var(t, [1], unbiased=unbiased), x, [1], unbiased, False)


@pytest.mark.parametrize("key, fn, value", [("aten::any.all_out", torch.any, True),
                                            ("aten::any.all_out", torch.any, False),
                                            ("aten::all.all_out", torch.all, True),
                                            ("aten::all.all_out", torch.all, False)])
def test_full_any_all_overwrite_their_out(key, fn, value):
    # out starts holding the opposite answer: a kernel that forgot to write it fails.
    from kernel_check import KERNELS

    x = np.full((3, 4), value)
    want = bool(fn(torch.from_numpy(x)))
    out = np.array(not want)
    KERNELS[key](x, out)
    assert bool(out) == want


@pytest.mark.parametrize("ord", [2, 1, 3.5, float("inf")])
def test_vector_norm_with_a_wider_dtype_computes_in_it(ord):
    # dtype=float64 casts a float32 input first: the norm is float64-exact, not a float32
    # norm widened afterwards (1e-12 tells them apart).
    x = (np.random.default_rng(2).standard_normal((5, 7)) * 3).astype(np.float32)
    t = torch.from_numpy(x)
    want = torch.linalg.vector_norm(t, ord, [1], False, dtype=torch.float64)
    check("aten::linalg_vector_norm.out", want, x, ord, [1], False, np.dtype(np.float64))
    want = torch.linalg.vector_norm(t, ord, [1], True)
    check("aten::linalg_vector_norm.out", want, x, ord, [1], True, None)
