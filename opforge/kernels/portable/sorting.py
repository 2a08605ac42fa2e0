"""Sorting and scans: sort, topk, cumsum, cumprod.

Order, as in ATen: NaN is greater than every number (last ascending, first descending),
-0.0 equals 0.0, and every sort here is stable — equal elements keep their input order,
descending too — so ``sort.values`` (where ATen promises no order among equals) gives the
answer its stable overload gives. A descending sort is the stable ascending sort of the
reversed tensor, read backwards: NumPy's stable sort already puts NaN last.

``topk`` returns its k elements sorted whatever ``sorted`` says (ATen allows any order
when it is False); among equal values its indices may differ from ATen's, which picks
them by a partial sort. For a small k of a long row it partitions first
(``np.argpartition``, which also puts NaN last), then sorts only the k.

The scans write each prefix after accumulating, as ATen's CPU kernel does, in ATen's CPU
accumulate type: float32 in float64, float16 in float32, integers in int64 (an integer or
bool input with no dtype gives int64, like ``torch.cumsum``). The input is cast to out's
dtype first (``dtype=`` casts before it scans).
"""

from __future__ import annotations

import numpy as np

from opforge.errors import KernelError
from opforge.kernels.portable._registry import Kernel, kernel_decorator

__all__ = ["KERNELS", "stable_argsort"]

KERNELS: dict[str, Kernel] = {}
kernel = kernel_decorator(KERNELS)


def stable_argsort(x: np.ndarray, axis: int, descending: bool) -> np.ndarray:
    """Indices sorting ``x`` along ``axis`` in ATen's order (NaN greatest, stable)."""
    if not descending:
        return np.argsort(x, axis=axis, kind="stable")
    n = x.shape[axis]
    order = np.argsort(np.flip(x, axis), axis=axis, kind="stable")
    return np.flip((n - 1) - order, axis)


def _sort(self, dim, descending, values, indices) -> None:
    if self.ndim == 0:
        np.copyto(values, self, casting="unsafe")
        indices.fill(0)
        return
    axis = dim % self.ndim
    order = stable_argsort(self, axis, descending)
    np.copyto(values, np.take_along_axis(self, order, axis), casting="unsafe")
    np.copyto(indices, order, casting="unsafe")


@kernel("aten::sort.values")
def sort_values(self, dim, descending, values, indices):
    _sort(self, dim, descending, values, indices)


@kernel("aten::sort.values_stable")
def sort_values_stable(self, stable, dim, descending, values, indices):
    _sort(self, dim, descending, values, indices)


# Below this many elements a full sort costs no more than a partition and a sort.
_PARTITION_MIN = 256


def _topk_order(x: np.ndarray, k: int, axis: int, largest: bool) -> np.ndarray:
    n = x.shape[axis]
    if n < _PARTITION_MIN or 8 * k > n:
        return np.take(stable_argsort(x, axis, largest), np.arange(k), axis=axis)
    # The k smallest sit in [0, k) after partitioning at k - 1, the k largest in [n - k, n).
    kth = n - k if largest else k - 1
    part = np.argpartition(x, kth, axis=axis)
    chosen = np.take(part, np.arange(n - k, n) if largest else np.arange(k), axis=axis)
    # Sort the k, keeping equal values in index order like the full stable sort.
    chosen = np.sort(chosen, axis=axis)
    order = stable_argsort(np.take_along_axis(x, chosen, axis), axis, largest)
    return np.take_along_axis(chosen, order, axis)


@kernel("aten::topk.values")
def topk_values(self, k, dim, largest, sorted, values, indices):
    size = self.shape[dim % self.ndim] if self.ndim else 1
    if not 0 <= k <= size:
        raise KernelError(
            f"`aten::topk.values`: k — found {k} — valid: 0 <= k <= {size}, the size of "
            f"dim {dim} — check k against the input's shape"
        )
    if self.ndim == 0:
        if k:
            np.copyto(values, self, casting="unsafe")
            indices.fill(0)
        return
    if values.size == 0:
        return
    axis = dim % self.ndim
    order = _topk_order(self, k, axis, largest)
    np.copyto(values, np.take_along_axis(self, order, axis), casting="unsafe")
    np.copyto(indices, order, casting="unsafe")


def _accumulate(dtype: np.dtype) -> np.dtype:
    """ATen's CPU ``acc_type``: float16 -> float32, float32 -> float64, ints -> int64."""
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return np.dtype(np.float32) if dtype.itemsize < 4 else np.dtype(np.float64)
    if dtype.kind in "iu":
        return np.dtype(np.int64)
    return dtype


def _scan(ufunc: np.ufunc, self, dim, out) -> None:
    if self.ndim == 0:
        np.copyto(out, self, casting="unsafe")
        return
    if out.size == 0:
        return
    x = self if self.dtype == out.dtype else self.astype(out.dtype)
    with np.errstate(over="ignore", invalid="ignore"):  # inf and nan as in ATen
        scanned = ufunc.accumulate(x, axis=dim % self.ndim, dtype=_accumulate(out.dtype))
    np.copyto(out, scanned, casting="unsafe")


@kernel("aten::cumsum.out")
def cumsum_out(self, dim, dtype, out):
    _scan(np.add, self, dim, out)


@kernel("aten::cumprod.out")
def cumprod_out(self, dim, dtype, out):
    _scan(np.multiply, self, dim, out)
