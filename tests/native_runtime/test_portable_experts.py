"""The portable C++ mixture-of-experts kernels against the NumPy kernels of the same keys:
histc and index_add bit for bit (the same operations in the same order), the grouped matmul
within the GEMMs' rounding (our blocked GEMM against BLAS), and the refusals."""

from __future__ import annotations

import numpy as np
import pytest

from tests.native_runtime._portable_compare import compare, lib, numpy_kernels, refused, run_both  # noqa: F401

GROUPED = "transformers::grouped_mm_fallback.out"


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_grouped_mm_fallback(lib, numpy_kernels, dtype):
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((9, 12)).astype(dtype), rng.standard_normal((4, 12, 5)).astype(dtype)
    # empty groups, a group past the rows, rows after the last offset, a negative bound
    for offs in ([2, 2, 6, 9], [0, 3, 3, 20], [0, 0, 0, 0], [4, 4, 4, 4], [-2, 1, 1, 9]):
        for offs_dtype in (np.int32, np.int64):
            out = np.empty((9, 5), dtype)
            [(want, got)] = run_both(lib, numpy_kernels, GROUPED,
                                     [x, w, np.array(offs, offs_dtype), out], [3])
            # 12-term float products summed in another order: a few ulps of the magnitudes
            bound = 2 * 12 * np.finfo(dtype).eps * (np.abs(x) @ np.abs(w).max(0)).max()
            np.testing.assert_allclose(got, want, rtol=0, atol=bound)
    refused(lib, GROUPED, x, w, np.zeros(4, np.float32), np.empty((9, 5), dtype),
            match=r"offs — found dtype float32 — valid: int32 or int64")
    refused(lib, GROUPED, x, w, np.zeros(3, np.int32), np.empty((9, 5), dtype),
            match=r"valid: one offset per expert")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_histc(lib, dtype):
    rng = np.random.default_rng(1)
    ids = rng.integers(0, 8, 40).astype(dtype)  # expert ids, what a MoE layer counts
    compare(lib, "aten::histc.out", ids, 8, 0, 7, np.empty(8, dtype))
    x = (rng.standard_normal(50) * 4).astype(dtype)
    x[::7] = np.nan
    for bins, lo, hi in ((10, -3, 3), (7, 0, 0), (1, -1, 1), (100, -10, 0)):
        compare(lib, "aten::histc.out", x[~np.isnan(x)] if lo == hi else x, bins, lo, hi,
                np.empty(bins, dtype))
    compare(lib, "aten::histc.out", np.full(5, 2.5, dtype), 4, 0, 0, np.empty(4, dtype))
    refused(lib, "aten::histc.out", x, 4, 3, 1, np.empty(4, dtype), match=r"min 3 > max 1")


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64, np.int32])
def test_index_add(lib, dtype):
    rng = np.random.default_rng(2)
    for shape, dim, count in (((6, 4), 0, 9), ((3, 5, 2), 1, 7), ((5,), 0, 12), ((4, 3), 1, 0)):
        self = (rng.standard_normal(shape) * 3).astype(dtype)
        source_shape = list(shape)
        source_shape[dim] = count
        source = (rng.standard_normal(source_shape) * 3).astype(dtype)
        index = rng.integers(0, shape[dim], count)  # repeated indices accumulate
        for alpha in (1, 2):
            compare(lib, "aten::index_add.out", self, dim, index, source, alpha,
                    np.empty(shape, dtype))
    refused(lib, "aten::index_add.out", np.zeros((3, 2), dtype), 0, np.array([0, 3]),
            np.ones((2, 2), dtype), 1, np.empty((3, 2), dtype), match=r"index — found 3 — valid: \[0, 2\]")


def test_empty_permuted_checks_the_out(lib):
    lib.kernel("aten::empty_permuted.out")([2, 3], [1, 0], np.empty((2, 3), np.float32))
    refused(lib, "aten::empty_permuted.out", [2, 3], [1, 0], np.empty((3, 2), np.float32),
            match="empty_permuted")


def test_bincount(lib):
    """Counts (int64) and weighted sums (rounded once from float64) of the ids, written from
    the start of the out's slot (its capacity: the size's upper bound)."""
    rng = np.random.default_rng(4)
    ids = rng.integers(0, 6, 30)
    for minlength in (0, 4, 9):
        compare(lib, "aten::bincount.out", ids.astype(np.int32), None, minlength,
                np.empty(12, np.int64))
        for dtype in (np.float32, np.float64):
            compare(lib, "aten::bincount.out", ids, rng.standard_normal(30).astype(dtype),
                    minlength, np.empty(12, dtype))
    compare(lib, "aten::bincount.out", np.zeros(0, np.int64), None, 3, np.empty(5, np.int64))
    refused(lib, "aten::bincount.out", np.array([1, 7]), None, 0, np.empty(5, np.int64),
            match=r"result size — found 8 — valid: at most 5")
    refused(lib, "aten::bincount.out", np.array([1, -2]), None, 0, np.empty(5, np.int64),
            match=r"the id -2 — valid: non-negative")
