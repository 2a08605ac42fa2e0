"""Bound softmax and layer norm on small tensors (normalization.py's ``_SMALL`` paths: sums
as a matrix-vector product, the row maximum through a transposed copy, constant weight and
bias broadcast at bind) against PyTorch eager, with the general kernel's tolerances.
Softmax inputs hold -inf and overflowing logits, so its reference is PyTorch in float64
rounded to the tested dtype: at special values ATen's vectorised float32 exp depends on the
CPU's code path.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from opforge.kernels.portable import normalization, portable_kernels

KERNELS = portable_kernels()
TOL = {np.float32: 1e-5, np.float64: 1e-12}


def frozen(a: np.ndarray) -> np.ndarray:
    a = np.array(a)
    a.flags.writeable = False  # a program constant
    return a


def bound(key, *args):
    fn, bound_args = KERNELS[key].bind(args)
    assert fn is not KERNELS[key], "the general kernel, not a fast path"
    return lambda: fn(*bound_args)


def softmax_float64(x: np.ndarray, dim: int) -> np.ndarray:
    t = torch.from_numpy(np.ascontiguousarray(x, np.float64))
    return torch.ops.aten._softmax(t, dim, False).numpy().astype(x.dtype)


SOFTMAX_SHAPES = [(8, 16, 16), (2, 4, 32, 32), (4, 10), (64, 64), (3, 40, 7), (33, 1),
                  (300, 300)]


@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
@pytest.mark.parametrize("dim", [-1, 0])
@pytest.mark.parametrize("shape", SOFTMAX_SHAPES, ids=str)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_softmax_matches_torch(dtype, shape, dim, layout):
    rng = np.random.default_rng(len(shape) + shape[-1])
    x = (rng.standard_normal(shape[::-1]).T if layout == "transposed"
         else rng.standard_normal(shape)).astype(dtype) * 4
    if x.ndim == 3 and shape[-1] > 1:
        x[0, 0, :] = -np.inf          # a fully masked row: nan, as in ATen
        x[0, 1, : shape[-1] // 2] = -np.inf
        x[-1, -1, -1] = 80.0          # exp would overflow without the row maximum
    out = np.empty(shape, dtype)
    call = bound("aten::_softmax.out", x, dim, False, out)
    expected = softmax_float64(x, dim)
    for _ in range(2):
        with np.errstate(invalid="ignore"):
            call()
        np.testing.assert_allclose(out, expected, rtol=TOL[dtype], atol=TOL[dtype])
        out.fill(7)
    x[...] = x[::-1] if x.ndim > 1 else x  # new values through the same bound buffers
    with np.errstate(invalid="ignore"):
        call()
    expected = softmax_float64(x, dim)
    np.testing.assert_allclose(out, expected, rtol=TOL[dtype], atol=TOL[dtype])


def test_short_rows_take_the_transposed_maximum():
    x = np.zeros((8, 16, 16), np.float32)
    steps = normalization._row_max(x, 2, np.empty((8, 16, 1), np.float32))
    assert steps[0][0] is np.copyto and len(steps) == 2
    assert len(normalization._row_max(x[..., ::2], 2, np.empty((8, 16, 1), np.float32))) == 1


@pytest.mark.parametrize("constants", [True, False])
@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("shape, normalized", [((2, 16, 64), (64,)), ((1, 32, 64), (64,)),
                                               ((5, 3, 8), (3, 8)), ((4, 7), (7,)),
                                               ((300, 300), (300,))], ids=str)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_layer_norm_matches_torch(dtype, shape, normalized, affine, constants):
    rng = np.random.default_rng(shape[-1])
    x = rng.standard_normal(shape).astype(dtype) * 3 + 1
    make = frozen if constants else np.array
    w = make(rng.standard_normal(normalized).astype(dtype)) if affine else None
    b = make(rng.standard_normal(normalized).astype(dtype)) if affine else None
    keep = shape[:len(shape) - len(normalized)] + (1,) * len(normalized)
    outs = np.empty(shape, dtype), np.empty(keep, dtype), np.empty(keep, dtype)
    call = bound("aten::native_layer_norm.out", x, normalized, w, b, 1e-5, *outs)
    for _ in range(2):
        call()
        expected = torch.ops.aten.native_layer_norm(
            torch.from_numpy(x), list(normalized),
            None if w is None else torch.from_numpy(np.array(w)),
            None if b is None else torch.from_numpy(np.array(b)), 1e-5)
        for got, want in zip(outs, expected):
            np.testing.assert_allclose(got, want.numpy(), rtol=TOL[dtype], atol=TOL[dtype])
        for o in outs:
            o.fill(7)
        x[...] = x * -0.5 + 2  # new values through the same bound buffers
