"""Portable sort, topk, cumsum and cumprod kernels against PyTorch.

Tolerances: sorting moves values, so values and indices must match exactly — indices
wherever ATen defines them (its stable sort; for ``sort.values`` and ``topk`` only when
the compared values are distinct, otherwise each returned index must point at its value).
The scans accumulate in ATen's CPU accumulate type (float32 in float64, float16 in float32,
integers in int64) in the same order and round each prefix once, so they match exactly.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from opforge.errors import KernelError
from opforge.kernels.portable import portable_kernels

KERNELS = portable_kernels()
FLOATS = [np.float32, np.float64, np.float16]
INTS = [np.int32, np.int64, np.uint8]


def make(shape, dtype, layout="contiguous", seed=0, ties=True, specials=False):
    """Random values (small integers when ``ties``, so equal elements abound)."""
    rng = np.random.default_rng(seed)
    full = tuple(reversed(shape)) if layout == "transposed" else tuple(shape)
    if dtype == np.bool_:
        base = rng.random(full) < 0.5
    elif ties:
        base = rng.integers(0, 6, full).astype(dtype)
    elif np.issubdtype(dtype, np.integer):  # distinct values
        base = rng.permutation(int(np.prod(full))).reshape(full).astype(dtype)
    else:
        base = (rng.permutation(int(np.prod(full))) / 7 - 3).reshape(full).astype(dtype)
    if specials and np.issubdtype(dtype, np.floating):
        base[rng.random(full) < 0.15] = np.nan
        base[rng.random(full) < 0.05] = np.inf
        base[rng.random(full) < 0.05] = -np.inf
        base[rng.random(full) < 0.05] = -0.0
    if layout == "transposed":
        base = base.T
    return base, torch.from_numpy(np.ascontiguousarray(base))


def run(key, args, expected):
    """Run ``key`` unbound, then bound (bind once, call twice over garbage): both outs."""
    results = []
    for bound in (False, True):
        outs = [np.empty(tuple(e.shape), e.numpy().dtype) for e in expected]
        if bound:
            bind = getattr(KERNELS[key], "bind", None)
            fn, bound_args = bind((*args, *outs)) if bind else (KERNELS[key], (*args, *outs))
            fn(*bound_args)
            for out in outs:
                out.fill(True if out.dtype == np.bool_ else 7)
            fn(*bound_args)
        else:
            assert KERNELS[key](*args, *outs) is None
        results.append(outs)
    return results


def assert_same(got, expected):
    np.testing.assert_array_equal(got, expected.numpy())  # NaN equals NaN here
    assert got.dtype == expected.numpy().dtype


SHAPES = [((5, 7), "contiguous"), ((3, 4, 6), "transposed"), ((0, 5), "contiguous"),
          ((4, 0), "contiguous"), ((9,), "contiguous")]


@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("shape, layout", SHAPES)
@pytest.mark.parametrize("dtype", FLOATS + INTS + [np.bool_])
def test_sort_stable(dtype, shape, layout, descending):
    x, tx = make(shape, dtype, layout, seed=1, specials=True)
    for dim in range(-len(shape), len(shape)):
        expected = torch.sort(tx, dim=dim, descending=descending, stable=True)
        for values, indices in run("aten::sort.values_stable", (x, True, dim, descending),
                                   expected):
            assert_same(values, expected.values)
            assert_same(indices, expected.indices)


@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("dtype", FLOATS + [np.int64])
def test_sort_unstable(dtype, descending):
    # Distinct values: ATen defines the indices too.
    x, tx = make((6, 8), dtype, "transposed", seed=2, ties=False)
    expected = torch.sort(tx, dim=1, descending=descending)
    for values, indices in run("aten::sort.values", (x, 1, descending), expected):
        assert_same(values, expected.values)
        assert_same(indices, expected.indices)
    # Ties and NaN: the values are defined; each index must point at its value.
    x, tx = make((6, 8), dtype, seed=3, specials=True)
    expected = torch.sort(tx, dim=0, descending=descending)
    for values, indices in run("aten::sort.values", (x, 0, descending), expected):
        assert_same(values, expected.values)
        np.testing.assert_array_equal(np.take_along_axis(x, indices, 0), values)


def test_sort_nan_order_and_zero_dim():
    x = np.array([3.0, np.nan, 1.0, np.nan, 3.0, -0.0, 0.0, np.inf, -np.inf], np.float32)
    tx = torch.from_numpy(x)
    for descending in (False, True):
        expected = torch.sort(tx, descending=descending, stable=True)
        for values, indices in run("aten::sort.values_stable", (x, None, -1, descending),
                                   expected):
            assert_same(values, expected.values)
            assert_same(indices, expected.indices)
    scalar = np.array(2.5, np.float64)
    expected = torch.sort(torch.from_numpy(scalar))
    for values, indices in run("aten::sort.values", (scalar, 0, False), expected):
        assert_same(values, expected.values)
        assert_same(indices, expected.indices)


@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("length", [9, 1000])  # 1000: the partition-first path
@pytest.mark.parametrize("dtype", FLOATS + [np.int32, np.int64])
def test_topk(dtype, length, largest):
    x, tx = make((3, length), dtype, seed=4, ties=False)
    if dtype == np.float16:  # float16 cannot hold 3000 distinct values: keep them distinct
        x = np.asarray(np.arange(3 * length).reshape(3, length) % 2000, np.float16)
        x = np.random.default_rng(5).permuted(x, axis=1)
        tx = torch.from_numpy(x)
    for k in sorted({0, 1, 3, length // 10, length}):
        for dim in (1, -1):
            expected = torch.topk(tx, k, dim=dim, largest=largest)
            for values, indices in run("aten::topk.values", (x, k, dim, largest, True),
                                       expected):
                assert_same(values, expected.values)
                if dtype != np.float16 or length < 1000:
                    assert_same(indices, expected.indices)
                np.testing.assert_array_equal(np.take_along_axis(x, indices, 1), values)


@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
def test_topk_ties_nan_and_transposed(dtype, largest):
    for length in (12, 700):
        x, tx = make((4, length), dtype, "transposed", seed=6, specials=True)
        for k in (1, 5, length):
            expected = torch.topk(tx, k, dim=1, largest=largest)
            for values, indices in run("aten::topk.values", (x, k, 1, largest, True),
                                       expected):
                assert_same(values, expected.values)
                np.testing.assert_array_equal(np.take_along_axis(x, indices, 1), values)
        expected = torch.topk(tx, 2, dim=0, largest=largest)
        for values, _indices in run("aten::topk.values", (x, 2, 0, largest, True), expected):
            assert_same(values, expected.values)


def test_topk_rejects_k_larger_than_the_dim():
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(KernelError, match="0 <= k <= 3"):
        KERNELS["aten::topk.values"](x, 4, -1, True, True, np.empty((2, 4), np.float32),
                                     np.empty((2, 4), np.int64))


SCAN_SHAPES = [((4, 6), "contiguous"), ((3, 5, 4), "transposed"), ((0, 3), "contiguous"),
               ((7,), "contiguous"), ((), "contiguous")]


@pytest.mark.parametrize("shape, layout", SCAN_SHAPES)
@pytest.mark.parametrize("dtype", FLOATS + INTS + [np.bool_])
@pytest.mark.parametrize("name", ["cumsum", "cumprod"])
def test_scans(name, dtype, shape, layout):
    rng = np.random.default_rng(7)
    full = tuple(reversed(shape)) if layout == "transposed" else shape
    if dtype == np.bool_:
        x = rng.random(full) < 0.6
    elif np.issubdtype(dtype, np.integer):
        x = rng.integers(1, 4, full).astype(dtype)
    else:  # near 1 so that products stay finite and keep their low bits
        x = (1 + rng.standard_normal(full) * (0.3 if name == "cumprod" else 3)).astype(dtype)
    x = np.asarray(x.T if layout == "transposed" else x)
    tx = torch.from_numpy(np.ascontiguousarray(x))
    op = getattr(torch, name)
    key = f"aten::{name}.out"
    for dim in range(-max(len(shape), 1), max(len(shape), 1)):
        dtypes = [None, torch.float64, torch.int64 if dtype != np.float16 else torch.float32]
        for dt in dtypes:
            expected = op(tx, dim, dtype=dt)
            np_dt = None if dt is None else expected.numpy().dtype
            for (out,) in run(key, (x, dim, np_dt), (expected,)):
                assert_same(out, expected)


def test_float32_cumsum_accumulates_in_double_like_aten():
    x = np.random.default_rng(8).standard_normal(50_000).astype(np.float32)
    expected = torch.cumsum(torch.from_numpy(x), 0)
    for (out,) in run("aten::cumsum.out", (x, 0, None), (expected,)):
        assert_same(out, expected)


def test_cumsum_from_float64_into_float32_casts_first():
    x = np.random.default_rng(9).standard_normal((3, 200)) * 1e3
    expected = torch.cumsum(torch.from_numpy(x), 1, dtype=torch.float32)
    for (out,) in run("aten::cumsum.out", (x, 1, np.dtype(np.float32)), (expected,)):
        assert_same(out, expected)
