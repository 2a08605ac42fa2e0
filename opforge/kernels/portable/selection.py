"""Selection with a data-dependent result size: ``nonzero`` and ``masked_select``.

Their out's leading size is a symbol the kernel produces at run time
(``opforge/program/produced.py``): the runtime passes the out at its upper bound (the
slot the program planned), the kernel writes its result densely from the start of that
slot and returns the result's view (its actual sizes), from which the runtime binds the
symbol. A result larger than the slot is refused before anything is written, naming the
bound and how to raise it.
"""

from __future__ import annotations

import numpy as np

from opforge.errors import KernelError
from opforge.kernels.portable._registry import Kernel, kernel_decorator

__all__ = ["KERNELS"]

KERNELS: dict[str, Kernel] = {}
kernel = kernel_decorator(KERNELS)


def _result(api: str, out: np.ndarray, count: int) -> np.ndarray:
    """The first ``count`` rows of ``out``'s slot as the result's view, or KernelError."""
    capacity = out.shape[0] if out.ndim else 0
    if count > capacity:
        raise KernelError(
            f"`{api}`: result size — found {count} — valid: at most {capacity}, the upper "
            "bound the program's memory was planned at — fix: re-export with a larger bound "
            "(torch._check(n <= K) where the size is made, or a larger input)")
    flat = out.reshape(-1)  # the out's slot, contiguous
    return flat[:count * int(np.prod(out.shape[1:], dtype=np.int64))].reshape(
        (count, *out.shape[1:]))


@kernel("aten::nonzero.out")
def nonzero_out(self, out):
    positions = np.nonzero(np.asarray(self)) if self.ndim else np.nonzero(np.atleast_1d(self))[:0]
    count = len(positions[0]) if self.ndim else int(bool(self))
    result = _result("aten::nonzero.out", out, count)
    for d, p in enumerate(positions):
        result[:, d] = p
    return result


@kernel("aten::masked_select.out")
def masked_select_out(self, mask, out):
    values, mask = np.broadcast_arrays(self, mask.astype(bool, copy=False))
    result = _result("aten::masked_select.out", out, int(np.count_nonzero(mask)))
    np.copyto(result, values[mask], casting="unsafe")
    return result
