"""The opforge program file: plain frozen dataclasses, serializer, loader and verifier.

No PyTorch here: this package is part of the lean runtime. The format is documented field
by field in docs/program-format.md.

>>> from opforge.program import (Program, Method, TensorValue, ArenaStorage, ScalarType,
...                              KernelCall, Operator, MemoryPlan, to_bytes, from_bytes)
>>> x = TensorValue(ScalarType.FLOAT32, (4,), storage=ArenaStorage(0, 0))
>>> y = TensorValue(ScalarType.FLOAT32, (4,), storage=ArenaStorage(0, 64))
>>> forward = Method("forward", values=(x, y), inputs=(0,), outputs=(1,),
...                  instructions=(KernelCall(0, (0, 1)),),
...                  operators=(Operator("my_ops::relu6", "out"),),
...                  memory_plan=MemoryPlan((128,)))
>>> program = Program(methods=(forward,))
>>> from_bytes(to_bytes(program)) == program
True
"""

from __future__ import annotations

from opforge.program._format import FORMAT_VERSION
from opforge.program.constants import constant_array, pack_int4, unpack_int4
from opforge.program.debug import DebugInfo, debug_info, strip_debug_handles
from opforge.program.decode import from_bytes, load
from opforge.program.describe import describe
from opforge.program.encode import save, to_bytes
from opforge.program.model import (
    DelegateBlob, DelegateCall, Free, Instruction, KernelCall, MemoryPlan, Method, Move, NamedData,
    Operator, Program, Segment,
)
from opforge.program.scalar_type import ScalarType
from opforge.program.symbolic import Guard, SizeExpr, StateSlot, Symbol, SymbolicValue
from opforge.program.values import (
    MAX_RANK, MAX_TENSOR_BYTES, PACKING_INT4, PACKING_NONE, PACKING_SPLAT, ArenaStorage, BoolListValue, BoolValue, ConstantStorage,
    DoubleListValue, DoubleValue, IntListValue, IntValue, NoneValue, OptionalTensorListValue,
    ScalarTypeValue, Storage, StringValue, TensorListValue, TensorValue, Value,
)
from opforge.program.verify import verify

__all__ = [
    # the model
    "Program", "Method", "Segment", "DelegateBlob", "NamedData", "MemoryPlan", "Operator",
    "Instruction", "KernelCall", "DelegateCall", "Move", "Free",
    "Value", "TensorValue", "IntValue", "DoubleValue", "BoolValue", "StringValue", "NoneValue",
    "IntListValue", "DoubleListValue", "BoolListValue", "TensorListValue",
    "OptionalTensorListValue", "ScalarTypeValue",
    "Storage", "ArenaStorage", "ConstantStorage", "ScalarType",
    "Symbol", "SizeExpr", "Guard", "SymbolicValue", "StateSlot",
    "MAX_RANK", "MAX_TENSOR_BYTES", "FORMAT_VERSION", "PACKING_NONE", "PACKING_INT4", "PACKING_SPLAT",
    # bytes and files
    "to_bytes", "from_bytes", "save", "load",
    # checks and views
    "verify", "describe", "constant_array", "pack_int4", "unpack_int4",
    # debug handles
    "DebugInfo", "debug_info", "strip_debug_handles",
]
