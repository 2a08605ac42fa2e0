"""ATen type promotion, restated for NumPy dtypes.

NumPy's own promotion differs from ATen's (``int32 + float32`` is ``float64`` in NumPy,
``float32`` in ATen; a Python float never widens a ``float16`` tensor in ATen), so the
portable kernels decide their compute dtype here and pass it to the ufunc explicitly.

ATen ranks operands in three tiers — tensors with dimensions, zero-dim tensors, and
wrapped Python scalars — and a lower tier only changes the result when it belongs to a
higher *category* (bool < integer < floating) than every tier above it. A Python float
enters as the default dtype (float32), a Python int as int64.
"""

from __future__ import annotations

from typing import Union

import numpy as np

__all__ = [
    "Operand",
    "promote_types",
    "result_type",
    "float_compute_dtype",
    "accumulate_dtype",
    "is_floating",
]

Operand = Union[np.ndarray, bool, int, float, None]

DEFAULT_FLOAT = np.dtype(np.float32)
_BOOL = np.dtype(np.bool_)


def _category(dtype: np.dtype) -> int:
    if dtype == _BOOL:
        return 0
    return 2 if dtype.kind in "fc" else 1


def is_floating(dtype: np.dtype) -> bool:
    return np.dtype(dtype).kind in "fc"


def promote_types(a: np.dtype | None, b: np.dtype | None) -> np.dtype | None:
    """``torch.promote_types`` for bool, integer and floating dtypes (None = undefined)."""
    if a is None:
        return b
    if b is None:
        return a
    ca, cb = _category(a), _category(b)
    if ca != cb:
        return a if ca > cb else b
    # Same category: NumPy agrees with ATen here (int8+uint8 -> int16, f16+f32 -> f32).
    return np.promote_types(a, b)


def _combine(higher: np.dtype | None, lower: np.dtype | None) -> np.dtype | None:
    if higher is None:
        return lower
    if lower is None:
        return higher
    if is_floating(higher):
        return higher
    if higher == _BOOL or _category(lower) > _category(higher):
        return promote_types(higher, lower)
    return higher


def _scalar_dtype(value: bool | int | float | np.generic) -> np.dtype:
    if isinstance(value, (bool, np.bool_)):
        return _BOOL
    if isinstance(value, (int, np.integer)):
        return np.dtype(np.int64)
    return DEFAULT_FLOAT


def result_type(*operands: Operand) -> np.dtype:
    """The dtype ATen computes a pointwise op in (``torch.result_type``); None is skipped."""
    dim = zero = wrapped = None
    for op in operands:
        if op is None:
            continue
        if isinstance(op, np.ndarray):
            if op.ndim:
                dim = promote_types(dim, op.dtype)
            else:
                zero = promote_types(zero, op.dtype)
        else:
            wrapped = promote_types(wrapped, _scalar_dtype(op))
    result = _combine(dim, _combine(zero, wrapped))
    if result is None:
        raise TypeError("result_type() needs at least one operand")
    return np.dtype(result)


def float_compute_dtype(dtype: np.dtype) -> np.dtype:
    """Integer and bool inputs of a floating op compute in the default float dtype."""
    return np.dtype(dtype) if is_floating(dtype) else DEFAULT_FLOAT


def accumulate_dtype(dtype: np.dtype) -> np.dtype:
    """ATen accumulates float16 in float32 (its "opmath" type) on CPU."""
    return np.dtype(np.float32) if np.dtype(dtype) == np.float16 else np.dtype(dtype)
