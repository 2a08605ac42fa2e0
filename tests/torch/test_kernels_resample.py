"""Portable upsampling kernels (nearest, nearest-exact, linear in 1-3 d) against PyTorch.

Tolerances: nearest and nearest-exact gather, so they must match exactly (the source
indices reproduce ATen's float32 index arithmetic, 2-d's own ``nearest_idx`` included).
Linear interpolation uses ATen's indices and weights, but ATen picks between two CPU
kernels by thread count and channel count, and its compiled loops fuse multiply-adds,
while NumPy rounds each product: a few ulp of the output's magnitude. Inputs are standard
normal (|x| < ~4), so float32 allows rtol = atol = 2e-6 (~8 ulp at 1), float64 1e-13,
float16 2e-3 (weights rounded to float16 as in ATen, one rounding of the result).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from opforge.errors import KernelError
from opforge.kernels.portable import portable_kernels

KERNELS = portable_kernels()
A = torch.ops.aten
TOL = {np.float16: 2e-3, np.float32: 2e-6, np.float64: 1e-13}
FLOATS = [np.float32, np.float64, np.float16]


def make(shape, dtype, layout="contiguous", seed=0):
    """A random array of ``shape``: contiguous, a transposed view, or a strided view."""
    rng = np.random.default_rng(seed)
    full = tuple(reversed(shape)) if layout == "transposed" else tuple(shape)
    if layout == "strided":
        full = full[:-1] + (full[-1] * 2,)
    if np.issubdtype(dtype, np.integer):
        base = rng.integers(0, 256, full).astype(dtype)
    else:
        base = rng.standard_normal(full).astype(dtype)
    if layout == "transposed":
        base = base.T
    elif layout == "strided":
        base = base[..., ::2]
    assert base.shape == tuple(shape)
    return base, torch.from_numpy(np.ascontiguousarray(base))


def run_bound(key, args, outs):
    """Run ``key`` the way the executor does: bind once, then call the bound pair twice,
    the second time over garbage left in the outs."""
    bind = getattr(KERNELS[key], "bind", None)
    fn, bound_args = bind(args) if bind is not None else (KERNELS[key], args)
    fn(*bound_args)
    for out in outs:
        out.fill(7)
    fn(*bound_args)


def check(key, expected, *args, exact=False):
    """Run ``key`` unbound and bound; compare both with the torch result."""
    for bound in (False, True):
        out = np.empty(tuple(expected.shape), dtype=expected.numpy().dtype)
        if bound:
            run_bound(key, (*args, out), [out])
        else:
            assert KERNELS[key](*args, out) is None
        tol = 0 if exact else TOL[out.dtype.type]
        np.testing.assert_allclose(out, expected.numpy(), rtol=tol, atol=tol)


# (input shape, output size, scale factors for .vec (None: from the size))
CASES_2D = [
    ((2, 3, 4, 5), [8, 10], None), ((1, 2, 5, 3), [7, 4], None),
    ((2, 1, 6, 6), [3, 4], None), ((1, 3, 3, 4), [3, 4], None),
    ((2, 2, 4, 4), None, [2.0, 2.0]), ((1, 2, 5, 7), None, [1.5, 0.6]),
    ((1, 1, 6, 1), None, [1.1, 1.3333]), ((1, 2, 3, 5), None, [2.7, 1.0]),
    ((0, 2, 3, 4), [6, 8], None),  # ATen refuses C == 0 but takes N == 0
]
LAYOUTS = ["contiguous", "transposed", "strided"]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", FLOATS + [np.uint8])
@pytest.mark.parametrize("shape, size, scales", CASES_2D)
def test_upsample_nearest2d(shape, size, scales, dtype, layout):
    x, tx = make(shape, dtype, layout, seed=1)
    expected = A.upsample_nearest2d.vec(tx, size, scales)
    check("aten::upsample_nearest2d.vec_out", expected, x, size, scales, exact=True)
    osize = list(expected.shape[2:])
    sh, sw = scales if scales else (None, None)
    check("aten::upsample_nearest2d.out", A.upsample_nearest2d(tx, osize, sh, sw),
          x, osize, sh, sw, exact=True)
    check("aten::_upsample_nearest_exact2d.out", A._upsample_nearest_exact2d(tx, osize, sh, sw),
          x, osize, sh, sw, exact=True)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape, size, scales", CASES_2D)
def test_upsample_bilinear2d(shape, size, scales, dtype, align_corners, layout):
    x, tx = make(shape, dtype, layout, seed=2)
    expected = A.upsample_bilinear2d.vec(tx, size, align_corners, scales)
    check("aten::upsample_bilinear2d.vec_out", expected, x, size, align_corners, scales)
    osize = list(expected.shape[2:])
    sh, sw = scales if scales else (None, None)
    check("aten::upsample_bilinear2d.out",
          A.upsample_bilinear2d(tx, osize, align_corners, sh, sw),
          x, osize, align_corners, sh, sw)


@pytest.mark.parametrize("dtype", FLOATS + [np.uint8])
@pytest.mark.parametrize("length, size, scale", [
    (5, 10, None), (5, 5, 2.0), (4, 7, None), (7, 3, 0.5), (1, 4, None), (6, 13, 2.2)])
def test_upsample_1d(length, size, scale, dtype):
    x, tx = make((2, 3, length), dtype, "strided", seed=3)
    check("aten::upsample_nearest1d.out", A.upsample_nearest1d(tx, [size], scale),
          x, [size], scale, exact=True)
    check("aten::_upsample_nearest_exact1d.out",
          A._upsample_nearest_exact1d(tx, [size], scale), x, [size], scale, exact=True)
    if dtype != np.uint8:
        for align_corners in (False, True):
            check("aten::upsample_linear1d.out",
                  A.upsample_linear1d(tx, [size], align_corners, scale),
                  x, [size], align_corners, scale)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape, size, scales", [
    ((1, 2, 3, 4, 5), [6, 8, 10], (None, None, None)),
    ((2, 1, 4, 3, 2), [3, 5, 2], (1.0, 1.7, None)),
])
def test_upsample_3d(shape, size, scales, dtype):
    x, tx = make(shape, dtype, "transposed", seed=4)
    check("aten::upsample_nearest3d.out", A.upsample_nearest3d(tx, size, *scales),
          x, size, *scales, exact=True)
    check("aten::_upsample_nearest_exact3d.out",
          A._upsample_nearest_exact3d(tx, size, *scales), x, size, *scales, exact=True)
    for align_corners in (False, True):
        check("aten::upsample_trilinear3d.out",
              A.upsample_trilinear3d(tx, size, align_corners, *scales),
              x, size, align_corners, *scales)


def test_bilinear_spreads_inf_and_nan_like_aten():
    # An unchanged axis still computes x * 1 + x * 0, so inf becomes NaN there, as in ATen.
    x = np.array([[[[1.0, np.inf, 3.0, np.nan], [0.0, 2.0, -np.inf, 4.0]]]], np.float32)
    tx = torch.from_numpy(x)
    for size in ([2, 4], [3, 7], [1, 2]):
        expected = A.upsample_bilinear2d(tx, size, False)
        out = np.empty(tuple(expected.shape), np.float32)
        with np.errstate(invalid="ignore"):
            run_bound("aten::upsample_bilinear2d.out", (x, size, False, None, None, out), [out])
        np.testing.assert_array_equal(np.isnan(out), np.isnan(expected.numpy()))
        np.testing.assert_allclose(out, expected.numpy(), rtol=1e-6, atol=1e-6)


def test_linear_refuses_uint8():
    x = np.zeros((1, 1, 2, 2), np.uint8)
    out = np.empty((1, 1, 4, 4), np.uint8)
    with pytest.raises(KernelError, match="uint8"):
        KERNELS["aten::upsample_bilinear2d.out"](x, [4, 4], False, None, None, out)


def test_empty_spatial_input_is_refused():
    x = np.zeros((1, 1, 0, 2), np.float32)
    out = np.empty((1, 1, 2, 4), np.float32)
    with pytest.raises(KernelError, match="empty spatial"):
        KERNELS["aten::upsample_nearest2d.out"](x, [2, 4], None, None, out)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("spatial", [1, 2, 3])
@pytest.mark.parametrize("exact", [False, True])
def test_nearest_source_indices_exhaustively(exact, spatial, dtype):
    # Every size pair up to 12 -> 30, with no scale and with scales just off in/out: the
    # float32 rounding of the scale and of each product decides many of these indices.
    name = ("_upsample_nearest_exact" if exact else "upsample_nearest") + f"{spatial}d"
    op, key = getattr(A, name), f"aten::{name}.out"
    for size_in in range(1, 13):
        x = np.arange(size_in, dtype=dtype).reshape((1, 1) + (1,) * (spatial - 1) + (-1,))
        tx = torch.from_numpy(x)
        for size_out in range(1, 31):
            osize = [1] * (spatial - 1) + [size_out]
            for scale in (None, size_out / size_in * 1.0001, size_out / size_in * 0.9999):
                scales = [None] * (spatial - 1) + [scale]
                expected = op(tx, osize, *scales).numpy()
                out = np.empty(expected.shape, dtype)
                KERNELS[key](x, osize, *scales, out)
                np.testing.assert_array_equal(out, expected, err_msg=f"{size_in}->{osize}")


@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("spatial", [1, 2])
def test_linear_source_positions_exhaustively(spatial, align_corners):
    # On x = arange the output is the interpolated source position itself, so a wrong
    # index or weight shows as an error of order 1 (rounding stays below 1e-5).
    name = "upsample_linear1d" if spatial == 1 else "upsample_bilinear2d"
    op, key = getattr(A, name), f"aten::{name}.out"
    for size_in in range(1, 13):
        x = np.arange(size_in, dtype=np.float32).reshape((1, 1) + (1,) * (spatial - 1) + (-1,))
        tx = torch.from_numpy(x)
        for size_out in range(1, 31):
            osize = [1] * (spatial - 1) + [size_out]
            for scale in (None, size_out / size_in * 1.0001, size_out / size_in * 0.9999):
                scales = [None] * (spatial - 1) + [scale]
                expected = op(tx, osize, align_corners, *scales).numpy()
                out = np.empty(expected.shape, np.float32)
                KERNELS[key](x, osize, align_corners, *scales, out)
                np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5,
                                           err_msg=f"{size_in}->{osize}")
