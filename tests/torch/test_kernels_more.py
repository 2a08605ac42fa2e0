"""Portable atan2, isnan/isinf, max/min along a dim, vector norms, batch norm with batch
statistics (instance norm) and embedding bags against PyTorch.

Tolerances: isnan/isinf, max/min (values and first-occurrence indices) and the embedding
bags' index outputs are exact. atan2 is one libm call on each side, correctly rounded to
~1 ulp: float32 rtol/atol 1e-6, float64 1e-14, float16 1e-3 (computed in float32 and
rounded once on both sides). Norms and normalisation reduce K <= 60 elements in different
summation orders: as in test_kernels_reduction, float32 1e-5, float64 1e-12, float16
(accumulated in float32, rounded once) 2e-3. Embedding-bag sums add at most ~15 rows.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from opforge.errors import KernelError

from kernel_check import KERNELS, check_kernel, make_array

TOL = {np.float16: 2e-3, np.float32: 1e-5, np.float64: 1e-12}
FLOATS = [np.float32, np.float64, np.float16]


def make(shape, dtype, layout="contiguous", seed=0):
    return make_array(shape, dtype, layout, seed)


def check(key, expected, *args, tol=None):
    check_kernel(key, expected, *args, tols=TOL, tol=tol)


# --- atan2, isnan, isinf --------------------------------------------------------------------

ATAN2_TOL = {np.float32: 1e-6, np.float64: 1e-14, np.float16: 1e-3}


@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
@pytest.mark.parametrize("dtype", FLOATS + [np.int64, np.int32, np.bool_])
def test_atan2(dtype, layout):
    y, ty = make((4, 6), dtype, layout, seed=1)
    x, tx = make((6,), dtype, seed=2)  # broadcast
    expected = torch.atan2(ty, tx)
    tol = ATAN2_TOL.get(expected.numpy().dtype.type)
    check("aten::atan2.out", expected, y, x, tol=tol)
    check("aten::atan2.out", torch.atan2(tx, ty), x, y, tol=tol)
    empty, tempty = make((0, 6), dtype, seed=3)
    check("aten::atan2.out", torch.atan2(tempty, tx), empty, x, tol=tol)


def test_atan2_special_values_and_mixed_dtypes():
    v = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0], np.float32)
    y, x = np.meshgrid(v, v)
    # C99 Annex F's values at ±0, ±inf and NaN (Python's math.atan2 implements them itself),
    # not PyTorch's float32 ones, which come from a vectorised atan2 that differs by CPU
    exact = [[math.atan2(a, b) for a, b in zip(row_y, row_x)] for row_y, row_x in zip(y, x)]
    check("aten::atan2.out", torch.tensor(exact, dtype=torch.float64).float(), y, x, tol=1e-6)
    signs = np.empty_like(y)
    KERNELS["aten::atan2.out"](y, x, signs)
    assert np.array_equal(np.signbit(signs), np.signbit(np.array(exact)))  # atan2(-0, 1) = -0
    a = np.arange(6, dtype=np.int32).reshape(2, 3) - 2
    b = np.linspace(-1, 1, 3).astype(np.float64)
    check("aten::atan2.out", torch.atan2(torch.from_numpy(a), torch.from_numpy(b)), a, b,
          tol=1e-14)


@pytest.mark.parametrize("dtype", FLOATS + [np.int32, np.int64, np.bool_, np.uint8])
@pytest.mark.parametrize("name", ["isnan", "isinf"])
def test_isnan_isinf(name, dtype):
    for shape, layout in (((5, 4), "transposed"), ((0, 3), "contiguous"), ((), "contiguous")):
        x, _ = make(shape, dtype, layout, seed=4)
        if np.issubdtype(dtype, np.floating) and x.size:
            flat = x.reshape(-1) if x.flags.c_contiguous else x.T.reshape(-1)
            flat[::3] = np.nan
            flat[1::4] = np.inf
            flat[2::5] = -np.inf
        tx = torch.from_numpy(np.ascontiguousarray(x))
        check(f"aten::{name}.out", getattr(torch, name)(tx), x)


# --- max / min along a dim ------------------------------------------------------------------

@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
@pytest.mark.parametrize("dtype", FLOATS + [np.int32, np.int64, np.uint8, np.bool_])
def test_max_min_dim(dtype, layout, keepdim):
    x, tx = make((5, 6, 4), dtype, layout, seed=5)
    if np.issubdtype(dtype, np.floating):
        x = np.asarray(np.round(x * 2), dtype)  # ties: the first index must win
        x[1, 2, :] = np.nan  # NaN is the extreme; its first index wins
        x[3, :, 1] = np.nan
        tx = torch.from_numpy(np.ascontiguousarray(x))
    for dim in (0, 1, 2, -1):
        check("aten::max.dim_max", tuple(torch.max(tx, dim, keepdim)), x, dim, keepdim)
        check("aten::min.dim_min", tuple(torch.min(tx, dim, keepdim)), x, dim, keepdim)


def test_max_min_dim_zero_size_and_scalar():
    x, tx = make((0, 4), np.float32, seed=6)
    check("aten::max.dim_max", tuple(torch.max(tx, 1)), x, 1, False)
    s = np.array(3.5, np.float64)
    check("aten::min.dim_min", tuple(torch.min(torch.from_numpy(s), 0, True)), s, 0, True)
    with pytest.raises(KernelError, match="non-empty dim"):
        KERNELS["aten::max.dim_max"](x, 0, False, np.empty(4, np.float32),
                                     np.empty(4, np.int64))


# --- linalg_vector_norm --------------------------------------------------------------------

ORDS = [2, 1, float("inf"), float("-inf"), 0, 3, 0.5, -1.5]


@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("dim", [None, (), (1,), (-1,), (0, 2)])
@pytest.mark.parametrize("ord", ORDS)
@pytest.mark.parametrize("dtype", FLOATS)
def test_linalg_vector_norm(dtype, ord, dim, keepdim):
    x, tx = make((3, 4, 5), dtype, "transposed", seed=7)
    x[0, 1, :] = 0  # zeros count for ord 0 and are inf for negative ords
    tx = torch.from_numpy(np.ascontiguousarray(x))
    tdim = list(dim) if dim is not None else None
    expected = torch.linalg.vector_norm(tx, ord, tdim, keepdim)
    check("aten::linalg_vector_norm.out", expected, x, ord, dim, keepdim, None)


@pytest.mark.parametrize("ord", [2, float("inf"), 0])
def test_linalg_vector_norm_dtype_nan_and_empty(ord):
    x, tx = make((4, 6), np.float16, seed=8)
    expected = torch.linalg.vector_norm(tx, ord, [1], dtype=torch.float32)
    check("aten::linalg_vector_norm.out", expected, x, ord, (1,), False, np.dtype(np.float32))
    y = np.array([[1.0, np.nan, -3.0], [2.0, 0.0, 1.0]], np.float32)
    ty = torch.from_numpy(y)
    check("aten::linalg_vector_norm.out", torch.linalg.vector_norm(ty, ord, [1]), y, ord,
          (1,), False, None)
    e = np.zeros((0, 3), np.float32)
    check("aten::linalg_vector_norm.out",
          torch.linalg.vector_norm(torch.from_numpy(e), ord, [1]), e, ord, (1,), False, None)
    if ord == 2:
        check("aten::linalg_vector_norm.out", torch.linalg.vector_norm(torch.from_numpy(e)),
              e, ord, None, False, None)
    else:
        with pytest.raises(KernelError, match="empty"):
            KERNELS["aten::linalg_vector_norm.out"](e, float("inf"), None, False, None,
                                                    np.empty((), np.float32))


# --- batch norm with batch statistics (instance norm) ----------------------------------------

@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (1, 6, 7), (4, 3), (3, 2, 2, 3, 2)])
@pytest.mark.parametrize("dtype", FLOATS)
def test_batch_norm_with_batch_statistics(dtype, shape, affine):
    x, tx = make(shape, dtype, seed=9)
    x = np.asarray(x * 3 + 1, dtype)
    tx = torch.from_numpy(x)
    c = shape[1]
    w, tw = make((c,), dtype, seed=10) if affine else (None, None)
    b, tb = make((c,), dtype, seed=11) if affine else (None, None)
    expected = torch.ops.aten._native_batch_norm_legit.no_stats(tx, tw, tb, True, 0.1, 1e-5)
    check("aten::_native_batch_norm_legit.no_stats_out", expected, x, w, b, True, 0.1, 1e-5)


def test_batch_norm_with_batch_statistics_transposed_input_and_no_training():
    x, tx = make((3, 4, 5), np.float32, "transposed", seed=12)
    expected = torch.ops.aten._native_batch_norm_legit.no_stats(tx, None, None, True, 0.1, 1e-3)
    check("aten::_native_batch_norm_legit.no_stats_out", expected, x, None, None, True, 0.1,
          1e-3)
    outs = [np.empty((3, 4, 5), np.float32), np.empty(4, np.float32), np.empty(4, np.float32)]
    with pytest.raises(KernelError, match="training=False"):
        KERNELS["aten::_native_batch_norm_legit.no_stats_out"](x, None, None, False, 0.1, 1e-5,
                                                               *outs)


# --- _embedding_bag -------------------------------------------------------------------------

def _bag_case(seed, n, num_bags, vocab=10, dim=3, dtype=np.float32, index_dtype=np.int64):
    rng = np.random.default_rng(seed)
    weight = rng.standard_normal((vocab, dim)).astype(dtype)
    indices = rng.integers(0, vocab, n).astype(index_dtype)
    offsets = np.sort(rng.integers(0, n + 1, num_bags)).astype(index_dtype)
    if num_bags:
        offsets[0] = 0
    return weight, indices, offsets


def _check_bag(weight, indices, offsets, mode, psw=None, last=False, padding_idx=-1):
    t = [torch.from_numpy(a) if a is not None else None for a in (weight, indices, offsets, psw)]
    expected = torch.ops.aten._embedding_bag(t[0], t[1], t[2], False, mode, False, t[3],
                                             last, padding_idx)
    args = (weight, indices, offsets, False, mode, False, psw, last, padding_idx)
    outs = [np.full(tuple(e.shape), 9, e.numpy().dtype) for e in expected]
    assert KERNELS["aten::_embedding_bag.out"](*args, *outs) is None
    tol = TOL[weight.dtype.type]
    np.testing.assert_allclose(outs[0], expected[0].numpy(), rtol=tol, atol=tol)
    # offset2bag is defined whenever it is allocated; bag_size and max_indices for mean and
    # max (ATen leaves them unwritten for sum; opforge writes zeros).
    np.testing.assert_array_equal(outs[1], expected[1].numpy())
    if mode != 0:
        np.testing.assert_array_equal(outs[2], expected[2].numpy())
        np.testing.assert_array_equal(outs[3], expected[3].numpy())
    else:
        assert not outs[2].any() and not outs[3].any()
    for out, e in zip(outs, expected):
        assert out.shape == tuple(e.shape) and out.dtype == e.numpy().dtype


@pytest.mark.parametrize("padding_idx", [-1, 2])
@pytest.mark.parametrize("include_last_offset", [False, True])
@pytest.mark.parametrize("mode", [0, 1, 2])
@pytest.mark.parametrize("dtype", FLOATS)
def test_embedding_bag(dtype, mode, include_last_offset, padding_idx):
    for seed, (n, num_bags) in enumerate([(12, 4), (5, 5), (0, 3), (9, 1), (15, 7)]):
        weight, indices, offsets = _bag_case(seed, n, num_bags, dtype=dtype,
                                             index_dtype=(np.int64, np.int32)[seed % 2])
        if include_last_offset:
            offsets = np.append(offsets, n).astype(offsets.dtype)
        _check_bag(weight, indices, offsets, mode, None, include_last_offset, padding_idx)


@pytest.mark.parametrize("padding_idx", [-1, 4])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_embedding_bag_per_sample_weights(dtype, padding_idx):
    weight, indices, offsets = _bag_case(13, 14, 5, dtype=dtype)
    psw = np.random.default_rng(14).standard_normal(14).astype(dtype)
    _check_bag(weight, indices, offsets, 0, psw, False, padding_idx)


@pytest.mark.parametrize("dtype", FLOATS)
def test_embedding_bag_max_ties_and_nan(dtype):
    weight = np.array([[1, 2, np.nan], [1, 5, 0], [np.nan, 5, 3], [0, 0, 0]], dtype)
    indices = np.array([0, 1, 2, 2, 1, 3, 0], np.int64)
    for offsets, last in (([0, 3, 3, 5], False), ([0, 3, 3, 5, 7], True)):
        for mode in (0, 1, 2):
            _check_bag(weight, indices, np.array(offsets, np.int64), mode, None, last)


def test_embedding_bag_short_last_offset_runs_to_the_end():
    # include_last_offset with a last offset short of len(indices) breaks ATen's contract,
    # and its CPU paths disagree (the float32/float16 sum fast path stops at the offset,
    # mean divides that sum by the count to the end); the general path, which float64
    # takes, runs the last bag to the end of indices, and so does opforge.
    weight = np.arange(12, dtype=np.float64).reshape(4, 3)
    indices = np.array([0, 1, 2, 2, 1, 3, 0], np.int64)
    for mode in (0, 1, 2):
        _check_bag(weight, indices, np.array([0, 3, 3, 5, 6], np.int64), mode, None, True)


def test_embedding_bag_rejects_bad_offsets_and_indices():
    weight, indices, offsets = _bag_case(15, 6, 3)
    outs = [np.empty((3, 3), np.float32), np.empty(6, np.int64), np.empty(3, np.int64),
            np.empty(3, np.int64)]
    with pytest.raises(KernelError, match="offsets"):
        KERNELS["aten::_embedding_bag.out"](weight, indices, np.array([1, 2, 4]), False, 0,
                                            False, None, False, -1, *outs)
    with pytest.raises(KernelError, match="index"):
        KERNELS["aten::_embedding_bag.out"](weight, indices + 10, offsets, False, 0, False,
                                            None, False, -1, *outs)
