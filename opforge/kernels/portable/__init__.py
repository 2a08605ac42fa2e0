"""The portable kernel library: ATen out variants written with NumPy only.

Calling convention (the runtime depends on exactly this): a kernel is called positionally
with the arguments of its out overload's schema, in schema order, the out tensors
included. Tensors are ``np.ndarray`` (out arrays are preallocated, C-contiguous, with the
final shape and dtype; inputs may be any strided view), ``Tensor?`` may be None, lists are
lists, ``int[]`` arrive as tuples, ``ScalarType?`` as a NumPy dtype or None, and layout,
device, memory-format and generator arguments as None. A kernel writes its results into
its out arrays in place and returns None, except a kernel whose result size depends on
its inputs' values (``selection``: ``nonzero``, ``masked_select``): it gets its out at the
planned upper bound and returns the view of the result it wrote.

Example::

    >>> import numpy as np
    >>> from opforge.kernels.portable import portable_kernels
    >>> kernels = portable_kernels()
    >>> out = np.empty(3, dtype=np.float32)
    >>> kernels["aten::add.out"](np.ones(3, np.float32), np.arange(3, dtype=np.float32), 2, out)
    >>> out.tolist()
    [1.0, 3.0, 5.0]

This package must never import torch (tests/pure/test_kernels_notorch.py proves it).
"""

from __future__ import annotations

from types import ModuleType

from opforge.errors import RegistrationError
from opforge.kernels.portable import (
    activation,
    arithmetic,
    comparison,
    convolution,
    experts,
    factory,
    indexing,
    linalg,
    normalization,
    pooling,
    quantized,
    reduction,
    resample,
    selection,
    shape,
    sorting,
    unary,
    view_copy,
)
from opforge.kernels.portable._registry import Kernel

__all__ = ["portable_kernels", "FAMILIES"]

# Every op-family module, listed explicitly: adding a family means adding it here.
FAMILIES: tuple[ModuleType, ...] = (
    arithmetic,
    comparison,
    unary,
    activation,
    reduction,
    normalization,
    linalg,
    convolution,
    pooling,
    resample,
    sorting,
    selection,
    view_copy,
    shape,
    indexing,
    experts,
    factory,
    quantized,
)


def portable_kernels() -> dict[str, Kernel]:
    """Every portable kernel, keyed ``"aten::op.overload"`` (a fresh dict each call).

    >>> "aten::convolution.out" in portable_kernels()
    True
    """
    merged: dict[str, Kernel] = {}
    owner: dict[str, str] = {}
    for family in FAMILIES:
        for key, fn in family.KERNELS.items():
            if key in merged:
                raise RegistrationError(
                    f"`portable_kernels()`: {key} — registered by both {owner[key]} and "
                    f"{family.__name__} — one portable kernel per out overload — "
                    "remove the key from one of the two modules"
                )
            merged[key] = fn
            owner[key] = family.__name__
    return merged
