"""The portable C++ view-copy and shape kernels against the NumPy kernels of the same keys,
bit for bit, on many shapes, strides and dtypes, and their refusals."""

from __future__ import annotations

import numpy as np
import pytest

from tests.native_runtime._portable_compare import compare, lib, refused  # noqa: F401

DTYPES = [np.float32, np.float64, np.float16, np.int64, np.int32, np.int8, np.uint8, np.bool_]


def _x(shape, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    return np.asarray(rng.standard_normal(shape) * 10).astype(dtype)


def _strided(shape, dtype=np.float32):
    """A non-contiguous view: every other column of a wider array, transposed back."""
    big = _x(shape[:-1] + (2 * shape[-1],), dtype)
    return big[..., ::2]


@pytest.mark.parametrize("dtype", DTYPES)
def test_permute_transpose_t(lib, dtype):
    for shape, dims in [((2, 3), [1, 0]), ((2, 3, 4, 5), [0, 2, 1, 3]), ((4, 5, 6), [2, 0, 1]),
                        ((3, 1, 4), [-1, 0, 1]), ((), []), ((70, 33), [1, 0])]:
        x = _x(shape, dtype)
        out = np.empty(tuple(x.shape[d] for d in dims), dtype)
        compare(lib, "aten::permute_copy.out", x, dims, out)
    x = _strided((4, 6, 5), dtype)
    compare(lib, "aten::permute_copy.out", x, [2, 1, 0], np.empty((5, 6, 4), dtype))
    compare(lib, "aten::transpose_copy.int_out", x, 0, -1, np.empty((5, 6, 4), dtype))
    compare(lib, "aten::t_copy.out", _x((3, 7), dtype), np.empty((7, 3), dtype))
    compare(lib, "aten::t_copy.out", _x((3,), dtype), np.empty((3,), dtype))


@pytest.mark.parametrize("src", [np.float32, np.float64, np.float16, np.int64, np.int8, np.bool_])
@pytest.mark.parametrize("dst", [np.float32, np.float16, np.int32, np.uint8, np.bool_, np.float64])
def test_clone_to_copy_convert(lib, src, dst):
    x = _x((3, 5), src)
    if np.dtype(src).kind == "f":
        x[0, :3] = [0.5, -2.5, 65519.0 if src != np.float16 else 1.5]
    compare(lib, "aten::_to_copy.out", x, False, None, np.empty((3, 5), dst))
    compare(lib, "aten::clone.out", x.T, None, np.empty((5, 3), dst))


def test_float16_rounding_exhaustive(lib):
    # every float16 value through float32 and back, and float32 / float64 values between
    # float16 neighbours (ties, subnormals, overflow to inf)
    h = np.arange(65536, dtype=np.uint16).view(np.float16)
    h = h[~np.isnan(h)]
    compare(lib, "aten::_to_copy.out", h, False, None, np.empty(h.shape, np.float32))
    f = h.astype(np.float32)
    mids = np.concatenate([f, (f[:-1] + f[1:]) / 2, np.nextafter(f, np.inf), np.nextafter(f, -np.inf)])
    mids = mids[np.isfinite(mids)]
    compare(lib, "aten::_to_copy.out", mids, False, None, np.empty(mids.shape, np.float16))
    d = mids.astype(np.float64)
    d = np.concatenate([d, np.nextafter(d, np.inf), np.nextafter(d, -np.inf)])
    compare(lib, "aten::_to_copy.out", d, False, None, np.empty(d.shape, np.float16))


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.float16, np.bool_])
def test_view_like_copies(lib, dtype):
    x = _x((2, 3, 4), dtype)
    for key in ("aten::view_copy.out", "aten::_unsafe_view.out"):
        compare(lib, key, x, [6, -1], np.empty((6, 4), dtype))
        compare(lib, key, x.transpose(2, 0, 1), [24], np.empty((24,), dtype))
    compare(lib, "aten::unsqueeze_copy.out", x, 1, np.empty((2, 1, 3, 4), dtype))
    compare(lib, "aten::unsqueeze_copy.out", x, -1, np.empty((2, 3, 4, 1), dtype))
    y = _x((1, 3, 1, 4), dtype)
    compare(lib, "aten::squeeze_copy.out", y, np.empty((3, 4), dtype))
    compare(lib, "aten::squeeze_copy.dim_out", y, 2, np.empty((1, 3, 4), dtype))
    compare(lib, "aten::squeeze_copy.dim_out", y, 1, np.empty((1, 3, 1, 4), dtype))
    compare(lib, "aten::squeeze_copy.dims_out", y, [0, -2], np.empty((3, 4), dtype))
    for key in ("aten::alias_copy.out", "aten::detach_copy.out", "aten::lift_fresh_copy.out"):
        compare(lib, key, x[:, ::2], np.empty((2, 2, 4), dtype))
    compare(lib, "aten::expand_copy.out", _x((3, 1), dtype), [2, 3, -1 + 6], False,
            np.empty((2, 3, 5), dtype))
    compare(lib, "aten::expand_copy.out", np.array(3, dtype), [4], False, np.empty((4,), dtype))
    compare(lib, "aten::copy.out", x, _x((4,), np.float64), False, np.empty((2, 3, 4), dtype))
    compare(lib, "aten::view_copy.dtype_out", _x((2, 4), np.float32), np.int32,
            np.empty((2, 4), np.int32))
    compare(lib, "aten::view_copy.dtype_out", _x((2, 4), np.float32)[:, ::2], np.float16,
            np.empty((2, 4), np.float16))


@pytest.mark.parametrize("dtype", [np.float32, np.int8, np.float64])
def test_slice_select_diagonal(lib, dtype):
    x = _x((5, 7, 3), dtype)
    for dim, start, end, step in [(1, 1, 6, 2), (0, None, None, 1), (-1, -2, None, 1),
                                  (1, -100, 100, 3), (1, 5, 2, 1), (0, 4, 5, 7)]:
        ref = x[(slice(None),) * (dim % 3) + (slice(start, end, step),)]
        compare(lib, "aten::slice_copy.Tensor_out", x, dim, start, end, step, np.empty(ref.shape, dtype))
    for dim, index in [(0, 4), (1, -7), (-1, 0)]:
        ref = np.take(x, index, axis=dim)
        compare(lib, "aten::select_copy.int_out", x, dim, index, np.empty(ref.shape, dtype))
    for offset, d1, d2 in [(0, 0, 1), (2, 0, 1), (-3, 0, 1), (1, 2, 0), (9, 0, 1)]:
        ref = np.diagonal(x, offset, d1, d2)
        compare(lib, "aten::diagonal_copy.out", x, offset, d1, d2, np.empty(ref.shape, dtype))


def test_as_strided(lib):
    x = _x((4, 6))
    compare(lib, "aten::as_strided_copy.out", x, [3, 2], [4, 1], 2, np.empty((3, 2), np.float32))
    compare(lib, "aten::as_strided_copy.out", x.T, [3, 2], [4, 1], None, np.empty((3, 2), np.float32))
    refused(lib, "aten::as_strided_copy.out", x, [3, 2], [8, 1], 10, np.empty((3, 2), np.float32),
            match="reach element 27 of an input of 24")


def test_view_copy_refusals(lib):
    x = _x((2, 3))
    refused(lib, "aten::permute_copy.out", x, [1, 0], np.empty((2, 3), np.float32),
            match=r"out has shape \[2, 3\] — valid: \[3, 2\]")
    refused(lib, "aten::permute_copy.out", x, [1, 1], np.empty((3, 3), np.float32),
            match="appears twice")
    refused(lib, "aten::permute_copy.out", x, [2, 0], np.empty((3, 2), np.float32),
            match="dim 2 is out of range")
    refused(lib, "aten::select_copy.int_out", x, 1, 3, np.empty((2,), np.float32),
            match=r"index — found 3 — valid: \[-3, 2\]")
    refused(lib, "aten::select_copy.int_out", x, 1, -4, np.empty((2,), np.float32),
            match=r"index — found -4")
    refused(lib, "aten::view_copy.out", x, [7], np.empty((7,), np.float32), match="element count")
    refused(lib, "aten::expand_copy.out", x, [2, 4], False, np.empty((2, 4), np.float32),
            match="found size 3 in dim 1 against 4")
    refused(lib, "aten::slice_copy.Tensor_out", x, 1, 0, 3, 0, np.empty((2, 3), np.float32),
            match="step — found 0")


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.float16, np.uint8])
def test_cat_stack(lib, dtype):
    a, b, c = _x((2, 3, 4), dtype, 1), _x((2, 1, 4), dtype, 2), _x((2, 5, 4), dtype, 3)
    compare(lib, "aten::cat.out", [a, b, c], 1, np.empty((2, 9, 4), dtype))
    compare(lib, "aten::cat.out", [a, a[:, :, ::-1].copy()], -1, np.empty((2, 3, 8), dtype))
    compare(lib, "aten::cat.out", [a.transpose(1, 0, 2), b.transpose(1, 0, 2)], 0,
            np.empty((4, 2, 4), dtype))
    compare(lib, "aten::cat.out", [a, np.empty((0,), dtype), a], 0, np.empty((4, 3, 4), dtype))
    compare(lib, "aten::cat.out", [a, _x((2, 3, 4), np.float64)], 0, np.empty((4, 3, 4), dtype))
    for dim in (0, 1, -1, 3):
        ref = np.stack([a, a], axis=dim)
        compare(lib, "aten::stack.out", [a, a[::-1]], dim, np.empty(ref.shape, dtype))


def test_split_unbind(lib):
    x = _x((4, 7, 3))
    outs = [np.empty((4, s, 3), np.float32) for s in (2, 0, 5)]
    compare(lib, "aten::split_with_sizes_copy.out", x, [2, 0, 5], 1, outs, outs=1)
    outs = [np.empty((4, 7, 3), np.float32)[:, :s] for s in (3, 3, 1)]
    outs = [np.empty((4, s, 3), np.float32) for s in (3, 3, 1)]
    compare(lib, "aten::split_copy.Tensor_out", x, 3, 1, outs, outs=1)
    outs = [np.empty((4, 7), np.float32) for _ in range(3)]
    compare(lib, "aten::unbind_copy.int_out", x, -1, outs, outs=1)
    refused(lib, "aten::split_with_sizes_copy.out", x, [2, 4], 1,
            [np.empty((4, 2, 3), np.float32), np.empty((4, 4, 3), np.float32)],
            match="add up to 6 — valid: 7")


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.float16])
def test_pad_repeat_flip_roll_pixel_shuffle(lib, dtype):
    x = _x((2, 3, 4), dtype)
    for pad, value in [([1, 2], 0), ([0, 0, 2, 1], 1.5), ([-1, 2, 1, -2], -3), ([1, 1, 1, 1, 1, 1], 7)]:
        shape = list(x.shape)
        for i in range(len(pad) // 2):
            shape[-1 - i] += pad[2 * i] + pad[2 * i + 1]
        compare(lib, "aten::constant_pad_nd.out", x, pad, value, np.empty(shape, dtype))
    for repeats in ([1, 2, 3], [2, 1, 1, 2], [1, 0, 1]):
        ref = np.tile(x.reshape((1,) * (len(repeats) - 3) + x.shape), repeats)
        compare(lib, "aten::repeat.out", x, repeats, np.empty(ref.shape, dtype))
    for dims in ([0], [1, 2], [-1, 0, 1], []):
        compare(lib, "aten::flip.out", x, dims, np.empty(x.shape, dtype))
    for shifts, dims in [([1], [0]), ([-5, 2], [1, 2]), ([7], []), ([1, 1], [2, 2]), ([3], [1])]:
        compare(lib, "aten::roll.out", x, shifts, dims, np.empty(x.shape, dtype))
    compare(lib, "aten::roll.out", x[:, ::-1], [2], [], np.empty(x.shape, dtype))
    y = _x((2, 8, 3, 5), dtype)
    compare(lib, "aten::pixel_shuffle.out", y, 2, np.empty((2, 2, 6, 10), dtype))
    compare(lib, "aten::pixel_shuffle.out", y[:, :, :, ::-1], 1, np.empty(y.shape, dtype))
    refused(lib, "aten::flip.out", x, [0, -3], np.empty(x.shape, dtype), match="appears twice")
