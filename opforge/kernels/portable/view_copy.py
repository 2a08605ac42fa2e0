"""The copy forms of view ops (``view_copy``, ``permute_copy``, ``expand_copy``, …), clone
and dtype conversion.

The exporter turns every view into its ``*_copy`` out variant, so each kernel here is one
``np.copyto`` from a NumPy *view* of the input into ``out``: the view costs nothing and
the copy is a single pass, whatever the input's strides. ``out`` is C-contiguous, so a
reshape of it is always a view too.

Each kernel is written as its ``(destination, source)`` pair of views; the kernel copies
one into the other, and its binder (see ``_binding``) takes the views once at load, so a
bound call is the bare ``np.copyto(dst, src)``.
"""

from __future__ import annotations

import numpy as np

from opforge.kernels.portable._registry import Kernel, kernel_decorator

__all__ = ["KERNELS"]

KERNELS: dict[str, Kernel] = {}
kernel = kernel_decorator(KERNELS)


def _copy(src: np.ndarray, out: np.ndarray) -> None:
    np.copyto(out, src, casting="unsafe")


def _copy_unsafe(dst: np.ndarray, src: np.ndarray) -> None:
    np.copyto(dst, src, casting="unsafe")


def _copy_kernel(*keys: str):
    """Register ``views(*args) -> (dst, src)`` as a copy kernel with a binder."""

    def register(views):
        def copy_out(*args):
            dst, src = views(*args)
            np.copyto(dst, src, casting="unsafe")

        def bind(args):
            dst, src = views(*args)
            inputs = [a for a in args[:-1] if type(a) is np.ndarray]
            # A view of an input stays valid; a copy (reshape of a strided input) would not.
            if np.may_share_memory(dst, src) or not any(
                    src is a or np.may_share_memory(src, a) for a in inputs):
                return copy_out, args
            if type(src) is np.ndarray and src.dtype == dst.dtype:
                return np.copyto, (dst, src)
            return _copy_unsafe, (dst, src)

        copy_out.bind = bind
        copy_out.__name__ = copy_out.__qualname__ = views.__name__
        copy_out.__doc__ = views.__doc__
        copy_out.__module__ = views.__module__
        return kernel(*keys)(copy_out)

    return register


@_copy_kernel("aten::view_copy.out", "aten::_unsafe_view.out")
def view_copy_out(self, size, out):
    # Row-major order is the logical order whatever the strides: copy into out viewed
    # with the input's shape (no temporary even for a non-contiguous input).
    return out.reshape(self.shape), self


@kernel("aten::view_copy.dtype_out")
def view_copy_dtype_out(self, dtype, out):
    # Reinterpret the bytes (the last dimension rescales when the item size changes).
    _copy(np.ascontiguousarray(self).view(out.dtype).reshape(out.shape), out)


@_copy_kernel("aten::permute_copy.out")
def permute_copy_out(self, dims, out):
    return out, self.transpose([d % self.ndim for d in dims]) if self.ndim else self


@_copy_kernel("aten::transpose_copy.int_out")
def transpose_copy_out(self, dim0, dim1, out):
    return out, np.swapaxes(self, dim0, dim1) if self.ndim else self


@_copy_kernel("aten::t_copy.out")
def t_copy_out(self, out):
    return out, self.T  # 0-d and 1-d tensors are their own transpose


@_copy_kernel("aten::expand_copy.out")
def expand_copy_out(self, size, implicit, out):
    return out, self  # out has the expanded shape; broadcasting does the rest


@_copy_kernel("aten::slice_copy.Tensor_out")
def slice_copy_out(self, dim, start, end, step, out):
    index = [slice(None)] * self.ndim
    index[dim] = slice(start, end, step)  # Python clamps out-of-range bounds, as ATen does
    return out, self[tuple(index)]


@_copy_kernel("aten::select_copy.int_out")
def select_copy_out(self, dim, index, out):
    where = [slice(None)] * self.ndim
    where[dim] = index  # a view; negative indices count from the end, as in ATen
    return out, self[tuple(where)]


@_copy_kernel("aten::squeeze_copy.out", "aten::alias_copy.out", "aten::lift_fresh_copy.out",
              "aten::detach_copy.out")
def squeeze_copy_out(self, out):
    # squeeze, alias, lift_fresh and detach only change the shape (or nothing).
    return out, self.reshape(out.shape)


@_copy_kernel("aten::squeeze_copy.dim_out", "aten::squeeze_copy.dims_out",
              "aten::unsqueeze_copy.out")
def unsqueeze_copy_out(self, dim, out):
    return out, self.reshape(out.shape)


@_copy_kernel("aten::clone.out", "aten::_to_copy.out")
def clone_out(self, *args):
    # clone(self, memory_format, out) and _to_copy(self, non_blocking, memory_format, out):
    # out has the target dtype; memory formats do not exist in a C-contiguous arena.
    return args[-1], self


@_copy_kernel("aten::copy.out")
def copy_out(self, src, non_blocking, out):
    return out, src  # src broadcast to self's shape, cast to self's dtype


@_copy_kernel("aten::diagonal_copy.out")
def diagonal_copy_out(self, offset, dim1, dim2, out):
    return out, np.diagonal(self, offset, dim1, dim2)
