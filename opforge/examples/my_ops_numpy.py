"""NumPy kernels for the bundled example operators (``my_ops.yaml``), for the lean runtime.

Each follows the portable calling convention (``opforge.kernels.portable``): the out
overload's arguments in schema order, outs included, written in place. The references in
``opforge.examples.my_ops`` (torch) define the semantics; these must match them. Native
C++ versions of the same ops come from a compiled library and may override these.

>>> import numpy as np
>>> from opforge.runtime import KernelRegistry
>>> registry = KernelRegistry.portable()
>>> register_example_kernels(registry)
>>> out = np.empty(2, np.float32)
>>> registry.lookup("my_ops::mul3.out").fn(np.array([1, 2], np.float32), out)
>>> out.tolist()
[3.0, 6.0]
"""

from __future__ import annotations

import numpy as np

__all__ = ["EXAMPLE_KERNELS", "register_example_kernels"]


def mul3_out(input: np.ndarray, output: np.ndarray) -> None:
    np.multiply(input, 3, out=output, casting="unsafe")


def mul4_out(input: np.ndarray, output: np.ndarray) -> None:
    np.multiply(input, 4, out=output, casting="unsafe")


def minmax_out(input: np.ndarray, dim: int, min: np.ndarray, max: np.ndarray) -> None:
    np.amin(input, axis=dim, out=min)
    np.amax(input, axis=dim, out=max)


def scaled_sum_out(input: np.ndarray, scale, dims: tuple[int, ...], keepdim: bool,
                   out: np.ndarray) -> None:
    axes = tuple(dims) if dims else None  # the reference: an empty dims sums everything
    np.sum(input, axis=axes, keepdims=keepdim, dtype=out.dtype, out=out)
    np.multiply(out, scale, out=out, casting="unsafe")


EXAMPLE_KERNELS = {
    "my_ops::mul3.out": mul3_out,
    "my_ops::mul4.out": mul4_out,
    "my_ops::minmax.out": minmax_out,
    "my_ops::scaled_sum.out": scaled_sum_out,
}


def register_example_kernels(registry, *, override: bool = False) -> None:
    """Register the four example kernels into ``registry`` (target ``"portable"``)."""
    for key, fn in EXAMPLE_KERNELS.items():
        registry.register(key, fn, origin=f"{__name__}.{fn.__name__}", target="portable",
                          override=override)
