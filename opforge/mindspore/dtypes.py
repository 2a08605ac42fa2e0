"""MindSpore's dtype and format names, and how they map to NumPy (no torch).

An AOT kernel receives its tensors' dtypes as strings (``"float32"``); a C++ type-inference
function speaks MindSpore's ``TypeId`` numbers; a ``CustomRegOp`` lists
``(dtype, format)`` pairs such as ``("float32", "DefaultFormat")``. This module is the one
table between those names, NumPy dtypes and the ``TypeId`` numbers (the values of
MindSpore's ``TypeId`` enum for number types; ``opforge/mindspore/include/custom_aot_extra.h``
declares the same values).
"""

from __future__ import annotations

import numpy as np

__all__ = ["DTYPES", "TYPE_IDS", "FORMATS", "numpy_dtype", "dtype_name", "type_id_name"]

# MindSpore dtype string -> NumPy dtype (the dtypes an opforge program can carry).
DTYPES: dict[str, np.dtype] = {
    "bool": np.dtype(np.bool_), "int8": np.dtype(np.int8), "int16": np.dtype(np.int16),
    "int32": np.dtype(np.int32), "int64": np.dtype(np.int64), "uint8": np.dtype(np.uint8),
    "uint16": np.dtype(np.uint16), "uint32": np.dtype(np.uint32),
    "uint64": np.dtype(np.uint64), "float16": np.dtype(np.float16),
    "float32": np.dtype(np.float32), "float64": np.dtype(np.float64),
    "complex64": np.dtype(np.complex64), "complex128": np.dtype(np.complex128),
}

# MindSpore TypeId numbers of the number types (kNumberTypeBool = 30 ... kNumberTypeFloat64 = 44,
# kNumberTypeBFloat16 = 45, kNumberTypeComplex64 = 51, kNumberTypeComplex128 = 52).
TYPE_IDS: dict[str, int] = {
    "bool": 30, "int8": 32, "int16": 33, "int32": 34, "int64": 35, "uint8": 37,
    "uint16": 38, "uint32": 39, "uint64": 40, "float16": 42, "float32": 43, "float64": 44,
    "bfloat16": 45, "complex64": 51, "complex128": 52,
}
_TYPE_ID_NAMES = {v: k for k, v in TYPE_IDS.items()}

# The formats a CPU kernel can declare; every one of them is a plain dense layout here.
FORMATS = ("DefaultFormat", "NCHW", "NHWC", "ND", "")

_BY_NUMPY = {v: k for k, v in DTYPES.items()}


def numpy_dtype(name: str) -> np.dtype:
    """``"float32"`` → ``np.dtype('float32')`` (KeyError for a name outside ``DTYPES``)."""
    return DTYPES[name]


def dtype_name(dtype: object) -> str | None:
    """A NumPy dtype (or anything ``np.dtype`` takes) → MindSpore's string, or None."""
    try:
        return _BY_NUMPY.get(np.dtype(dtype))
    except TypeError:
        return None


def type_id_name(type_id: int) -> str | None:
    """A ``TypeId`` number → MindSpore's dtype string, or None for a non-number type."""
    return _TYPE_ID_NAMES.get(type_id)
