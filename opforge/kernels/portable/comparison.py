"""Comparisons, logical and bitwise ops, ``where`` and ``masked_fill``.

Comparisons compute in the promoted dtype of their operands (``int_tensor == 2.5``
compares in float32, as ATen does) and write bool, or whatever dtype ``out`` has.
Bound, operands are converted once (scalars) or per call by the ufunc's ``dtype``.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from opforge.kernels.portable._binding import fold_scalar, prepares, shape_generic, steps
from opforge.kernels.portable._promotion import result_type
from opforge.kernels.portable._registry import Kernel, binder_for, kernel_decorator
from opforge.kernels.portable.arithmetic import as_operand, bind_binary

__all__ = ["KERNELS"]

KERNELS: dict[str, Kernel] = {}
kernel = kernel_decorator(KERNELS)


def _compare(ufunc: np.ufunc, a, b, out: np.ndarray) -> None:
    ct = result_type(a, b)
    a, b = as_operand(a, ct), as_operand(b, ct)
    if a.dtype != ct:
        a = a.astype(ct)
    if b.dtype != ct:
        b = b.astype(ct)
    ufunc(a, b, out=out, casting="unsafe")


def _comparison(name: str, ufunc: np.ufunc) -> None:
    def compare_out(self, other, out):
        _compare(ufunc, self, other, out)

    @binder_for(compare_out)
    @shape_generic
    def bind(args):
        a, b, out = args
        ct = result_type(a, b)
        a, b = fold_scalar(a, ct), fold_scalar(b, ct)
        if out.dtype == np.bool_ and a.dtype == ct and b.dtype == ct:
            return steps([(ufunc, (a, b, out))], out)
        return compare_out, args

    compare_out.__name__ = compare_out.__qualname__ = f"{name}_out"
    kernel(f"aten::{name}.Tensor_out", f"aten::{name}.Scalar_out")(compare_out)


for _name, _ufunc in (("eq", np.equal), ("ne", np.not_equal), ("lt", np.less),
                      ("le", np.less_equal), ("gt", np.greater), ("ge", np.greater_equal)):
    _comparison(_name, _ufunc)


def _logical(name: str, ufunc: np.ufunc) -> None:
    def logical_out(self, other, out):
        ufunc(self, other, out=out, casting="unsafe")

    logical_out.__name__ = logical_out.__qualname__ = f"logical_{name}_out"
    kernel(f"aten::logical_{name}.out")(logical_out)


for _name, _ufunc in (("and", np.logical_and), ("or", np.logical_or),
                      ("xor", np.logical_xor)):
    _logical(_name, _ufunc)


@kernel("aten::logical_not.out")
def logical_not_out(self, out):
    np.logical_not(self, out=out, casting="unsafe")


def _bitwise(name: str, ufunc: np.ufunc) -> None:
    def bitwise_out(self, other, out):
        ct = result_type(self, other)
        ufunc(as_operand(self, ct), as_operand(other, ct), out=out, dtype=ct,
              casting="unsafe")

    @binder_for(bitwise_out)
    def bind(args):
        return bind_binary(ufunc, *args)

    bitwise_out.__name__ = bitwise_out.__qualname__ = f"bitwise_{name}_out"
    kernel(f"aten::bitwise_{name}.Tensor_out", f"aten::bitwise_{name}.Scalar_out",
           f"aten::bitwise_{name}.Scalar_Tensor_out")(bitwise_out)


for _name, _ufunc in (("and", np.bitwise_and), ("or", np.bitwise_or),
                      ("xor", np.bitwise_xor)):
    _bitwise(_name, _ufunc)


@kernel("aten::bitwise_not.out")
def bitwise_not_out(self, out):
    # On bool tensors NumPy's invert is the logical not, as in ATen.
    np.invert(self, out=out, casting="unsafe")


@kernel("aten::where.self_out")
def where_out(condition, self, other, out):
    # Two masked copies instead of np.where: no temporary of the output's size.
    np.copyto(out, other, casting="unsafe")
    np.copyto(out, self, casting="unsafe", where=condition.astype(bool, copy=False))


@kernel("aten::masked_fill.Scalar_out", "aten::masked_fill.Tensor_out")
def masked_fill_out(self, mask, value, out):
    np.copyto(out, self, casting="unsafe")
    np.copyto(out, as_operand(value, out.dtype), casting="unsafe",
              where=mask.astype(bool, copy=False))


@binder_for(bitwise_not_out)
def _bind_bitwise_not(args):
    self, out = args
    return steps([(np.invert, (self, out)) if self.dtype == out.dtype
                  else (partial(np.invert, casting="unsafe"), (self, out))], out)


@binder_for(logical_not_out)
def _bind_logical_not(args):
    self, out = args
    return steps([(partial(np.logical_not, casting="unsafe"), (self, out))], out)


def _copy_where(dst: np.ndarray, src, where: np.ndarray) -> None:
    np.copyto(dst, src, casting="unsafe", where=where)


@binder_for(where_out)
def _bind_where(args):
    condition, self, other, out = args
    if condition.dtype != np.bool_ or any(
            isinstance(v, np.ndarray) and np.may_share_memory(v, out)
            for v in (condition, self, other)):
        return where_out, args
    return steps([(_copy_unsafe, (out, other)), (_copy_where, (out, self, condition))])


def _copy_unsafe(dst: np.ndarray, src) -> None:
    np.copyto(dst, src, casting="unsafe")


@prepares(_bind_where)
def _prepare_where(bound):
    # dtypes, and no input overlapping out, hold at every size once they hold at the
    # upper bound: each size's pair is the same two steps on its own arguments
    if _bind_where(bound)[0] is where_out:
        return None
    return lambda args: steps([(_copy_unsafe, (args[3], args[2])),
                               (_copy_where, (args[3], args[1], args[0]))])


@binder_for(masked_fill_out)
def _bind_masked_fill(args):
    self, mask, value, out = args
    if mask.dtype != np.bool_ or np.may_share_memory(mask, out) or (
            isinstance(value, np.ndarray) and np.may_share_memory(value, out)):
        return masked_fill_out, args
    if not isinstance(value, np.ndarray) or not value.flags.writeable:
        value = as_operand(value, out.dtype).astype(out.dtype)  # fold a scalar/constant
    return steps([(partial(np.copyto, casting="unsafe"), (out, self)),
                  (_copy_where, (out, value, mask))])
