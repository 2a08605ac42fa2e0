"""Zero-copy NumPy views of constant tensors."""

from __future__ import annotations

import numpy as np

from opforge.program._errors import program_error
from opforge.program.model import Program
from opforge.program.values import ConstantStorage, TensorValue

__all__ = ["constant_array"]


def constant_array(program: Program, tensor: TensorValue) -> np.ndarray:
    """A read-only NumPy view of a constant tensor's bytes (no copy; after ``load`` it reads
    the memory-mapped file). Honors ``dim_order``: the result has the logical sizes.

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
    if storage.offset + tensor.nbytes > segment.nbytes:
        raise program_error("`constant_array()`: tensor.storage",
                            f"bytes up to {storage.offset + tensor.nbytes}",
                            f"within segment {storage.segment} ({segment.nbytes} bytes)",
                            "verify the program first")
    flat = np.frombuffer(segment.data, dtype=tensor.dtype.numpy_dtype(), count=tensor.numel,
                         offset=storage.offset)
    physical = flat.reshape([tensor.sizes[d] for d in tensor.dim_order])
    inverse = np.argsort(tensor.dim_order)
    return physical.transpose(inverse) if len(tensor.sizes) else physical
