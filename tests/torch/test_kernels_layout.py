"""Portable view-copy, shape, indexing and factory kernels against PyTorch.

These kernels move or select values without arithmetic, so every comparison is exact
(arange in floating point: one rounding of start + i * step, compared exactly as well).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kernel_check import KERNELS, check_kernel, make_array

DTYPES = [np.float32, np.int64, np.bool_, np.float16]
# Out overloads whose schema takes ``Tensor(a!)[] out``: one list argument.
LIST_OUT = {"aten::split_with_sizes_copy.out", "aten::split_copy.Tensor_out",
            "aten::unbind_copy.int_out"}


def make(shape, dtype, layout="contiguous", seed=0):
    return make_array(shape, dtype, layout, seed, ints=(-50, 49))


def check(key, expected, *args):
    """Exact: these kernels only move or select values."""
    check_kernel(key, expected, *args, tols={}, list_out=key in LIST_OUT)


@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_view_copies(dtype, layout):
    x, tx = make((2, 3, 4), dtype, layout, seed=1)
    check("aten::view_copy.out", tx.reshape(6, 4), x, (6, 4))
    check("aten::view_copy.out", tx.reshape(-1), x, (-1,))
    check("aten::_unsafe_view.out", tx.reshape(4, 6), x, (4, 6))
    check("aten::permute_copy.out", tx.permute(2, 0, 1), x, (2, 0, 1))
    check("aten::permute_copy.out", tx.permute(-1, 1, 0), x, (-1, 1, 0))
    check("aten::transpose_copy.int_out", tx.transpose(0, -1), x, 0, -1)
    check("aten::t_copy.out", tx[0].t(), x[0])
    check("aten::t_copy.out", tx[0, 0].t(), x[0, 0])
    check("aten::expand_copy.out", tx[:, :1].expand(2, 5, 4), x[:, :1], (2, 5, 4), False)
    check("aten::expand_copy.out", tx.expand(3, -1, -1, -1), x, (3, -1, -1, -1), False)
    for dim, start, end, step in [(0, 0, 1, 1), (1, None, None, 2), (2, -3, 100, 1),
                                  (1, 5, 9, 1), (-1, 1, -1, 2)]:
        check("aten::slice_copy.Tensor_out", torch.ops.aten.slice(tx, dim, start, end, step),
              x, dim, start, end, step)
    check("aten::select_copy.int_out", tx.select(1, -1), x, 1, -1)
    check("aten::select_copy.int_out", tx.select(2, 2), x, 2, 2)
    check("aten::unsqueeze_copy.out", tx.unsqueeze(-1), x, -1)
    check("aten::unsqueeze_copy.out", tx.unsqueeze(0), x, 0)
    y, ty = x[:, :1, None], tx[:, :1, None]
    check("aten::squeeze_copy.out", ty.squeeze(), y)
    check("aten::squeeze_copy.dim_out", ty.squeeze(1), y, 1)
    check("aten::squeeze_copy.dims_out", ty.squeeze((1, 2)), y, (1, 2))
    check("aten::squeeze_copy.dims_out", ty.squeeze((0,)), y, (0,))
    check("aten::alias_copy.out", tx.clone(), x)
    check("aten::clone.out", tx.clone(), x, None)
    check("aten::diagonal_copy.out", torch.diagonal(tx, 1, 1, 2), x, 1, 1, 2)


@pytest.mark.parametrize("src", DTYPES)
@pytest.mark.parametrize("dst", [torch.float32, torch.int32, torch.bool, torch.float64,
                                 torch.uint8])
def test_to_copy_and_copy(src, dst):
    x, tx = make((3, 4), src, "transposed", seed=2)
    if src != np.bool_:
        x = np.asarray(x * 3.3, src)  # fractional and negative values meet integer casts
        if dst == torch.uint8:
            x = np.abs(x)
        tx = torch.from_numpy(x)
    check("aten::_to_copy.out", tx.to(dst), x, False, None)
    target = torch.zeros(3, 4, dtype=dst)
    check("aten::copy.out", torch.ops.aten.copy(target, tx[0]), target.numpy(), x[0], False)


def test_view_copy_dtype():
    x, tx = make((2, 4), np.float32, seed=3)
    check("aten::view_copy.dtype_out", tx.view(torch.int32), x, np.dtype(np.int32))


@pytest.mark.parametrize("dtype", DTYPES)
def test_cat_stack_split(dtype):
    a, ta = make((2, 3), dtype, seed=4)
    b, tb = make((4, 3), dtype, "transposed", seed=5)
    e = np.zeros((0,), dtype)
    check("aten::cat.out", torch.cat([ta, tb, torch.from_numpy(e)]), [a, b, e], 0)
    check("aten::cat.out", torch.cat([ta.T, tb.T], -1), [a.T, b.T], -1)
    check("aten::stack.out", torch.stack([ta, ta], 1), [a, a], 1)
    x, tx = make((3, 7, 2), dtype, seed=6)
    check("aten::split_with_sizes_copy.out", torch.split_with_sizes(tx, [2, 0, 5], 1),
          x, (2, 0, 5), 1)
    check("aten::split_copy.Tensor_out", torch.split(tx, 3, -2), x, 3, -2)
    check("aten::unbind_copy.int_out", torch.unbind(tx, 2), x, 2)


def test_cat_promotes():
    a, ta = make((2, 3), np.int32, seed=7)
    b, tb = make((1, 3), np.float32, seed=8)
    check("aten::cat.out", torch.cat([ta, tb]), [a, b], 0)


@pytest.mark.parametrize("pad", [(1, 2), (0, 0, 2, 1), (-1, 2, 1, -1), (1, 1, 1, 1, 1, 1)])
def test_constant_pad_nd(pad):
    x, tx = make((2, 3, 4), np.float32, seed=9)
    check("aten::constant_pad_nd.out", torch.constant_pad_nd(tx, pad, 1.5), x, pad, 1.5)


def test_repeat_flip_roll_pixel_shuffle():
    x, tx = make((2, 3), np.int64, seed=10)
    check("aten::repeat.out", tx.repeat(2, 1, 3), x, (2, 1, 3))
    check("aten::flip.out", tx.flip((0, 1)), x, (0, 1))
    check("aten::roll.out", tx.roll(2), x, (2,), ())
    check("aten::roll.out", tx.roll((1, -1), (0, 1)), x, (1, -1), (0, 1))
    y, ty = make((1, 8, 2, 3), np.float32, seed=11)
    check("aten::pixel_shuffle.out", torch.pixel_shuffle(ty, 2), y, 2)


@pytest.mark.parametrize("dtype", DTYPES)
def test_index_tensor(dtype):
    x, tx = make((4, 5, 6), dtype, "transposed", seed=12)
    i = np.array([[0, 3], [-1, 1]])
    j = np.array([4, 0])
    mask = make((4,), np.bool_, seed=13)[0]
    ti, tj, tmask = map(torch.from_numpy, (i, j, mask))
    check("aten::index.Tensor_out", torch.ops.aten.index(tx, [ti]), x, [i])
    check("aten::index.Tensor_out", torch.ops.aten.index(tx, [None, tj]), x, [None, j])
    check("aten::index.Tensor_out", torch.ops.aten.index(tx, [ti, None, tj]), x, [i, None, j])
    check("aten::index.Tensor_out", torch.ops.aten.index(tx, [tmask]), x, [mask])
    check("aten::index.Tensor_out", torch.ops.aten.index(tx, [None, None, tj]),
          x, [None, None, j])


def test_index_put_and_scatter():
    x, tx = make((4, 5), np.float32, seed=14)
    i = np.array([0, 2, 0])
    v, tv = make((3, 5), np.float32, seed=15)
    ti = torch.from_numpy(i)
    check("aten::index_put.out", torch.ops.aten.index_put(tx, [ti], tv, True), x, [i], v, True)
    check("aten::index_put.out", torch.ops.aten.index_put(tx, [ti[1:]], tv[1:]),
          x, [i[1:]], v[1:], False)
    idx = np.array([[0, 1, 2, 3, 0], [3, 2, 1, 0, 1]])
    tidx = torch.from_numpy(idx)
    check("aten::scatter.src_out", torch.scatter(tx, 0, tidx, tv), x, 0, idx, v)
    check("aten::scatter.value_out", torch.scatter(tx, 0, tidx, 2.5), x, 0, idx, 2.5)
    check("aten::scatter_add.out", torch.scatter_add(tx, 0, tidx, tv), x, 0, idx, v)
    src, tsrc = make((5,), np.float32, seed=16)
    check("aten::select_scatter.out", torch.select_scatter(tx, tsrc, 0, 1), x, src, 0, 1)
    s2, ts2 = make((4, 2), np.float32, seed=17)
    check("aten::slice_scatter.out", torch.slice_scatter(tx, ts2, 1, 1, 5, 2),
          x, s2, 1, 1, 5, 2)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gather_index_select_embedding(dtype):
    x, tx = make((4, 6), dtype, "transposed", seed=18)
    idx = np.array([[0, 5, 1], [2, 2, 3]])
    tidx = torch.from_numpy(idx)
    check("aten::gather.out", torch.gather(tx, 1, tidx), x, 1, idx, False)
    check("aten::gather.out", torch.gather(tx, 0, tidx[:, :2] % 4), x, 0, idx[:, :2] % 4, False)
    sel = np.array([3, 0, 3])
    check("aten::index_select.out", torch.index_select(tx, 1, torch.from_numpy(sel)),
          x, 1, sel)
    tokens = np.array([[1, 3, 0], [2, 2, 1]])
    check("aten::embedding.out", torch.nn.functional.embedding(torch.from_numpy(tokens), tx),
          x, tokens, -1, False, False)


def test_out_of_range_index_is_an_error():
    from opforge.errors import KernelError

    with pytest.raises(KernelError, match="valid: \\[0, 3\\]"):
        KERNELS["aten::embedding.out"](np.zeros((4, 2)), np.array([4]), -1, False, False,
                                       np.empty((1, 2)))


@pytest.mark.parametrize("diagonal", [0, 1, -1, 5])
def test_tril_triu(diagonal):
    x, tx = make((2, 4, 5), np.float32, seed=19)
    check("aten::tril.out", torch.tril(tx, diagonal), x, diagonal)
    check("aten::triu.out", torch.triu(tx, diagonal), x, diagonal)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.float16])
def test_factories(dtype):
    like = torch.zeros(2, 3, dtype=dtype)
    check("aten::full.out", torch.full((2, 3), 2.7, dtype=dtype), (2, 3), 2.7)
    check("aten::full_like.out", torch.full_like(like, -1), like.numpy(), -1, None)
    check("aten::zeros_like.out", torch.zeros_like(like), like.numpy(), None)
    check("aten::ones_like.out", torch.ones_like(like), like.numpy(), None)
    check("aten::zeros.out", torch.zeros(4, dtype=dtype), (4,))
    check("aten::ones.out", torch.ones(4, dtype=dtype), (4,))
    check("aten::scalar_tensor.out", torch.scalar_tensor(3, dtype=dtype), 3)


@pytest.mark.parametrize("start, end, step, dtype", [
    (0, 10, 1, torch.int64), (2, 11, 3, torch.int64), (10, -3, -2, torch.int32),
    (0.0, 1.0, 0.1, torch.float32), (-1.5, 2.25, 0.25, torch.float64),
    (0, 7, 1, torch.float32), (1.0, 0.0, -0.3, torch.float32),
])
def test_arange(start, end, step, dtype):
    check("aten::arange.start_out", torch.arange(start, end, step, dtype=dtype),
          start, end, step)
    if start == 0 and step == 1:
        check("aten::arange.out", torch.arange(end, dtype=dtype), end)
