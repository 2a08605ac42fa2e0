"""Ops that join, split or rearrange whole tensors: cat, stack, split, unbind, pad,
repeat, flip, roll, pixel shuffle.

Bound (see ``_binding``), split and unbind become one ``np.copyto`` per piece from views
taken at load.
"""

from __future__ import annotations

import numpy as np

from opforge.kernels.portable._binding import steps
from opforge.kernels.portable._registry import Kernel, binder_for, kernel_decorator

__all__ = ["KERNELS"]

KERNELS: dict[str, Kernel] = {}
kernel = kernel_decorator(KERNELS)


@kernel("aten::cat.out")
def cat_out(tensors, dim, out):
    # ATen's legacy rule: 1-d empty tensors are skipped whatever the other ranks are.
    parts = [t for t in tensors if not (t.ndim == 1 and t.shape[0] == 0)] or list(tensors)
    np.concatenate(parts, axis=dim % out.ndim, out=out, casting="unsafe")


@kernel("aten::stack.out")
def stack_out(tensors, dim, out):
    np.stack(tensors, axis=dim % out.ndim, out=out, casting="unsafe")


def _split_views(self: np.ndarray, dim: int, outs: list[np.ndarray]) -> list[tuple]:
    """``(piece, view of self)`` for each output piece along ``dim``."""
    pairs, start = [], 0
    index = [slice(None)] * self.ndim
    for piece in outs:
        size = piece.shape[dim]
        index[dim] = slice(start, start + size)
        pairs.append((piece, self[tuple(index)]))
        start += size
    return pairs


def _split_into(self: np.ndarray, dim: int, outs: list[np.ndarray]) -> None:
    for piece, view in _split_views(self, dim, outs):  # one copy per output tensor
        np.copyto(piece, view, casting="unsafe")


def _bind_split(self: np.ndarray, dim: int, outs: list[np.ndarray]):
    if any(piece.dtype != self.dtype or np.may_share_memory(piece, self) for piece in outs):
        return None
    return steps([(np.copyto, pair) for pair in _split_views(self, dim % self.ndim, outs)])


@kernel("aten::split_with_sizes_copy.out")
def split_with_sizes_copy_out(self, split_sizes, dim, out):
    _split_into(self, dim % self.ndim, out)


@kernel("aten::split_copy.Tensor_out")
def split_copy_out(self, split_size, dim, out):
    _split_into(self, dim % self.ndim, out)


@binder_for(split_with_sizes_copy_out)
def _bind_split_with_sizes(args):
    self, _split_sizes, dim, out = args
    return _bind_split(self, dim, out) or (split_with_sizes_copy_out, args)


@binder_for(split_copy_out)
def _bind_split_copy(args):
    self, _split_size, dim, out = args
    return _bind_split(self, dim, out) or (split_copy_out, args)


@kernel("aten::unbind_copy.int_out")
def unbind_copy_out(self, dim, out):
    for i, piece in enumerate(out):
        np.copyto(piece, np.take(self, i, axis=dim), casting="unsafe")


@kernel("aten::constant_pad_nd.out")
def constant_pad_nd_out(self, pad, value, out):
    # pad = (last_lo, last_hi, second_last_lo, ...); negative amounts crop.
    out.fill(value)
    src = [slice(None)] * self.ndim
    dst = [slice(None)] * self.ndim
    for i in range(len(pad) // 2):
        axis = self.ndim - 1 - i
        lo, hi = pad[2 * i], pad[2 * i + 1]
        n = self.shape[axis]
        src[axis] = slice(max(-lo, 0), n - max(-hi, 0))
        dst[axis] = slice(max(lo, 0), max(lo, 0) + max(n - max(-lo, 0) - max(-hi, 0), 0))
    np.copyto(out[tuple(dst)], self[tuple(src)], casting="unsafe")


@kernel("aten::repeat.out")
def repeat_out(self, repeats, out):
    x = self.reshape((1,) * (len(repeats) - self.ndim) + self.shape)
    np.copyto(out, np.tile(x, repeats), casting="unsafe")


@kernel("aten::flip.out")
def flip_out(self, dims, out):
    np.copyto(out, np.flip(self, axis=tuple(dims)) if len(dims) else self, casting="unsafe")


@kernel("aten::roll.out")
def roll_out(self, shifts, dims, out):
    if len(dims) == 0:  # roll the flattened tensor
        np.copyto(out, np.roll(self.reshape(-1), shifts[0]).reshape(self.shape))
    else:
        np.copyto(out, np.roll(self, tuple(shifts), axis=tuple(dims)), casting="unsafe")


@kernel("aten::pixel_shuffle.out")
def pixel_shuffle_out(self, upscale_factor, out):
    r = upscale_factor
    *lead, c, h, w = self.shape
    x = self.reshape(tuple(lead) + (c // (r * r), r, r, h, w))
    n = len(lead)
    order = tuple(range(n)) + (n, n + 3, n + 1, n + 4, n + 2)
    np.copyto(out, x.transpose(order).reshape(out.shape), casting="unsafe")
