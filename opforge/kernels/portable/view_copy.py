"""The copy forms of view ops (``view_copy``, ``permute_copy``, ``expand_copy``, …), clone
and dtype conversion.

The exporter turns every view into its ``*_copy`` out variant, so each kernel here is one
``np.copyto`` from a NumPy *view* of the input into ``out``: the view costs nothing and
the copy is a single pass, whatever the input's strides. ``out`` is C-contiguous, so a
reshape of it is always a view too.
"""

from __future__ import annotations

import numpy as np

from opforge.kernels.portable._registry import Kernel, kernel_decorator

__all__ = ["KERNELS"]

KERNELS: dict[str, Kernel] = {}
kernel = kernel_decorator(KERNELS)


def _copy(src: np.ndarray, out: np.ndarray) -> None:
    np.copyto(out, src, casting="unsafe")


@kernel("aten::view_copy.out", "aten::_unsafe_view.out")
def view_copy_out(self, size, out):
    # Row-major order is the logical order whatever the strides: copy into out viewed
    # with the input's shape (no temporary even for a non-contiguous input).
    _copy(self, out.reshape(self.shape))


@kernel("aten::view_copy.dtype_out")
def view_copy_dtype_out(self, dtype, out):
    # Reinterpret the bytes (the last dimension rescales when the item size changes).
    _copy(np.ascontiguousarray(self).view(out.dtype).reshape(out.shape), out)


@kernel("aten::permute_copy.out")
def permute_copy_out(self, dims, out):
    _copy(self.transpose([d % self.ndim for d in dims]) if self.ndim else self, out)


@kernel("aten::transpose_copy.int_out")
def transpose_copy_out(self, dim0, dim1, out):
    _copy(np.swapaxes(self, dim0, dim1) if self.ndim else self, out)


@kernel("aten::t_copy.out")
def t_copy_out(self, out):
    _copy(self.T, out)  # 0-d and 1-d tensors are their own transpose


@kernel("aten::expand_copy.out")
def expand_copy_out(self, size, implicit, out):
    _copy(self, out)  # out has the expanded shape; broadcasting does the rest


@kernel("aten::slice_copy.Tensor_out")
def slice_copy_out(self, dim, start, end, step, out):
    index = [slice(None)] * self.ndim
    index[dim] = slice(start, end, step)  # Python clamps out-of-range bounds, as ATen does
    _copy(self[tuple(index)], out)


@kernel("aten::select_copy.int_out")
def select_copy_out(self, dim, index, out):
    _copy(np.take(self, index, axis=dim), out)


@kernel("aten::squeeze_copy.out", "aten::alias_copy.out", "aten::lift_fresh_copy.out",
        "aten::detach_copy.out")
def squeeze_copy_out(self, out):
    # squeeze, alias, lift_fresh and detach only change the shape (or nothing).
    _copy(self.reshape(out.shape), out)


@kernel("aten::squeeze_copy.dim_out", "aten::squeeze_copy.dims_out",
        "aten::unsqueeze_copy.out")
def unsqueeze_copy_out(self, dim, out):
    _copy(self.reshape(out.shape), out)


@kernel("aten::clone.out", "aten::_to_copy.out")
def clone_out(self, *args):
    # clone(self, memory_format, out) and _to_copy(self, non_blocking, memory_format, out):
    # out has the target dtype; memory formats do not exist in a C-contiguous arena.
    _copy(self, args[-1])


@kernel("aten::copy.out")
def copy_out(self, src, non_blocking, out):
    _copy(src, out)  # src broadcast to self's shape, cast to self's dtype


@kernel("aten::diagonal_copy.out")
def diagonal_copy_out(self, offset, dim1, dim2, out):
    _copy(np.diagonal(self, offset, dim1, dim2), out)
