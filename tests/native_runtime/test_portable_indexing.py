"""The portable C++ indexing kernels against the NumPy kernels of the same keys, bit for bit,
and their refusals: out-of-range indices (and negative ones where the NumPy kernel refuses
them) are refused before anything is written."""

from __future__ import annotations

import numpy as np
import pytest

from tests.native_runtime._portable_compare import compare, lib, refused  # noqa: F401


def _x(shape, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    return np.asarray(rng.standard_normal(shape) * 10).astype(dtype)


def _i(values, dtype=np.int64):
    return np.asarray(values, dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64, np.int8])
@pytest.mark.parametrize("index_dtype", [np.int64, np.int32])
def test_embedding_index_select_gather(lib, dtype, index_dtype):
    w = _x((10, 4), dtype)
    for idx in ([[1, 9, 0], [3, 3, 2]], [5], 7, []):
        i = _i(idx, index_dtype)
        compare(lib, "aten::embedding.out", w, i, -1, False, False, np.empty(i.shape + (4,), dtype))
    compare(lib, "aten::embedding.out", w[:, ::2], _i([2, 1], index_dtype), -1, False, False,
            np.empty((2, 2), dtype))
    x = _x((4, 5, 6), dtype)
    for dim, idx in [(0, [3, 0, 0]), (1, [4]), (-1, [5, 1, 2, 0]), (1, 2), (2, [])]:
        i = _i(idx, index_dtype)
        shape = list(x.shape)
        shape[dim] = i.size
        compare(lib, "aten::index_select.out", x, dim, i, np.empty(shape, dtype))
    for dim in (0, 1, -1):
        rng = np.random.default_rng(1)
        shape = (3, 4, 5)
        i = rng.integers(0, x.shape[dim], shape).astype(index_dtype)
        compare(lib, "aten::gather.out", x, dim, i, False, np.empty(shape, dtype))


def test_index_refusals(lib):
    w = _x((10, 4))
    refused(lib, "aten::embedding.out", w, _i([1, 10]), -1, False, False, np.empty((2, 4), np.float32),
            match=r"index — found values in \[1, 10\] — valid: \[0, 9\]")
    refused(lib, "aten::embedding.out", w, _i([-1]), -1, False, False, np.empty((1, 4), np.float32),
            match=r"found values in \[-1, -1\] — valid: \[0, 9\]")
    refused(lib, "aten::index_select.out", w, 0, _i([-2]), np.empty((1, 4), np.float32),
            match=r"valid: \[0, 9\]")
    refused(lib, "aten::gather.out", w, 1, _i([[0, 4]]), False, np.empty((1, 2), np.float32),
            match=r"valid: \[0, 3\]")
    x = np.zeros((3, 4), np.float32)
    out = np.full((3, 4), 9, np.float32)
    with pytest.raises(Exception, match=r"found 5 for dim 0 of size 3"):
        lib.kernel("aten::index_put.out")(x, [_i([0, 5])], _x((2, 4)), False, out)
    assert (out == 9).all()  # nothing written
    out = np.full((3, 4), 9, np.float32)
    with pytest.raises(Exception, match=r"valid: \[0, 3\]"):
        lib.kernel("aten::scatter.src_out")(x, 1, _i([[0, 4]]), _x((1, 2)), out)
    assert (out == 9).all()


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.float16])
def test_scatter(lib, dtype):
    x = _x((4, 5), dtype)
    i = _i([[0, 3, 2], [1, 0, 4]])  # no duplicates along dim 1 in a row
    src = _x((3, 4), dtype, 2)
    for dim, index in [(1, i), (0, _i([[3, 0, 2, 1, 0]]) [:, :5] % 4)]:
        if dim == 0:
            index = _i([[3, 0, 2, 1, 0], [2, 1, 3, 0, 1]])
            s = _x((2, 5), dtype, 3)
        else:
            index, s = i, src
        compare(lib, "aten::scatter.src_out", x, dim, index, s, np.empty(x.shape, dtype))
        compare(lib, "aten::scatter.value_out", x, dim, index, 1.5, np.empty(x.shape, dtype))
        compare(lib, "aten::scatter_add.out", x, dim, index, s, np.empty(x.shape, dtype))
        compare(lib, "aten::scatter.reduce_out", x, dim, index, s, "multiply", np.empty(x.shape, dtype))
        compare(lib, "aten::scatter.value_reduce_out", x, dim, index, 2, "add", np.empty(x.shape, dtype))
    dup = _i([[0, 0, 0], [1, 1, 1]])
    compare(lib, "aten::scatter_add.out", x, 1, dup, src, np.empty(x.shape, dtype))


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int64, np.int8,
                                   np.uint8, np.bool_])
@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
def test_scatter_reduce_two(lib, dtype, reduce):
    """Repeated indices fold in index order; positions no index names keep self; without
    include_self a named position starts from the identity; mean divides by the count
    (flooring for integers: negative int8 sums check the floor). Bit for bit against NumPy."""
    x = _x((4, 5), dtype)
    if dtype == np.bool_:
        x = _x((4, 5)) > 0
    src = _x((4, 6), dtype, 2) if dtype != np.bool_ else _x((4, 6), seed=2) > 0
    rng = np.random.default_rng(3)
    cases = [(1, rng.integers(0, 5, (4, 6))), (0, rng.integers(0, 4, (3, 6))[:, :5]),
             (-1, _i([[0, 0, 0], [4, 4, 1]])), (1, np.zeros((0, 0), np.int64))]
    for dim, index in cases:
        index = index.astype(np.int64)
        for include_self in (True, False):
            compare(lib, "aten::scatter_reduce.two_out", x, dim, index, src, reduce, include_self,
                    np.empty(x.shape, dtype))
    compare(lib, "aten::scatter_reduce.two_out", x[:, ::2], 0, _i([[3, 3, 0]]), src, reduce,
            False, np.empty((4, 3), dtype))
    if dtype == np.float32:  # NaN wins amax/amin in either operand
        xn = x.copy()
        xn[0, 1] = np.nan
        sn = src.copy()
        sn[1, 0] = np.nan
        compare(lib, "aten::scatter_reduce.two_out", xn, 1, _i([[1, 1], [2, 2]]), sn, reduce,
                True, np.empty(x.shape, dtype))


def test_scatter_reduce_two_refusals(lib):
    x = _x((3, 4))
    out = np.full((3, 4), 9, np.float32)
    with pytest.raises(Exception, match=r"reduce='max' — is not a scatter reduction — valid: 'sum'"):
        lib.kernel("aten::scatter_reduce.two_out")(x, 0, _i([[0]]), x, "max", True, out)
    with pytest.raises(Exception, match=r"valid: \[0, 2\]"):
        lib.kernel("aten::scatter_reduce.two_out")(x, 0, _i([[3]]), x, "sum", True, out)
    assert (out == 9).all()  # nothing written
    with pytest.raises(Exception, match=r"found dtype uint16"):
        lib.kernel("aten::scatter_reduce.two_out")(x.astype(np.uint16), 0, _i([[0]]),
                                                  x.astype(np.uint16), "sum", True,
                                                  np.empty((3, 4), np.uint16))


@pytest.mark.parametrize("dtype", [np.float32, np.int8])
def test_slice_select_scatter_tril_triu(lib, dtype):
    x = _x((4, 6, 3), dtype)
    for dim, start, end, step in [(1, 1, 5, 2), (0, None, None, 1), (2, -2, None, 1), (1, 4, 100, 1)]:
        view = x[(slice(None),) * dim + (slice(start, end, step),)]
        src = _x(view.shape, dtype, 5)
        compare(lib, "aten::slice_scatter.out", x, src, dim, start, end, step, np.empty(x.shape, dtype))
    for dim, index in [(0, 3), (1, -1), (2, 0)]:
        view = np.take(x, index, axis=dim)
        compare(lib, "aten::select_scatter.out", x, _x(view.shape, dtype, 6), dim, index,
                np.empty(x.shape, dtype))
    # out is self: the state written in place (a KV cache update)
    state = x.copy()
    lib.kernel("aten::slice_scatter.out")(state, _x((4, 2, 3), dtype, 7), 1, 2, 4, 1, state)
    ref = x.copy()
    ref[:, 2:4] = _x((4, 2, 3), dtype, 7)
    assert state.tobytes() == ref.tobytes()
    for diag in (0, 1, -2, 7, -9):
        compare(lib, "aten::tril.out", x.transpose(2, 0, 1), diag, np.empty((3, 4, 6), dtype))
        compare(lib, "aten::triu.out", x[0], diag, np.empty((6, 3), dtype))


@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_advanced_index(lib, dtype):
    x = _x((5, 6, 7), dtype)
    cases = [
        [_i([0, 4, -1])],
        [None, _i([[1, 2], [5, -6]])],
        [_i([0, 1]), None, _i([3, 6])],                 # not adjacent: B to the front
        [_i([[0], [4]]), _i([1, 2, 3])],                # broadcast
        [None, None, _i(2)],
        [_x((5, 6)) > 0],                               # a bool mask over two dims
        [None, (np.arange(6) % 2).astype(np.uint8)],    # legacy uint8 mask
        [None, None, None],
    ]
    for indices in cases:
        key = tuple(slice(None) if i is None else (i.astype(bool) if i.dtype == np.uint8 else i)
                    for i in indices)
        ref = x[key]
        compare(lib, "aten::index.Tensor_out", x, indices, np.empty(ref.shape, dtype))
    # not adjacent after a kept dim: B moves to the front, before the kept dim
    x4 = _x((3, 4, 5, 6), dtype)
    indices = [None, _i([1, 3]), None, _i([0, 5])]
    ref = x4[:, [1, 3], :, [0, 5]]
    assert ref.shape == (2, 3, 5)
    compare(lib, "aten::index.Tensor_out", x4, indices, np.empty(ref.shape, dtype))
    compare(lib, "aten::index_put.out", x4, indices, _x(ref.shape, dtype, 3), False, np.empty(x4.shape, dtype))
    refused(lib, "aten::index.Tensor_out", x, [None, _i([6])], np.empty((5, 1, 7), dtype),
            match="found 6 for dim 1 of size 6")


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32])
def test_index_put(lib, dtype):
    x = _x((5, 6, 7), dtype)
    for indices, accumulate in [([_i([0, 4, -1])], False), ([None, _i([2, 2, 3])], True),
                                ([_i([0, 1]), None, _i([3, 6])], False), ([_x((5, 6)) > 0], True),
                                ([None, _i([1])], False)]:
        key = tuple(slice(None) if i is None else i for i in indices)
        values = _x(x[key].shape, dtype, 9)
        compare(lib, "aten::index_put.out", x, indices, values, accumulate, np.empty(x.shape, dtype))
        compare(lib, "aten::index_put.out", x, indices, _x((7,), dtype, 4)[-1:], accumulate,
                np.empty(x.shape, dtype))
    # a decoding step's KV cache write, in place
    cache = np.zeros((2, 8, 4), dtype)
    lib.kernel("aten::index_put.out")(cache, [None, _i([5])], _x((2, 1, 4), dtype), False, cache)
    ref = np.zeros((2, 8, 4), dtype)
    ref[:, [5]] = _x((2, 1, 4), dtype)
    assert cache.tobytes() == ref.tobytes()


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
@pytest.mark.parametrize("mode", [0, 1, 2])
def test_embedding_bag(lib, dtype, mode):
    rng = np.random.default_rng(5)
    weight = np.asarray(rng.standard_normal((12, 5)) * 3).astype(dtype)
    weight[3, 1] = np.nan
    indices = _i([1, 3, 3, 0, 7, 11, 2, 2, 5, 9])
    for offsets, padding_idx, psw in [([0, 2, 2, 6], -1, None), ([0, 4, 5], 2, None),
                                      ([0, 1, 9, 10], -1, rng.random(10).astype(dtype))]:
        if psw is not None and mode == 2:
            continue  # ATen takes per-sample weights in sum mode only
        bags = len(offsets)
        outs = [np.empty((bags, 5), dtype), np.empty((10,), np.int64), np.empty((bags,), np.int64),
                np.empty((bags, 5) if mode == 2 else (bags,), np.int64)]
        compare(lib, "aten::_embedding_bag.out", weight, indices, _i(offsets), False, mode, False, psw,
                False, padding_idx, *outs, outs=4)
    refused(lib, "aten::_embedding_bag.out", weight, indices, _i([0, 11]), False, mode, False, None,
            False, -1, np.empty((2, 5), dtype), np.empty((10,), np.int64), np.empty((2,), np.int64),
            np.empty((2,), np.int64), match="offsets — found 2 offsets for 10 indices")
