"""The values of a method: tensors, scalars and lists, as a tagged union of frozen dataclasses.

A method's values live in one table (``Method.values``); instructions, inputs, outputs and
tensor lists refer to them by index. Each dataclass checks its *own* invariants in
``__post_init__`` (types, non-negative sizes, a permutation for ``dim_order``, the size cap);
everything that needs the rest of the program (indices, arenas, segments) is the verifier's.

ATen argument kinds without a class of their own are stored as plain values (documented in
docs/program-format.md): ``Layout``, ``MemoryFormat`` and ``Device`` as ``IntValue`` holding
ATen's enum number, or ``NoneValue`` when left at the default; ``Scalar`` as ``IntValue``,
``DoubleValue`` or ``BoolValue``; ``Tensor?`` as a ``TensorValue`` or ``NoneValue``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Union

from opforge.program._errors import program_error
from opforge.program.scalar_type import _ITEMSIZE, ScalarType

__all__ = [
    "MAX_RANK", "MAX_TENSOR_BYTES", "ArenaStorage", "ConstantStorage", "Storage",
    "PACKING_NONE", "PACKING_INT4", "PACKING_SPLAT",
    "TensorValue", "IntValue", "DoubleValue", "BoolValue", "StringValue", "NoneValue",
    "IntListValue", "DoubleListValue", "BoolListValue", "TensorListValue",
    "OptionalTensorListValue", "ScalarTypeValue", "Value", "VALUE_TYPES",
]

MAX_RANK = 64  # ATen's own limit on dimensions
MAX_TENSOR_BYTES = 2**48  # 256 TiB: far above any real tensor, far below int64 overflow
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_UINT32_MAX = 2**32 - 1


def _check_int(owner: str, field: str, value: object, low: int, high: int) -> None:
    if type(value) is not int or not low <= value <= high:
        raise program_error(
            f"`{owner}`: {field}", repr(value), f"an int in [{low}, {high}]",
            "pass a Python int in range (in a loaded file: the file is corrupt, re-export it)",
        )


def _as_tuple(owner: str, field: str, value: object) -> tuple:
    if isinstance(value, tuple):
        return value
    if isinstance(value, (list, range)):
        return tuple(value)
    raise program_error(f"`{owner}`: {field}", type(value).__name__, "a tuple or list")


@dataclass(frozen=True, slots=True)
class ArenaStorage:
    """A planned tensor: ``nbytes`` bytes at ``offset`` in arena ``mem_id``."""

    mem_id: int
    offset: int

    def __post_init__(self) -> None:
        mem_id, offset = self.mem_id, self.offset
        if type(mem_id) is not int or type(offset) is not int or not (
                0 <= mem_id <= _UINT32_MAX and 0 <= offset <= _INT64_MAX):
            _check_int("ArenaStorage", "mem_id", mem_id, 0, _UINT32_MAX)
            _check_int("ArenaStorage", "offset", offset, 0, _INT64_MAX)


PACKING_NONE = 0
PACKING_INT4 = 1  # signed 4-bit values in [-8, 7], two per byte, low nibble first
PACKING_SPLAT = 2  # one element stored, every element equal to it (format version 5)


@dataclass(frozen=True, slots=True)
class ConstantStorage:
    """A constant tensor: its bytes at ``offset`` in ``Program.segments[segment]``.

    ``packing`` is ``PACKING_NONE`` (``nbytes`` bytes, the tensor's own layout) or
    ``PACKING_INT4`` (an int8 tensor whose values fit in 4 bits, stored two per byte:
    ``ceil(numel / 2)`` bytes, element ``2i`` in the low nibble of byte ``i``, element
    ``2i + 1`` in the high one, two's complement; format version 2). Readers unpack it to
    int8 (``constant_array``). ``PACKING_SPLAT`` stores one element (``itemsize`` bytes)
    that every element equals: only a state tensor's initial value may be stored so (a KV
    cache of zeros costs the file nothing; format version 5).
    """

    segment: int
    offset: int
    packing: int = PACKING_NONE

    def __post_init__(self) -> None:
        segment, offset = self.segment, self.offset
        if type(segment) is not int or type(offset) is not int or not (
                0 <= segment <= _UINT32_MAX and 0 <= offset <= _INT64_MAX):
            _check_int("ConstantStorage", "segment", segment, 0, _UINT32_MAX)
            _check_int("ConstantStorage", "offset", offset, 0, _INT64_MAX)
        if type(self.packing) is not int or self.packing not in (
                PACKING_NONE, PACKING_INT4, PACKING_SPLAT):
            _check_int("ConstantStorage", "packing", self.packing, PACKING_NONE, PACKING_SPLAT)


Storage = Union[ArenaStorage, ConstantStorage, None]


@dataclass(frozen=True, slots=True)
class TensorValue:
    """A tensor: dtype, sizes, dim order (``None`` → contiguous) and where its bytes live.

    The bytes are ``numel * itemsize`` long and laid out densely in ``dim_order`` (the
    outermost dimension first), so ``(0, 2, 3, 1)`` is channels-last for a 4-d tensor.

    >>> t = TensorValue(ScalarType.FLOAT32, (2, 3), storage=ArenaStorage(0, 64))
    >>> t.dim_order, t.numel, t.nbytes
    ((0, 1), 6, 24)
    """

    dtype: ScalarType
    sizes: tuple[int, ...]
    dim_order: tuple[int, ...] | None = None
    storage: Storage = None

    def __post_init__(self) -> None:
        # The loader builds thousands of these: the common case costs one pass over sizes.
        dtype, sizes, order = self.dtype, self.sizes, self.dim_order
        if type(dtype) is not ScalarType:
            if type(dtype) is not int:
                raise program_error("`TensorValue`: dtype", repr(dtype), "a ScalarType")
            dtype = ScalarType.parse(dtype)
            object.__setattr__(self, "dtype", dtype)
        if type(sizes) is not tuple:
            sizes = _as_tuple("TensorValue", "sizes", sizes)
            object.__setattr__(self, "sizes", sizes)
        rank = len(sizes)
        if rank > MAX_RANK:
            raise program_error("`TensorValue`: rank", str(rank), f"at most {MAX_RANK}")
        numel = extent = 1  # extent: zeros counted as 1, so an empty tensor is bounded too
        for dim, size in enumerate(sizes):
            if type(size) is not int or not 0 <= size <= _INT64_MAX:
                _check_int("TensorValue", f"sizes[{dim}]", size, 0, _INT64_MAX)
            numel *= size
            extent *= size or 1
        contiguous = _CONTIGUOUS[rank]
        if order is None or order == contiguous:
            object.__setattr__(self, "dim_order", contiguous)
        else:
            order = _as_tuple("TensorValue", "dim_order", order)
            object.__setattr__(self, "dim_order", order)
            if sorted(order) != list(contiguous):
                raise program_error(
                    "`TensorValue`: dim_order", repr(order),
                    f"a permutation of 0..{rank - 1} (rank {rank})",
                )
        if extent * _ITEMSIZE[dtype] > MAX_TENSOR_BYTES:
            raise program_error(
                "`TensorValue`: sizes", f"{sizes} of {dtype.name.lower()} "
                f"({extent * _ITEMSIZE[dtype]} bytes, zero sizes counted as 1)",
                f"at most {MAX_TENSOR_BYTES} bytes (2**48), for an empty tensor too (NumPy "
                "cannot shape an array whose sizes multiply past that, even with a zero)",
            )
        storage = self.storage
        if type(storage) not in _STORAGE_TYPES:
            raise program_error(
                "`TensorValue`: storage", type(self.storage).__name__,
                "ArenaStorage, ConstantStorage or None",
            )
        if type(storage) is ConstantStorage and storage.packing == PACKING_INT4 and \
                dtype is not ScalarType.INT8:
            raise program_error(
                "`TensorValue`: storage.packing", f"int4 packing of a {dtype.name.lower()} tensor",
                "int4 packing of int8 tensors only (values in [-8, 7])",
                "store the tensor unpacked, or as int8")

    @property
    def numel(self) -> int:
        """Number of elements (1 for a 0-d tensor)."""
        return math.prod(self.sizes)

    @property
    def nbytes(self) -> int:
        """Bytes the tensor occupies in memory (in its arena, or once a constant is read)."""
        return math.prod(self.sizes) * _ITEMSIZE[self.dtype]

    @property
    def stored_nbytes(self) -> int:
        """Bytes the tensor occupies in its arena or segment (``ceil(numel / 2)`` packed, one
        element for a splat)."""
        storage = self.storage
        if type(storage) is ConstantStorage and storage.packing:
            if storage.packing == PACKING_SPLAT:
                return _ITEMSIZE[self.dtype]
            return (math.prod(self.sizes) + 1) // 2
        return math.prod(self.sizes) * _ITEMSIZE[self.dtype]


_STORAGE_TYPES = (ArenaStorage, ConstantStorage, type(None))
_CONTIGUOUS = tuple(tuple(range(rank)) for rank in range(MAX_RANK + 1))


@dataclass(frozen=True, slots=True)
class IntValue:
    """An ``int`` (int64) argument; also Layout/MemoryFormat/Device enum numbers."""

    value: int

    def __post_init__(self) -> None:
        _check_int("IntValue", "value", self.value, _INT64_MIN, _INT64_MAX)


@dataclass(frozen=True, slots=True)
class DoubleValue:
    """A ``float`` (float64) argument."""

    value: float

    def __post_init__(self) -> None:
        if type(self.value) is int:
            object.__setattr__(self, "value", float(self.value))
        elif type(self.value) is not float:
            raise program_error("`DoubleValue`: value", repr(self.value), "a float")


@dataclass(frozen=True, slots=True)
class BoolValue:
    """A ``bool`` argument."""

    value: bool

    def __post_init__(self) -> None:
        if type(self.value) is not bool:
            raise program_error("`BoolValue`: value", repr(self.value), "True or False")


@dataclass(frozen=True, slots=True)
class StringValue:
    """A ``str`` argument (UTF-8 in the file)."""

    value: str

    def __post_init__(self) -> None:
        if type(self.value) is not str:
            raise program_error("`StringValue`: value", repr(self.value), "a str")


@dataclass(frozen=True, slots=True)
class NoneValue:
    """``None``: an absent optional argument."""


@dataclass(frozen=True, slots=True)
class IntListValue:
    """An ``int[]`` argument."""

    values: tuple[int, ...]

    def __post_init__(self) -> None:
        values = _as_tuple("IntListValue", "values", self.values)
        object.__setattr__(self, "values", values)
        for i, v in enumerate(values):
            _check_int("IntListValue", f"values[{i}]", v, _INT64_MIN, _INT64_MAX)


@dataclass(frozen=True, slots=True)
class DoubleListValue:
    """A ``float[]`` argument."""

    values: tuple[float, ...]

    def __post_init__(self) -> None:
        values = _as_tuple("DoubleListValue", "values", self.values)
        if not all(type(v) is float for v in values):
            if not all(type(v) in (int, float) for v in values):
                raise program_error("`DoubleListValue`: values", repr(values), "floats")
            values = tuple(float(v) for v in values)
        object.__setattr__(self, "values", values)


@dataclass(frozen=True, slots=True)
class BoolListValue:
    """A ``bool[]`` argument."""

    values: tuple[bool, ...]

    def __post_init__(self) -> None:
        values = _as_tuple("BoolListValue", "values", self.values)
        object.__setattr__(self, "values", values)
        if not all(type(v) is bool for v in values):
            raise program_error("`BoolListValue`: values", repr(values), "True/False only")


@dataclass(frozen=True, slots=True)
class TensorListValue:
    """A ``Tensor[]`` argument: indices of ``TensorValue``s in the same method."""

    items: tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "items", _as_tuple("TensorListValue", "items", self.items))


@dataclass(frozen=True, slots=True)
class OptionalTensorListValue:
    """A ``Tensor?[]`` argument: indices of ``TensorValue``s, or ``None`` for an absent one."""

    items: tuple[int | None, ...]

    def __post_init__(self) -> None:
        items = _as_tuple("OptionalTensorListValue", "items", self.items)
        object.__setattr__(self, "items", items)


@dataclass(frozen=True, slots=True)
class ScalarTypeValue:
    """A ``ScalarType`` argument, e.g. ``dtype=torch.float32``."""

    dtype: ScalarType

    def __post_init__(self) -> None:
        if type(self.dtype) is not ScalarType:
            if type(self.dtype) is not int:
                raise program_error("`ScalarTypeValue`: dtype", repr(self.dtype), "a ScalarType")
            object.__setattr__(self, "dtype", ScalarType.parse(self.dtype))


Value = Union[
    TensorValue, IntValue, DoubleValue, BoolValue, StringValue, NoneValue, IntListValue,
    DoubleListValue, BoolListValue, TensorListValue, OptionalTensorListValue, ScalarTypeValue,
]
VALUE_TYPES: tuple[type, ...] = Value.__args__
