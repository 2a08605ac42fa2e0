"""Tensor element types, numbered exactly as ATen's ``c10::ScalarType``.

Keeping ATen's numbers means an exporter writes ``ScalarType[str(t.dtype)[6:].upper()]``
and a C runtime can share the enum with ExecuTorch-style headers. Only the types the
portable runtime can hold in memory are listed; quantized ATen types (QInt8, ...) are not:
opforge stores quantized tensors as plain integer tensors with their scales beside them.
"""

from __future__ import annotations

import enum

import numpy as np

from opforge.program._errors import program_error

__all__ = ["ScalarType"]


class ScalarType(enum.IntEnum):
    """A tensor dtype with ATen's numbering.

    >>> ScalarType.FLOAT32.itemsize, ScalarType.FLOAT32.numpy_dtype()
    (4, dtype('float32'))
    >>> ScalarType.from_numpy(np.dtype("int64"))
    <ScalarType.INT64: 4>
    """

    UINT8 = 0
    INT8 = 1
    INT16 = 2
    INT32 = 3
    INT64 = 4
    FLOAT16 = 5
    FLOAT32 = 6
    FLOAT64 = 7
    COMPLEX32 = 8
    COMPLEX64 = 9
    COMPLEX128 = 10
    BOOL = 11
    BFLOAT16 = 15
    UINT16 = 27
    UINT32 = 28
    UINT64 = 29

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return _ITEMSIZE[self]

    def numpy_dtype(self) -> np.dtype:
        """The NumPy dtype holding this type; ProgramError for BFLOAT16 and COMPLEX32."""
        dtype = _TO_NUMPY.get(self)
        if dtype is None:
            raise program_error(
                f"`ScalarType.{self.name}.numpy_dtype()`",
                f"{self.name.lower()}, which NumPy has no dtype for",
                "the types with a NumPy equivalent: "
                + ", ".join(t.name.lower() for t in _TO_NUMPY),
                f"read the raw bits with numpy.{_RAW_BITS[self]} and convert them yourself, "
                "or export the tensor as float32",
            )
        return dtype

    @classmethod
    def from_numpy(cls, dtype: np.dtype | type | str) -> ScalarType:
        """The ScalarType of a little-endian (or native on x86/ARM) NumPy dtype."""
        key = np.dtype(dtype)
        for scalar_type, candidate in _TO_NUMPY.items():
            if candidate == key:
                return scalar_type
        raise program_error(
            f"`ScalarType.from_numpy({np.dtype(dtype)!s})`",
            f"numpy dtype {np.dtype(dtype)!s}",
            "little-endian " + ", ".join(str(d) for d in _TO_NUMPY.values()),
            "convert the array first, e.g. array.astype(array.dtype.newbyteorder('<'))",
        )

    @classmethod
    def parse(cls, number: int) -> ScalarType:
        """The ScalarType with ATen number ``number``; ProgramError naming the valid ones."""
        scalar_type = _BY_NUMBER.get(number)
        if scalar_type is None:
            raise program_error(
                "dtype",
                f"unknown dtype number {number!r}",
                ", ".join(f"{t.value} ({t.name.lower()})" for t in cls),
                "re-export the program with this opforge version",
            )
        return scalar_type


_ITEMSIZE = {
    ScalarType.UINT8: 1, ScalarType.INT8: 1, ScalarType.INT16: 2, ScalarType.INT32: 4,
    ScalarType.INT64: 8, ScalarType.FLOAT16: 2, ScalarType.FLOAT32: 4, ScalarType.FLOAT64: 8,
    ScalarType.COMPLEX32: 4, ScalarType.COMPLEX64: 8, ScalarType.COMPLEX128: 16,
    ScalarType.BOOL: 1, ScalarType.BFLOAT16: 2, ScalarType.UINT16: 2, ScalarType.UINT32: 4,
    ScalarType.UINT64: 8,
}

# Little-endian on purpose: the program file is little-endian, and constants are viewed in
# place. On a little-endian host "<f4" equals the native "float32".
_TO_NUMPY = {
    t: np.dtype("<" + code)
    for t, code in [
        (ScalarType.UINT8, "u1"), (ScalarType.INT8, "i1"), (ScalarType.INT16, "i2"),
        (ScalarType.INT32, "i4"), (ScalarType.INT64, "i8"), (ScalarType.FLOAT16, "f2"),
        (ScalarType.FLOAT32, "f4"), (ScalarType.FLOAT64, "f8"), (ScalarType.COMPLEX64, "c8"),
        (ScalarType.COMPLEX128, "c16"), (ScalarType.BOOL, "?"), (ScalarType.UINT16, "u2"),
        (ScalarType.UINT32, "u4"), (ScalarType.UINT64, "u8"),
    ]
}

_RAW_BITS = {ScalarType.BFLOAT16: "uint16", ScalarType.COMPLEX32: "uint32"}

_BY_NUMBER = {int(t): t for t in ScalarType}
