"""The portable C++ upsampling kernels against the NumPy kernels of the same keys, bit for
bit: the same source indices (scales, nearest-exact, align_corners) and the same weighted
sums in the same dtype."""

from __future__ import annotations

import numpy as np
import pytest

from tests.native_runtime._portable_compare import compare, lib, refused  # noqa: F401

SIZES = [(5, 10), (4, 7), (7, 3), (6, 6), (3, 1), (1, 4), (9, 18)]


def _x(shape, dtype, seed=0):
    return np.asarray(np.random.default_rng(seed).standard_normal(shape) * 4).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.uint8])
def test_nearest(lib, dtype):
    for (a, b), (c, d) in zip(SIZES, SIZES[1:] + SIZES[:1]):
        for scale in (None, 2.0, 0.75, b / a):
            x = _x((2, 3, a), dtype)
            out = np.empty((2, 3, b), dtype)
            compare(lib, "aten::upsample_nearest1d.out", x, [b], scale, out)
            compare(lib, "aten::_upsample_nearest_exact1d.out", x, [b], scale, out)
            x = _x((1, 2, a, c), dtype)
            out = np.empty((1, 2, b, d), dtype)
            compare(lib, "aten::upsample_nearest2d.out", x, [b, d], scale, None, out)
            compare(lib, "aten::_upsample_nearest_exact2d.out", x, [b, d], None, scale, out)
            compare(lib, "aten::upsample_nearest2d.vec_out", x, None,
                    None if scale is None else [scale, scale], out)
            x = _x((1, 1, a, c, 2), dtype)
            out = np.empty((1, 1, b, d, 3), dtype)
            compare(lib, "aten::upsample_nearest3d.out", x, [b, d, 3], scale, None, None, out)
            compare(lib, "aten::_upsample_nearest_exact3d.out", x, [b, d, 3], None, scale, 1.5, out)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_linear(lib, dtype):
    for (a, b), (c, d) in zip(SIZES, SIZES[1:] + SIZES[:1]):
        for align in (False, True):
            for scale in (None, 2.0, 0.6):
                x = _x((2, 3, a), dtype)
                compare(lib, "aten::upsample_linear1d.out", x, [b], align, scale, np.empty((2, 3, b), dtype))
                x = _x((1, 2, a, c), dtype)
                out = np.empty((1, 2, b, d), dtype)
                compare(lib, "aten::upsample_bilinear2d.out", x, [b, d], align, scale, None, out)
                compare(lib, "aten::upsample_bilinear2d.vec_out", x, None, align,
                        None if scale is None else [scale, scale], out)
                x = _x((1, 1, a, c, 2), dtype)
                compare(lib, "aten::upsample_trilinear3d.out", x, [b, d, 3], align, None, scale, None,
                        np.empty((1, 1, b, d, 3), dtype))
    x = _x((1, 1, 2, 2), dtype)
    x[0, 0, 0, 0] = np.inf  # inf * 0 is NaN in both
    compare(lib, "aten::upsample_bilinear2d.out", x, [3, 5], False, None, None, np.empty((1, 1, 3, 5), dtype))


def test_refusals(lib):
    refused(lib, "aten::upsample_bilinear2d.out", _x((1, 1, 2, 2), np.uint8), [4, 4], False, None, None,
            np.empty((1, 1, 4, 4), np.uint8), match="found dtype uint8")
    refused(lib, "aten::upsample_nearest2d.out", _x((1, 1, 2, 2), np.float32), [4, 4], None, None,
            np.empty((1, 2, 4, 4), np.float32), match="out sharing N and C")
