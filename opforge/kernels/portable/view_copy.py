"""The copy forms of view ops (``view_copy``, ``permute_copy``, ``expand_copy``,
``as_strided_copy``, …), clone and dtype conversion.

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

from opforge.errors import KernelError
from opforge.kernels.portable._binding import shape_generic
from opforge.kernels.portable._registry import Kernel, kernel_decorator

__all__ = ["KERNELS"]

KERNELS: dict[str, Kernel] = {}
kernel = kernel_decorator(KERNELS)


def _copy(src: np.ndarray, out: np.ndarray) -> None:
    np.copyto(out, src, casting="unsafe")


def _copy_unsafe(dst: np.ndarray, src: np.ndarray) -> None:
    np.copyto(dst, src, casting="unsafe")


def _copy_kernel(*keys: str, generic: bool = False, views_only: bool = False,
                 specialise=None):
    """Register ``views(*args) -> (dst, src)`` as a copy kernel with a binder;
    ``generic``: the views are the arguments themselves (``_binding.shape_generic``);
    ``views_only``: ``src`` is always a NumPy view of ``self`` (transpose, basic indexing),
    never a copy, so the binder need not look for the input it shares memory with;
    ``specialise(bound) -> rebind | None``: a prepared instruction's own ``rebind``, for a
    kernel whose views at any size are known from the arguments at the upper bound (the
    general ``rebind`` below calls ``views`` and checks what it got: ~0.7 µs a shape)."""

    def register(views):
        def copy_out(*args):
            dst, src = views(*args)
            np.copyto(dst, src, casting="unsafe")

        def bind(args):
            dst, src = views(*args)
            if type(src) is not np.ndarray:
                return copy_out, args
            # A view of an input stays valid; a copy (reshape of a strided input) would not.
            # (The input itself is the common case: identity first, it is rebound per shape.)
            inputs = args[:-1]
            if src is not args[0] and not (views_only and src.size) and not any(
                    type(a) is np.ndarray and np.may_share_memory(src, a) for a in inputs):
                return copy_out, args
            if np.may_share_memory(dst, src):
                return copy_out, args
            if src.dtype == dst.dtype:
                return np.copyto, (dst, src)
            return _copy_unsafe, (dst, src)

        def prepare(bound):
            # at the upper bound (_binding: prepared binders): the dtypes hold at every
            # size, and so does "out and self do not overlap" (each view at a smaller size
            # lies within its tensor at the bound); whether src is still a view of self
            # depends on the sizes (a reshape may copy), and is all a rebind checks
            self, out = bound[0], bound[-1]
            if type(self) is not np.ndarray or np.may_share_memory(out, self) or \
                    bind(bound)[0] is not np.copyto:
                return None
            special = specialise(bound) if specialise is not None else None
            if special is not None:
                return special

            def rebind(args):
                dst, src = views(*args)
                self = args[0]
                if src is self or type(src) is np.ndarray and src.size and (
                        views_only or np.may_share_memory(src, self)):
                    return np.copyto, (dst, src)
                return None  # the binder decides

            return rebind

        copy_out.bind = shape_generic(bind) if generic else bind
        if not generic:  # a shape-generic binder is rebound from a template instead
            bind.prepare = prepare
        copy_out.__name__ = copy_out.__qualname__ = views.__name__
        copy_out.__doc__ = views.__doc__
        copy_out.__module__ = views.__module__
        return kernel(*keys)(copy_out)

    return register


def _reshaped(bound):
    # view_copy's source is ``self`` itself, at every size
    def rebind(args):
        self = args[0]
        return np.copyto, (args[-1].reshape(self.shape), self)

    return rebind


def _transposed(bound):
    # permute_copy's source is ``self`` transposed by the same axes at every size (its
    # dims are not symbolic: the same list, or an equal one)
    self, dims = bound[0], bound[1]
    if not self.ndim:
        return None
    axes = tuple(d % self.ndim for d in dims)

    def rebind(args):
        self = args[0]
        if args[1] is not dims and list(args[1]) != list(dims) or not self.size:
            return None  # the binder decides
        return np.copyto, (args[-1], self.transpose(axes))

    return rebind


def _reshaped_to_out(bound):
    # (un)squeeze_copy's source is ``self`` reshaped to out's shape: a view wherever
    # ``self`` is contiguous (a planned tensor is), else the binder decides
    def rebind(args):
        self, out = args[0], args[-1]
        if not self.flags.c_contiguous or not self.size:
            return None
        return np.copyto, (out, self.reshape(out.shape))

    return rebind


def _selected(bound):
    # select_copy's source is ``self`` indexed by the same key at every size (its dim and
    # index are not symbolic: equal ones, or the binder decides)
    self, dim, index = bound[0], bound[1], bound[2]
    if not self.ndim or type(dim) is not int or type(index) is not int:
        return None
    key = (slice(None),) * (dim % self.ndim) + (index,)

    def rebind(args):
        self = args[0]
        if args[1] != dim or args[2] != index or not self.size:
            return None
        return np.copyto, (args[-1], self[key])

    return rebind


@_copy_kernel("aten::view_copy.out", "aten::_unsafe_view.out", specialise=_reshaped)
def view_copy_out(self, size, out):
    # Row-major order is the logical order whatever the strides: copy into out viewed
    # with the input's shape (no temporary even for a non-contiguous input).
    return out.reshape(self.shape), self


@kernel("aten::view_copy.dtype_out")
def view_copy_dtype_out(self, dtype, out):
    # Reinterpret the bytes (the last dimension rescales when the item size changes).
    _copy(np.ascontiguousarray(self).view(out.dtype).reshape(out.shape), out)


@_copy_kernel("aten::permute_copy.out", views_only=True, specialise=_transposed)
def permute_copy_out(self, dims, out):
    return out, self.transpose([d % self.ndim for d in dims]) if self.ndim else self


@_copy_kernel("aten::transpose_copy.int_out", views_only=True)
def transpose_copy_out(self, dim0, dim1, out):
    return out, np.swapaxes(self, dim0, dim1) if self.ndim else self


@_copy_kernel("aten::t_copy.out", views_only=True)
def t_copy_out(self, out):
    return out, self.T  # 0-d and 1-d tensors are their own transpose


@_copy_kernel("aten::expand_copy.out", generic=True)
def expand_copy_out(self, size, implicit, out):
    return out, self  # out has the expanded shape; broadcasting does the rest


@_copy_kernel("aten::slice_copy.Tensor_out", views_only=True)
def slice_copy_out(self, dim, start, end, step, out):
    index = [slice(None)] * self.ndim
    index[dim] = slice(start, end, step)  # Python clamps out-of-range bounds, as ATen does
    return out, self[tuple(index)]


@_copy_kernel("aten::select_copy.int_out", views_only=True, specialise=_selected)
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
              "aten::unsqueeze_copy.out", specialise=_reshaped_to_out)
def unsqueeze_copy_out(self, dim, out):
    return out, self.reshape(out.shape)


@_copy_kernel("aten::clone.out", "aten::_to_copy.out", generic=True)
def clone_out(self, *args):
    # clone(self, memory_format, out) and _to_copy(self, non_blocking, memory_format, out):
    # out has the target dtype; memory formats do not exist in a C-contiguous arena.
    return args[-1], self


@_copy_kernel("aten::copy.out", generic=True)
def copy_out(self, src, non_blocking, out):
    return out, src  # src broadcast to self's shape, cast to self's dtype


@_copy_kernel("aten::diagonal_copy.out", views_only=True)
def diagonal_copy_out(self, offset, dim1, dim2, out):
    return out, np.diagonal(self, offset, dim1, dim2)


# as_strided_copy: what "storage" means for a NumPy input.
#
# ATen reads as_strided's sizes, strides and offset in elements of ``self``'s *storage*,
# not of ``self``: a transposed or sliced tensor reaches elements its own shape does not
# show. A portable kernel sees only an array — an arena view, a method input, a read-only
# constant — whose memory around it belongs to other values, so "storage" here is the
# input's own elements in row-major order: what ATen sees for a contiguous tensor at
# storage offset 0 that owns its storage. An omitted offset is 0.
#
# That matches every program the exporter writes: an as_strided whose input ATen would
# read differently (not contiguous, or a view reaching outside its own elements) is
# refused at export, and an input at a nonzero storage offset has its offset argument
# rebased (``opforge/export/passes/to_out_variant.py``). The case that occurs in real
# models — ``adaptive_avg_pool2d(x, 1)`` on a channels-last input, which is
# ``mean(x, (-1, -2), keepdim=True)`` restrided to channels-last by ``as_strided`` — reads
# a fresh contiguous ``mean`` result, the same elements in both readings.
#
# A program file is hostile input: every reach is checked against the input's element
# count before NumPy is given byte strides, so no view points outside the input. As in
# ATen, an empty result reads nothing and accepts any non-negative offset.
_AS_STRIDED = "aten::as_strided_copy.out"


def _integers(name: str, value, *, scalar: bool = False) -> tuple[int, ...]:
    """``value`` (an int, or a sequence of them) as a tuple of Python ints."""
    ints = (value,) if scalar else value
    if isinstance(ints, (tuple, list)) and all(
            isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))
            for v in ints):
        return tuple(int(v) for v in ints)
    raise KernelError(
        f"`{_AS_STRIDED}`: {name} — found {value!r} — valid: "
        f"{'an integer' if scalar else 'a list of integers'} — re-export the program"
    )


def _check_as_strided(self, size, stride, storage_offset, out) -> tuple[tuple, tuple, int]:
    """``(size, stride, offset)`` once each one is valid for ``self`` and ``out``."""
    size, stride = _integers("size", size), _integers("stride", stride)
    offset = 0 if storage_offset is None else _integers("storage_offset", storage_offset,
                                                        scalar=True)[0]
    problem = None
    if len(stride) != len(size):
        problem = (f"{len(size)} sizes and {len(stride)} strides",
                   "one stride per size")
    elif min(size, default=0) < 0 or min(stride, default=0) < 0 or offset < 0:
        problem = (f"size={list(size)}, stride={list(stride)}, storage_offset={offset}",
                   "non-negative sizes, strides and offset")
    elif tuple(out.shape) != size:
        problem = (f"size={list(size)} but out has shape {list(out.shape)}",
                   "out planned with the result's shape")
    elif 0 not in size:
        reach = offset + sum((n - 1) * s for n, s in zip(size, stride))
        if reach >= self.size:
            problem = (f"size={list(size)}, stride={list(stride)}, storage_offset={offset} "
                       f"reach element {reach} of an input of {self.size} elements",
                       (f"reads within elements 0..{self.size - 1}" if self.size else
                        "an empty result (the input has no elements)")
                       + " (the input's elements in row-major order are its storage)")
    if problem is not None:
        raise KernelError(
            f"`{_AS_STRIDED}`: arguments — {problem[0]} — valid: {problem[1]} — "
            "re-export the program; a hand-written one must keep as_strided inside its input"
        )
    return size, stride, offset


@_copy_kernel(_AS_STRIDED)
def as_strided_copy_out(self, size, stride, storage_offset, out):
    size, stride, offset = _check_as_strided(self, size, stride, storage_offset, out)
    if out.size == 0:
        return out, np.empty(size, self.dtype)
    flat = np.ascontiguousarray(self).reshape(-1)  # a view when self is C-contiguous
    # A dimension of size 1 never steps: its stride is set to 0 so that an unchecked huge
    # value cannot overflow NumPy's byte strides. Every other step stays within ``flat``.
    strides = tuple(s * flat.itemsize if n > 1 else 0 for n, s in zip(size, stride))
    return out, np.lib.stride_tricks.as_strided(flat[offset:], size, strides, writeable=False)
