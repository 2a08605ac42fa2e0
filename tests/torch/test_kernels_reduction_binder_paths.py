"""When the sum / mean / any / all binders reduce straight into ``out`` (``np.add.reduce``,
``np.logical_or.reduce``, ...) and when they leave the op to the general kernel, and what
each path computes against PyTorch.

A guard that sends a float32 sum to the general kernel is only slow; one that binds an
integer sum (which accumulates in int64), a float16 mean (float32 opmath), a sum with an
explicit dtype or an out aliasing the input computes wrong values. Both directions are
pinned, each with the values checked.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from opforge.kernels.portable import portable_kernels

KERNELS = portable_kernels()
SUM, MEAN = "aten::sum.IntList_out", "aten::mean.out"


def bind_and_run(key, *args):
    """``(fast, out)``: whether the bound pair is a fast path, and its out after a call."""
    fn, bound = KERNELS[key].bind(args)
    fn(*bound)
    return fn is not KERNELS[key], args[-1]


def sample(shape, dtype):
    rng = np.random.default_rng(0)
    return (rng.standard_normal(shape) * 4).astype(dtype)


@pytest.mark.parametrize("dim, keepdim, out_shape", [([1], False, (3, 5)), ([0, 2], True, (1, 4, 1)),
                                                     (None, False, ()), ([-1], False, (3, 4))],
                         ids=str)
@pytest.mark.parametrize("key", [SUM, MEAN])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_float_sums_and_means_bind(dtype, key, dim, keepdim, out_shape):
    x = sample((3, 4, 5), dtype)
    fast, out = bind_and_run(key, x, dim, keepdim, None, np.empty(out_shape, dtype))
    assert fast
    op = torch.sum if key == SUM else torch.mean
    want = op(torch.from_numpy(x), dim, keepdim) if dim is not None else op(torch.from_numpy(x))
    np.testing.assert_allclose(out, want.numpy().reshape(out_shape), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", ["int32", "float16", "dtype", "aliasing", "empty"])
def test_sums_the_general_kernel_keeps(case):
    x = sample((4, 6), np.float32)
    args = [x, [1], False, None, np.empty(4, np.float32)]
    if case == "int32":
        x = np.arange(24, dtype=np.int32).reshape(4, 6) * 100_000_000  # wraps in int32
        args = [x, [1], False, None, np.empty(4, np.int64)]
    elif case == "float16":
        x = sample((4, 6), np.float16)
        args = [x, [1], False, None, np.empty(4, np.float16)]
    elif case == "dtype":
        args = [x, [1], False, np.dtype(np.float64), np.empty(4, np.float64)]
    elif case == "aliasing":
        args = [x, [1], False, None, x[:, 0]]
    elif case == "empty":
        x = np.empty((4, 0), np.float32)
        args = [x, [1], False, None, np.empty(4, np.float32)]
    want = torch.sum(torch.from_numpy(x.copy()), [1], dtype=torch.float64 if case == "dtype"
                     else None)
    fast, out = bind_and_run(SUM, *args)
    assert not fast
    np.testing.assert_allclose(out, want.numpy(), rtol=2e-3 if case == "float16" else 1e-5)


@pytest.mark.parametrize("key, ufunc", [("aten::any.dims_out", np.any),
                                        ("aten::all.dims_out", np.all)])
def test_bool_any_all_bind(key, ufunc):
    x = np.random.default_rng(1).random((3, 4, 5)) < 0.5
    for dim, shape in (([1], (3, 5)), ([0, 2], (4,))):
        fast, out = bind_and_run(key, x, dim, False, np.empty(shape, np.bool_))
        assert fast
        np.testing.assert_array_equal(out, ufunc(x, axis=tuple(dim)))
    fast, out = bind_and_run("aten::any.all_out", x, np.empty((), np.bool_))
    assert fast and bool(out) == bool(x.any())


@pytest.mark.parametrize("x, out", [(np.ones((3, 4), np.float32), np.empty(3, np.bool_)),
                                    (np.ones((3, 4), np.bool_), np.empty(3, np.float32)),
                                    (np.ones((3, 0), np.bool_), np.empty(3, np.bool_))],
                         ids=["float input", "float out", "empty"])
def test_any_all_the_general_kernel_keeps(x, out):
    fast, out = bind_and_run("aten::any.dims_out", x, [1], False, out)
    assert not fast
    np.testing.assert_array_equal(out, np.any(x, axis=1))


def test_an_explicit_dtype_equal_to_the_input_still_binds():
    x = sample((4, 6), np.float32)
    fast, out = bind_and_run(SUM, x, [1], False, np.dtype(np.float32), np.empty(4, np.float32))
    assert fast
    np.testing.assert_allclose(out, torch.sum(torch.from_numpy(x), [1]).numpy(), rtol=1e-5)
