"""Indexing: advanced indexing (``index.Tensor``), gather, index_select, embedding and
embedding bags, scatter forms, slice/select scatter and the triangle masks tril/triu.

ATen's advanced indexing and NumPy's agree: ``None`` entries keep a dimension, index
tensors broadcast together, bool (and legacy uint8) masks select by position, and when
the indexed dimensions are not adjacent their result dimension moves to the front.
"""

from __future__ import annotations

import numpy as np

from opforge.errors import KernelError
from opforge.kernels.portable._promotion import accumulate_dtype
from opforge.kernels.portable._registry import Kernel, kernel_decorator
from opforge.kernels.portable.arithmetic import as_operand

__all__ = ["KERNELS"]

KERNELS: dict[str, Kernel] = {}
kernel = kernel_decorator(KERNELS)


def _numpy_index(indices: list[np.ndarray | None]) -> tuple:
    index = []
    for i in indices:
        if i is None:
            index.append(slice(None))
        elif i.dtype == np.uint8:
            index.append(i.astype(bool))
        else:
            index.append(i)
    return tuple(index)


def _check_range(index: np.ndarray, size: int, api: str, negative: bool = True) -> None:
    """Indices within a dimension of ``size``; ``negative=False`` where ATen refuses
    negative indices instead of counting from the end (``embedding``, ``index_select``)."""
    low = -size if negative else 0
    if index.size and (index.min() < low or index.max() >= size):
        raise KernelError(
            f"`{api}`: index — found values in [{index.min()}, {index.max()}] — "
            f"valid: [{low}, {size - 1}] for a dimension of size {size} — "
            "check the indices against the tensor's shape"
        )


def _check_positions(indices: list, shape: tuple[int, ...]) -> None:
    """``index_put``'s integer index tensors against their dimensions (masks are NumPy's to
    check); one position, a decoding step's cache write, costs no NumPy reduction."""
    for dim, i in enumerate(indices):
        if i is None:
            continue
        if i.dtype.kind not in "iu" or i.dtype == np.uint8:
            return  # a mask shifts the dimensions after it
        if i.size == 1:
            size = shape[dim]
            if not -size <= i.item() < size:
                _check_range(i, size, "aten::index_put.out")
        else:
            _check_range(i, shape[dim], "aten::index_put.out")


@kernel("aten::index.Tensor_out")
def index_out(self, indices, out):
    np.copyto(out, self[_numpy_index(indices)], casting="unsafe")


@kernel("aten::index_put.out")
def index_put_out(self, indices, values, accumulate, out):
    # out is self: a state (KV cache) written in place (export/passes/update_state_in_place.py)
    index = _numpy_index(indices)
    if len(indices) <= self.ndim:  # every position checked before anything is written
        _check_positions(indices, self.shape)
    if out is not self:
        np.copyto(out, self, casting="unsafe")
    if accumulate:
        np.add.at(out, index, values)  # repeated indices add up, as in ATen
    else:
        out[index] = values


@kernel("aten::index_select.out")
def index_select_out(self, dim, index, out):
    axis = dim % max(self.ndim, 1)
    _check_range(index, self.shape[axis] if self.ndim else 1, "aten::index_select.out",
                 negative=False)
    x = self if self.ndim else self.reshape(1)
    np.copyto(out, np.take(x, index.reshape(-1), axis=axis).reshape(out.shape),
              casting="unsafe")


@kernel("aten::embedding.out")
def embedding_out(weight, indices, padding_idx, scale_grad_by_freq, sparse, out):
    # padding_idx and the two gradient flags only matter for training.
    _check_range(indices, weight.shape[0], "aten::embedding.out", negative=False)
    np.take(weight, indices, axis=0, out=out)


# EmbeddingBag modes, as ATen numbers them.
_SUM, _MEAN, _MAX = 0, 1, 2


def _fill(out: np.ndarray, values: np.ndarray | int) -> None:
    """Write ``values`` into an auxiliary out whose preallocated shape agrees, else zeros."""
    if isinstance(values, np.ndarray) and values.size == out.size:
        np.copyto(out, values.reshape(out.shape), casting="unsafe")
    else:
        out.fill(0)


@kernel("aten::_embedding_bag.out")
def embedding_bag_out(weight, indices, offsets, scale_grad_by_freq, mode, sparse,
                      per_sample_weights, include_last_offset, padding_idx,
                      out0, out1, out2, out3):
    # Bag b holds indices[offsets[b]:offsets[b + 1]], the last bag running to the end of
    # indices — with include_last_offset too, whose extra last offset (len(indices), as
    # ATen requires) ATen's general CPU path ignores; its float sum fast path stops there
    # instead, so the two disagree only for offsets ATen does not allow. Entries equal to padding_idx (>= 0) are skipped and not counted. Empty bags
    # give zeros. max keeps the first maximum (a later NaN never wins; a NaN first does).
    # The auxiliary outs are what ATen's CPU kernel writes where they are defined:
    # out1 (offset2bag) each index's bag, when allocated with one entry per index;
    # out2 (bag_size) each bag's count for mean and max, zeros for sum (ATen leaves it
    # unwritten); out3 (max_indices) for max each output element's weight row, for mean
    # the bag sizes again (ATen's CPU kernel returns bag_size there), zeros for sum.
    # scale_grad_by_freq and sparse only matter for gradients.
    api = "aten::_embedding_bag.out"
    n, num_bags = indices.shape[0], out0.shape[0]
    _check_range(indices, weight.shape[0], api, negative=False)
    starts = np.asarray(offsets[:num_bags], dtype=np.int64)
    if num_bags and (starts[0] != 0 or np.any(np.diff(starts) < 0) or starts[-1] > n):
        raise KernelError(
            f"`{api}`: offsets — found {starts.tolist()[:8]} for {n} indices — valid: "
            f"non-decreasing, starting at 0, at most {n} — check the bag offsets"
        )
    bag = np.searchsorted(starts, np.arange(n), side="right") - 1
    keep = indices != padding_idx if padding_idx >= 0 else np.ones(n, bool)
    words, bags = indices[keep].astype(np.int64), bag[keep]
    counts = np.bincount(bags, minlength=num_bags)
    nonempty = counts > 0
    first = (np.cumsum(counts) - counts)[nonempty]  # each non-empty bag's first kept row
    ct = accumulate_dtype(weight.dtype)
    rows = weight[words].astype(ct, copy=False)
    result = np.zeros(out0.shape, ct)
    max_indices = np.zeros(out0.shape, np.int64)
    if mode in (_SUM, _MEAN):
        if per_sample_weights is not None:
            rows = rows * per_sample_weights[keep].astype(ct)[:, None]
        if rows.shape[0]:
            result[nonempty] = np.add.reduceat(rows, first, axis=0)
        if mode == _MEAN:
            result /= np.maximum(counts, 1).astype(ct)[:, None]
    elif mode == _MAX:
        if rows.shape[0]:
            with np.errstate(invalid="ignore"):
                peak = np.fmax.reduceat(rows, first, axis=0)
            peak = np.where(np.isnan(rows[first]), rows[first], peak)  # a NaN first stays
            at = np.where(rows == peak[np.cumsum(nonempty)[bags] - 1],
                          np.arange(rows.shape[0])[:, None], rows.shape[0])
            at = np.minimum.reduceat(at, first, axis=0)
            at = np.where(np.isnan(peak), first[:, None], at)
            result[nonempty], max_indices[nonempty] = peak, words[at]
    else:
        raise KernelError(
            f"`{api}`: mode={mode!r} — is not an EmbeddingBag mode — valid: 0 (sum), "
            "1 (mean), 2 (max) — pass one of these"
        )
    np.copyto(out0, result, casting="unsafe")
    _fill(out1, bag)
    _fill(out2, counts if mode != _SUM else 0)
    _fill(out3, max_indices if mode == _MAX else counts if mode == _MEAN else 0)


def _index_grid(index: np.ndarray, dim: int) -> tuple:
    """Open-grid indices addressing ``index``'s positions, with ``index`` along ``dim``."""
    grid = list(np.ogrid[tuple(slice(0, n) for n in index.shape)])
    grid[dim] = index
    return tuple(grid)


@kernel("aten::gather.out")
def gather_out(self, dim, index, sparse_grad, out):
    if self.ndim == 0:
        np.copyto(out, self, casting="unsafe")
        return
    if index.size == 0:  # ATen returns before checking an empty index's rank: nothing to do
        return
    dim %= self.ndim
    _check_range(index, self.shape[dim], "aten::gather.out", negative=False)
    # index may be smaller than self in the other dims.
    np.copyto(out, self[_index_grid(index, dim)], casting="unsafe")


def _scatter(self, dim, index, src, reduce, out):
    if out.ndim == 0:  # a 0-d tensor scatters like a 1-element vector
        src = src.reshape(-1) if isinstance(src, np.ndarray) and src.ndim else src
        _scatter(self.reshape(1), 0, index.reshape(-1), src, reduce, out.reshape(1))
        return
    np.copyto(out, self, casting="unsafe")
    if index.size == 0:  # as in ATen, an empty index (of any rank) scatters nothing
        return
    dim %= max(self.ndim, 1)
    _check_range(index, self.shape[dim] if self.ndim else 1, "aten::scatter.out",
                 negative=False)
    where = _index_grid(index, dim)
    if not isinstance(src, np.ndarray):
        src = as_operand(src, out.dtype)
    values = np.broadcast_to(src, index.shape) if src.ndim == 0 else \
        src[tuple(slice(0, n) for n in index.shape)]
    if reduce is None:
        out[where] = values
    elif reduce in ("add", "sum"):
        np.add.at(out, where, values)
    elif reduce in ("multiply", "prod"):
        np.multiply.at(out, where, values)
    else:
        raise KernelError(
            f"`aten::scatter.out`: reduce={reduce!r} — is not a scatter reduction — "
            "valid: 'add', 'multiply' — pass one of these"
        )


@kernel("aten::scatter.src_out", "aten::scatter.value_out")
def scatter_out(self, dim, index, src, out):
    _scatter(self, dim, index, src, None, out)


@kernel("aten::scatter.reduce_out", "aten::scatter.value_reduce_out")
def scatter_reduce_out(self, dim, index, src, reduce, out):
    _scatter(self, dim, index, src, reduce, out)


@kernel("aten::scatter_add.out")
def scatter_add_out(self, dim, index, src, out):
    _scatter(self, dim, index, src, "add", out)


_SCATTER_REDUCE = {"sum": np.add, "prod": np.multiply, "mean": np.add, "amax": np.maximum,
                   "amin": np.minimum}


def _reduce_identity(reduce: str, dtype: np.dtype):
    if reduce in ("sum", "mean"):
        return 0
    if reduce == "prod":
        return 1
    if dtype.kind == "f":
        return -np.inf if reduce == "amax" else np.inf
    if dtype.kind == "b":
        return reduce == "amin"
    info = np.iinfo(dtype)
    return info.min if reduce == "amax" else info.max


@kernel("aten::scatter_reduce.two_out")
def scatter_reduce_two_out(self, dim, index, src, reduce, include_self, out):
    """``out = self`` with ``src`` reduced into the positions ``index`` names along ``dim``
    (``sum``, ``prod``, ``mean``, ``amax``, ``amin``), in index order as ATen's CPU loop;
    without ``include_self`` a named position starts from the reduction's identity. ``mean``
    divides by the count (``self`` counting once with ``include_self``), flooring for
    integers; positions no index names keep ``self``."""
    if reduce not in _SCATTER_REDUCE:
        raise KernelError(
            f"`aten::scatter_reduce.two_out`: reduce={reduce!r} — is not a scatter reduction "
            "— valid: 'sum', 'prod', 'mean', 'amax', 'amin' — pass one of these")
    if out.ndim == 0:
        scatter_reduce_two_out(self.reshape(1), 0, index.reshape(-1), src.reshape(-1), reduce,
                               include_self, out.reshape(1))
        return
    np.copyto(out, self, casting="unsafe")
    if index.size == 0:
        return
    dim %= out.ndim
    _check_range(index, out.shape[dim], "aten::scatter_reduce.two_out", negative=False)
    where = _index_grid(index, dim)
    values = src[tuple(slice(0, n) for n in index.shape)].astype(out.dtype, copy=False)
    if not include_self:
        out[where] = _reduce_identity(reduce, out.dtype)
    _SCATTER_REDUCE[reduce].at(out, where, values)
    if reduce == "mean":
        count = np.full(out.shape, 1 if include_self else 0, np.int64)
        np.add.at(count, where, 1)
        count[count == 0] = 1
        if out.dtype.kind == "f":
            np.divide(out, count.astype(out.dtype), out=out, casting="unsafe")
        else:
            np.floor_divide(out, count, out=out, casting="unsafe")


@kernel("aten::index_add.out")
def index_add_out(self, dim, index, source, alpha, out):
    """``out = self`` with ``alpha * source``'s slices added at ``index`` along ``dim``;
    repeated indices accumulate (a mixture-of-experts layer sums each token's experts)."""
    if out is not self:
        np.copyto(out, self, casting="unsafe")
    if index.size == 0:
        return
    axis = dim % max(out.ndim, 1)
    size = out.shape[axis] if out.ndim else 1
    _check_range(index, size, "aten::index_add.out", negative=False)
    values = source if alpha == 1 else np.multiply(source, alpha, dtype=accumulate_dtype(out.dtype))
    if out.ndim == 0:
        np.add.at(out.reshape(1), index.reshape(-1), np.asarray(values).reshape(-1))
        return
    where = (slice(None),) * axis + (index.reshape(-1),)
    np.add.at(out, where, np.asarray(values).astype(out.dtype, copy=False))


@kernel("aten::slice_scatter.out")
def slice_scatter_out(self, src, dim, start, end, step, out):
    if out is not self:  # out is self: a state written in place
        np.copyto(out, self, casting="unsafe")
    index = [slice(None)] * self.ndim
    index[dim] = slice(start, end, step)
    np.copyto(out[tuple(index)], src, casting="unsafe")


@kernel("aten::select_scatter.out")
def select_scatter_out(self, src, dim, index, out):
    if out is not self:  # out is self: a state written in place
        np.copyto(out, self, casting="unsafe")
    where = [slice(None)] * self.ndim
    where[dim] = index
    # the Ellipsis keeps a 0-d view (not a copied scalar) when self is 1-d
    np.copyto(out[(*where, Ellipsis)], src, casting="unsafe")


def _triangle(self, diagonal, out, keep_lower: bool) -> None:
    np.copyto(out, self, casting="unsafe")
    rows, cols = self.shape[-2:]
    # keep (row, col) with col - row <= diagonal (tril) or >= diagonal (triu)
    lower = np.tri(rows, cols, diagonal, dtype=bool)
    drop = ~lower if keep_lower else np.tri(rows, cols, diagonal - 1, dtype=bool)
    np.copyto(out, as_operand(0, out.dtype), where=drop)


@kernel("aten::tril.out")
def tril_out(self, diagonal, out):
    _triangle(self, diagonal, out, keep_lower=True)


@kernel("aten::triu.out")
def triu_out(self, diagonal, out):
    _triangle(self, diagonal, out, keep_lower=False)
