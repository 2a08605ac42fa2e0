"""Reductions: sum, mean, prod, amax/amin, argmax/argmin, var/std, any/all, logsumexp.

Dimension lists follow ATen: ``None`` or an empty list reduces every dimension (for
``sum``, ``mean``, ``amax``, …). Integer and bool sums accumulate in int64 unless a dtype
is given; float16 accumulates in float32 (ATen's CPU opmath) and rounds once into ``out``.

Bound (see ``_binding``), float32/float64 sums and means reduce straight into ``out`` with
``np.add.reduce`` (what ``np.sum`` and ``np.mean`` call, without their Python layers);
any/all of bool tensors are ``np.logical_or.reduce`` / ``np.logical_and.reduce`` into out.
"""

from __future__ import annotations

import numpy as np

from opforge.kernels.portable._binding import separate, steps
from opforge.kernels.portable._promotion import accumulate_dtype, is_floating
from opforge.kernels.portable._registry import Kernel, binder_for, kernel_decorator

__all__ = ["KERNELS"]

KERNELS: dict[str, Kernel] = {}
kernel = kernel_decorator(KERNELS)


def axes(dim, ndim: int) -> tuple[int, ...] | None:
    """ATen's ``int[1]? dim`` as NumPy axes: None / [] mean all; negatives wrap."""
    if dim is None:
        return None
    if isinstance(dim, int):
        dim = (dim,)
    if len(dim) == 0:
        return None
    return tuple(d % max(ndim, 1) for d in dim) if ndim else None


def _store(out: np.ndarray, value) -> None:
    np.copyto(out, np.reshape(value, out.shape), casting="unsafe")


def _sum_dtype(x: np.ndarray, dtype: np.dtype | None) -> np.dtype:
    if dtype is not None:
        return accumulate_dtype(dtype)
    if not is_floating(x.dtype):
        return np.dtype(np.int64)
    return accumulate_dtype(x.dtype)


@kernel("aten::sum.IntList_out")
def sum_dim_out(self, dim, keepdim, dtype, out):
    _store(out, np.sum(self, axis=axes(dim, self.ndim), dtype=_sum_dtype(self, dtype)))


@kernel("aten::sum.out")
def sum_out(self, dtype, out):
    _store(out, np.sum(self, dtype=_sum_dtype(self, dtype)))


@kernel("aten::mean.out")
def mean_dim_out(self, dim, keepdim, dtype, out):
    ct = accumulate_dtype(dtype if dtype is not None else out.dtype)
    _store(out, np.mean(self, axis=axes(dim, self.ndim), dtype=ct))


@kernel("aten::mean.dtype_out")
def mean_out(self, dtype, out):
    mean_dim_out(self, None, False, dtype, out)


@kernel("aten::prod.int_out")
def prod_dim_out(self, dim, keepdim, dtype, out):
    _store(out, np.prod(self, axis=dim % max(self.ndim, 1) if self.ndim else None,
                        dtype=_sum_dtype(self, dtype)))


@kernel("aten::prod.out")
def prod_out(self, dtype, out):
    _store(out, np.prod(self, dtype=_sum_dtype(self, dtype)))


@kernel("aten::amax.out")
def amax_out(self, dim, keepdim, out):
    _store(out, np.max(self, axis=axes(dim, self.ndim)))  # NaN propagates, as in ATen


@kernel("aten::amin.out")
def amin_out(self, dim, keepdim, out):
    _store(out, np.min(self, axis=axes(dim, self.ndim)))


@kernel("aten::max.unary_out")
def max_unary_out(self, out):
    _store(out, np.max(self))


@kernel("aten::min.unary_out")
def min_unary_out(self, out):
    _store(out, np.min(self))


def _arg_reduce(fn, self: np.ndarray, dim: int | None, out: np.ndarray) -> None:
    # ATen and NumPy agree: the first extreme wins ties, and the first NaN is the extreme.
    if dim is None or self.ndim == 0:
        _store(out, fn(self))
    else:
        _store(out, fn(self, axis=dim % self.ndim))


@kernel("aten::argmax.out")
def argmax_out(self, dim, keepdim, out):
    _arg_reduce(np.argmax, self, dim, out)


@kernel("aten::argmin.out")
def argmin_out(self, dim, keepdim, out):
    _arg_reduce(np.argmin, self, dim, out)


def _ddof(correction) -> float:
    return 1.0 if correction is None else float(correction)


@kernel("aten::var.correction_out")
def var_correction_out(self, dim, correction, keepdim, out):
    # N - correction <= 0 gives inf or nan in ATen and NumPy alike (warnings silenced).
    with np.errstate(all="ignore"):
        _store(out, np.var(self, axis=axes(dim, self.ndim), ddof=_ddof(correction),
                           dtype=accumulate_dtype(out.dtype)))


@kernel("aten::var.out")
def var_out(self, dim, unbiased, keepdim, out):
    var_correction_out(self, dim, 1 if unbiased else 0, keepdim, out)


@kernel("aten::std.correction_out")
def std_correction_out(self, dim, correction, keepdim, out):
    with np.errstate(all="ignore"):
        _store(out, np.std(self, axis=axes(dim, self.ndim), ddof=_ddof(correction),
                           dtype=accumulate_dtype(out.dtype)))


@kernel("aten::var_mean.correction_out")
def var_mean_correction_out(self, dim, correction, keepdim, out0, out1):
    var_correction_out(self, dim, correction, keepdim, out0)
    mean_dim_out(self, dim, keepdim, None, out1)


@kernel("aten::any.out", "aten::any.dims_out")
def any_dim_out(self, dim, keepdim, out):
    _store(out, np.any(self, axis=axes(dim, self.ndim)))


@kernel("aten::any.all_out")
def any_out(self, out):
    _store(out, np.any(self))


@kernel("aten::all.out", "aten::all.dims_out")
def all_dim_out(self, dim, keepdim, out):
    _store(out, np.all(self, axis=axes(dim, self.ndim)))


@kernel("aten::all.all_out")
def all_out(self, out):
    _store(out, np.all(self))


@kernel("aten::logsumexp.out")
def logsumexp_out(self, dim, keepdim, out):
    ax = axes(dim, self.ndim)
    x = self.astype(accumulate_dtype(out.dtype) if is_floating(out.dtype) else np.float32,
                    copy=False)
    peak = np.max(x, axis=ax, keepdims=True) if x.size else np.zeros((1,) * x.ndim, x.dtype)
    peak = np.where(np.isfinite(peak), peak, 0)  # all -inf rows give -inf, inf rows inf
    with np.errstate(divide="ignore"):
        total = np.log(np.sum(np.exp(x - peak), axis=ax, keepdims=True)) + peak
    _store(out, total)


# --- bind-time fast paths -------------------------------------------------------------------

def _bind_sum(self, dim, dtype, out, mean: bool):
    """``add.reduce`` into ``out`` viewed with the reduced shape; None if not applicable."""
    if self.dtype not in (np.float32, np.float64) or out.dtype != self.dtype or \
            (dtype is not None and np.dtype(dtype) != self.dtype) or self.size == 0 or \
            not separate([out], self):
        return None
    ax = axes(dim, self.ndim)
    reduced = tuple(n for i, n in enumerate(self.shape)
                    if not (ax is None or i in ax))
    if int(np.prod(reduced)) != out.size:
        return None
    target = out.reshape(reduced)
    pairs = [(np.add.reduce, (self, ax, None, target, False))]
    if mean:
        count = self.size // max(out.size, 1)
        pairs.append((np.divide, (target, np.asarray(count, self.dtype), target)))
    return steps(pairs)


@binder_for(mean_dim_out)
def _bind_mean(args):
    self, dim, _keepdim, dtype, out = args
    return _bind_sum(self, dim, dtype, out, mean=True) or (mean_dim_out, args)


@binder_for(sum_dim_out)
def _bind_sum_dim(args):
    self, dim, _keepdim, dtype, out = args
    return _bind_sum(self, dim, dtype, out, mean=False) or (sum_dim_out, args)


def _bind_logical(ufunc: np.ufunc, self, dim, out):
    if self.dtype != np.bool_ or out.dtype != np.bool_ or self.size == 0:
        return None
    ax = axes(dim, self.ndim)
    reduced = tuple(n for i, n in enumerate(self.shape) if not (ax is None or i in ax))
    if int(np.prod(reduced)) != out.size:
        return None
    return ufunc.reduce, (self, ax, None, out.reshape(reduced), False)


@binder_for(any_dim_out)
def _bind_any_dim(args):
    self, dim, _keepdim, out = args
    return _bind_logical(np.logical_or, self, dim, out) or (any_dim_out, args)


@binder_for(any_out)
def _bind_any(args):
    self, out = args
    return _bind_logical(np.logical_or, self, None, out) or (any_out, args)


@binder_for(all_dim_out)
def _bind_all_dim(args):
    self, dim, _keepdim, out = args
    return _bind_logical(np.logical_and, self, dim, out) or (all_dim_out, args)


@binder_for(all_out)
def _bind_all(args):
    self, out = args
    return _bind_logical(np.logical_and, self, None, out) or (all_out, args)
