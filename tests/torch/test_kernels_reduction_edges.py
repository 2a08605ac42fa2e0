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
