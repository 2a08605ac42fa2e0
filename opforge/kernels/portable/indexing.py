"""Indexing: advanced indexing (``index.Tensor``), gather, index_select, embedding,
scatter forms, slice/select scatter and the triangle masks tril/triu.

ATen's advanced indexing and NumPy's agree: ``None`` entries keep a dimension, index
tensors broadcast together, bool (and legacy uint8) masks select by position, and when
the indexed dimensions are not adjacent their result dimension moves to the front.
"""

from __future__ import annotations

import numpy as np

from opforge.errors import KernelError
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


def _check_range(index: np.ndarray, size: int, api: str) -> None:
    if index.size and (index.min() < -size or index.max() >= size):
        raise KernelError(
            f"`{api}`: index — found values in [{index.min()}, {index.max()}] — "
            f"valid: [{-size}, {size - 1}] for a dimension of size {size} — "
            "check the indices against the tensor's shape"
        )


@kernel("aten::index.Tensor_out")
def index_out(self, indices, out):
    np.copyto(out, self[_numpy_index(indices)], casting="unsafe")


@kernel("aten::index_put.out")
def index_put_out(self, indices, values, accumulate, out):
    np.copyto(out, self, casting="unsafe")
    index = _numpy_index(indices)
    if accumulate:
        np.add.at(out, index, values)  # repeated indices add up, as in ATen
    else:
        out[index] = values


@kernel("aten::index_select.out")
def index_select_out(self, dim, index, out):
    axis = dim % max(self.ndim, 1)
    _check_range(index, self.shape[axis] if self.ndim else 1, "aten::index_select.out")
    x = self if self.ndim else self.reshape(1)
    np.copyto(out, np.take(x, index.reshape(-1), axis=axis).reshape(out.shape),
              casting="unsafe")


@kernel("aten::embedding.out")
def embedding_out(weight, indices, padding_idx, scale_grad_by_freq, sparse, out):
    # padding_idx and the two gradient flags only matter for training.
    _check_range(indices, weight.shape[0], "aten::embedding.out")
    np.take(weight, indices, axis=0, out=out)


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
    dim %= self.ndim
    _check_range(index, self.shape[dim], "aten::gather.out")
    # index may be smaller than self in the other dims.
    np.copyto(out, self[_index_grid(index, dim)], casting="unsafe")


def _scatter(self, dim, index, src, reduce, out):
    np.copyto(out, self, casting="unsafe")
    dim %= max(self.ndim, 1)
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


@kernel("aten::slice_scatter.out")
def slice_scatter_out(self, src, dim, start, end, step, out):
    np.copyto(out, self, casting="unsafe")
    index = [slice(None)] * self.ndim
    index[dim] = slice(start, end, step)
    np.copyto(out[tuple(index)], src, casting="unsafe")


@kernel("aten::select_scatter.out")
def select_scatter_out(self, src, dim, index, out):
    np.copyto(out, self, casting="unsafe")
    where = [slice(None)] * self.ndim
    where[dim] = index
    np.copyto(out[tuple(where)], src, casting="unsafe")


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
