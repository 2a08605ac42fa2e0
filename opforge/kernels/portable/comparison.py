"""Comparisons, logical and bitwise ops, ``where`` and ``masked_fill``.

Comparisons compute in the promoted dtype of their operands (``int_tensor == 2.5``
compares in float32, as ATen does) and write bool, or whatever dtype ``out`` has.
"""

from __future__ import annotations

import numpy as np

from opforge.kernels.portable._promotion import result_type
from opforge.kernels.portable._registry import Kernel, kernel_decorator
from opforge.kernels.portable.arithmetic import as_operand

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
