"""The portable C++ sort and topk against the NumPy kernels of the same keys, bit for bit:
NaN greatest, equal elements in input order in both directions."""

from __future__ import annotations

import numpy as np
import pytest

from tests.native_runtime._portable_compare import compare, lib, refused  # noqa: F401


def _ties(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    x = np.asarray(rng.integers(-3, 4, shape)).astype(dtype)  # many equal values
    if np.dtype(dtype).kind == "f" and x.size > 4:
        flat = x.reshape(-1)
        flat[::5] = np.nan
        flat[1::7] = -0.0
    return x


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int64, np.int32, np.uint8, np.bool_])
def test_sort(lib, dtype):
    for shape, dim in [((7,), 0), ((4, 9), 1), ((4, 9), 0), ((3, 5, 6), -2), ((), 0), ((0, 3), 1)]:
        x = _ties(shape, dtype)
        for descending in (False, True):
            compare(lib, "aten::sort.values", x, dim, descending, np.empty(shape, dtype),
                    np.empty(shape, np.int64), outs=2)
            compare(lib, "aten::sort.values_stable", x, True, dim, descending,
                    np.empty(shape, dtype), np.empty(shape, np.int64), outs=2)


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.float16])
def test_topk(lib, dtype):
    for shape, k, dim in [((10,), 3, 0), ((4, 9), 9, 1), ((4, 9), 0, -1), ((5, 6, 7), 2, 1), ((), 1, 0)]:
        x = _ties(shape, dtype, 1)
        for largest in (True, False):
            out_shape = list(shape)
            if shape:
                out_shape[dim] = k
            compare(lib, "aten::topk.values", x, k, dim, largest, True, np.empty(out_shape, dtype),
                    np.empty(out_shape, np.int64), outs=2)
    # a long row takes the NumPy kernel's partition path: distinct values, the same k
    x = np.random.default_rng(2).permutation(4096).astype(dtype if dtype != np.float16 else np.float32).reshape(2, 2048)
    compare(lib, "aten::topk.values", x, 5, 1, True, True, np.empty((2, 5), x.dtype),
            np.empty((2, 5), np.int64), outs=2)
    refused(lib, "aten::topk.values", x, 2049, 1, True, True, np.empty((2, 2049), x.dtype),
            np.empty((2, 2049), np.int64), match=r"k — found 2049 — valid: 0 <= k <= 2048")


@pytest.mark.parametrize("src,dst", [(np.float32, np.float32), (np.float16, np.float16), (np.int64, np.int64),
                                     (np.int32, np.int64), (np.bool_, np.int64), (np.float32, np.float64),
                                     (np.int8, np.int8), (np.bool_, np.bool_), (np.int64, np.float32)])
def test_cumsum_cumprod(lib, src, dst):
    rng = np.random.default_rng(3)
    for shape, dim in [((17,), 0), ((4, 9), 1), ((4, 9), -2), ((3, 5, 6), 1), ((), 0), ((0, 2), 1)]:
        x = np.asarray(rng.standard_normal(shape) * 3 + 0.5).astype(src)
        compare(lib, "aten::cumsum.out", x, dim, None, np.empty(shape, dst))
        compare(lib, "aten::cumprod.out", x, dim, None, np.empty(shape, dst))
