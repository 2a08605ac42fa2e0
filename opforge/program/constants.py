"""NumPy views of constant tensors (zero-copy, except int4-packed ones, which are unpacked)."""

from __future__ import annotations

import numpy as np

from opforge.program._errors import program_error
from opforge.program.model import Program
from opforge.program.values import PACKING_INT4, PACKING_SPLAT, ConstantStorage, TensorValue

__all__ = ["constant_array", "pack_int4", "unpack_int4"]


def pack_int4(values: np.ndarray) -> np.ndarray:
    """int8 values in [-8, 7] → ``ceil(n / 2)`` bytes, two per byte, low nibble first.

    >>> pack_int4(np.array([1, -1, 7], np.int8)).tolist()
    [241, 7]
    """
    flat = np.ascontiguousarray(values, dtype=np.int8).reshape(-1)
    if flat.size and (flat.min() < -8 or flat.max() > 7):
        raise program_error("`pack_int4()`: values", f"range [{flat.min()}, {flat.max()}]",
                            "[-8, 7]", "pack only 4-bit values")
    nibbles = (flat.astype(np.uint8) & 0x0F)
    if nibbles.size % 2:
        nibbles = np.append(nibbles, np.uint8(0))
    return (nibbles[0::2] | (nibbles[1::2] << 4)).astype(np.uint8)


def unpack_int4(packed: np.ndarray, count: int) -> np.ndarray:
    """The inverse of :func:`pack_int4`: ``count`` int8 values (a new read-only array)."""
    signed = packed.view(np.int8)
    low = np.left_shift(signed, 4) >> 4  # arithmetic shift sign-extends the low nibble
    high = signed >> 4
    out = np.empty(2 * packed.size, dtype=np.int8)
    out[0::2], out[1::2] = low, high
    out = out[:count]
    out.flags.writeable = False
    return out


def constant_array(program: Program, tensor: TensorValue) -> np.ndarray:
    """A read-only NumPy view of a constant tensor's bytes (no copy; after ``load`` it reads
    the memory-mapped file). Honors ``dim_order``: the result has the logical sizes. A splat
    constant is its one element broadcast to the sizes (zero strides: read-only, no bytes).

    >>> import numpy as np
    >>> from opforge.program import (Program, Segment, TensorValue, ConstantStorage,
    ...                              ScalarType)
    >>> p = Program(methods=(), segments=(Segment(np.arange(6, dtype=np.float32)),))
    >>> t = TensorValue(ScalarType.FLOAT32, (2, 3), storage=ConstantStorage(0, 0))
    >>> constant_array(p, t)[1].tolist()
    [3.0, 4.0, 5.0]
    """
    storage = tensor.storage
    if type(storage) is not ConstantStorage:
        raise program_error(
            "`constant_array()`: tensor.storage", type(storage).__name__, "ConstantStorage",
            "only constants have bytes in the program; arena tensors exist at run time")
    if not 0 <= storage.segment < len(program.segments):
        raise program_error("`constant_array()`: tensor.storage.segment", str(storage.segment),
                            f"0..{len(program.segments) - 1}", "verify the program first")
    segment = program.segments[storage.segment]
    if storage.offset + tensor.stored_nbytes > segment.nbytes:
        raise program_error("`constant_array()`: tensor.storage",
                            f"bytes up to {storage.offset + tensor.stored_nbytes}",
                            f"within segment {storage.segment} ({segment.nbytes} bytes)",
                            "verify the program first")
    if storage.packing == PACKING_SPLAT:
        one = np.frombuffer(segment.data, dtype=tensor.dtype.numpy_dtype(), count=1,
                            offset=storage.offset)
        return np.broadcast_to(one.reshape(()), tensor.sizes)
    if storage.packing == PACKING_INT4:
        flat = unpack_int4(np.frombuffer(segment.data, dtype=np.uint8,
                                         count=tensor.stored_nbytes, offset=storage.offset),
                           tensor.numel)
    else:
        flat = np.frombuffer(segment.data, dtype=tensor.dtype.numpy_dtype(), count=tensor.numel,
                             offset=storage.offset)
    physical = flat.reshape([tensor.sizes[d] for d in tensor.dim_order])
    inverse = np.argsort(tensor.dim_order)
    return physical.transpose(inverse) if len(tensor.sizes) else physical
