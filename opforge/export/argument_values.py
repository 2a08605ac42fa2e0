"""One schema argument of an FX call → program values, directed by the argument's type.

The runtime binds each argument of a kernel call by schema position, so every argument
is emitted, including those the graph left at their default (filled from the schema).
``Layout``, ``MemoryFormat`` and ``Device`` become ``IntValue`` (ATen's enum number) or
``NoneValue``; ``Scalar`` becomes ``IntValue``, ``DoubleValue`` or ``BoolValue`` by the
Python type of the value; ``int[2] padding=0`` style broadcast defaults are expanded.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.fx

from opforge.errors import InternalError
from opforge.program import (
    BoolListValue, BoolValue, DoubleListValue, DoubleValue, IntListValue, IntValue, NoneValue,
    OptionalTensorListValue, ScalarType, ScalarTypeValue, SizeExpr, StringValue, TensorListValue,
    Value,
)
from opforge.export.symbolic import SymSize

__all__ = ["scalar_type_of", "argument_value", "python_value"]

_MEMORY_FORMATS = {
    torch.contiguous_format: 0, torch.preserve_format: 1,
    torch.channels_last: 2, torch.channels_last_3d: 3,
}
_LAYOUTS = {torch.strided: 0}


def scalar_type_of(dtype: torch.dtype) -> ScalarType:
    """The program's ScalarType (ATen numbering) of a torch dtype."""
    try:
        return ScalarType[str(dtype).removeprefix("torch.").upper()]
    except KeyError:
        raise InternalError(f"no program ScalarType for {dtype}") from None


def python_value(value: Any) -> Value:
    """A program value for a plain Python value found in the graph (not a node)."""
    if value is None:
        return NoneValue()
    if isinstance(value, bool):
        return BoolValue(value)
    if isinstance(value, int):
        return IntValue(value)
    if isinstance(value, float):
        return DoubleValue(value)
    if isinstance(value, str):
        return StringValue(value)
    if isinstance(value, torch.dtype):
        return ScalarTypeValue(scalar_type_of(value))
    if isinstance(value, torch.memory_format):
        return IntValue(_MEMORY_FORMATS[value])
    if isinstance(value, torch.layout):
        return IntValue(_LAYOUTS[value])
    if isinstance(value, torch.device):
        if value.type != "cpu":
            raise InternalError(f"device {value} in an exported CPU graph")
        return IntValue(0)  # c10::DeviceType::CPU
    if isinstance(value, (list, tuple)):
        if all(isinstance(v, bool) for v in value) and value:
            return BoolListValue(tuple(value))
        if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return IntListValue(tuple(value))
        if all(isinstance(v, (int, float)) for v in value):
            return DoubleListValue(tuple(float(v) for v in value))
    raise InternalError(f"cannot emit the Python value {value!r} ({type(value).__name__})")


def _has_sym(value: Any) -> bool:
    if isinstance(value, SymSize):
        return True
    return isinstance(value, (list, tuple)) and any(isinstance(v, SymSize) for v in value)


def _element(schema_type: Any) -> Any:
    return schema_type.getElementType()


def argument_value(
    arg: Any,  # torch._C.Argument
    value: Any,
    tensor_index: Callable[[torch.fx.Node], int],
    add_value: Callable[[Value], int],
    add_symbolic: Callable[[Value, tuple], int] | None = None,
) -> int:
    """The value index of ``value`` passed for schema argument ``arg``.

    A ``SymSize`` (a size computed per call), alone or in an ``int[]``, becomes an
    ``IntValue``/``IntListValue`` holding its value at the export example, registered
    through ``add_symbolic`` with its expression(s)."""
    schema_type = arg.type
    if add_symbolic is not None and _has_sym(value):
        if isinstance(value, SymSize):
            return add_symbolic(IntValue(value.hint), (value.expr,))
        items = list(value)
        return add_symbolic(
            IntListValue(tuple(v.hint if isinstance(v, SymSize) else int(v) for v in items)),
            tuple(v.expr if isinstance(v, SymSize) else SizeExpr.const(int(v)) for v in items))
    if isinstance(schema_type, torch.OptionalType):
        if value is None:
            return add_value(NoneValue())
        schema_type = schema_type.getElementType()
    if isinstance(value, torch.fx.Node):
        return tensor_index(value)
    if isinstance(schema_type, torch.ListType):
        element = _element(schema_type)
        if isinstance(element, torch.TensorType):
            return add_value(TensorListValue(tuple(tensor_index(v) for v in value)))
        if isinstance(element, torch.OptionalType):
            return add_value(OptionalTensorListValue(
                tuple(None if v is None else tensor_index(v) for v in value)))
        if not isinstance(value, (list, tuple)):  # `int[2] padding=0` broadcasts
            value = [value] * (arg.N or 1)
        if isinstance(element, torch.BoolType):
            return add_value(BoolListValue(tuple(bool(v) for v in value)))
        if isinstance(element, torch.FloatType):
            return add_value(DoubleListValue(tuple(float(v) for v in value)))
        return add_value(IntListValue(tuple(int(v) for v in value)))
    if isinstance(schema_type, torch.FloatType) and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    real = str(getattr(arg, "real_type", schema_type))
    if "ScalarType" in real and isinstance(value, int):
        return add_value(ScalarTypeValue(ScalarType.parse(value)))
    return add_value(python_value(value))
