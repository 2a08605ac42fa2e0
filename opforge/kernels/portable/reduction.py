"""Reductions: sum, mean, prod, amax/amin, max/min along a dim, argmax/argmin, var/std,
any/all, logsumexp, vector norms.

Dimension lists follow ATen: ``None`` or an empty list reduces every dimension (for
``sum``, ``mean``, ``amax``, …). Integer and bool sums accumulate in int64 unless a dtype
is given; float16 accumulates in float32 (ATen's CPU opmath) and rounds once into ``out``.

Bound (see ``_binding``), float32/float64 sums and means reduce straight into ``out`` with
``np.add.reduce`` (what ``np.sum`` and ``np.mean`` call, without their Python layers);
any/all of bool tensors are ``np.logical_or.reduce`` / ``np.logical_and.reduce`` into out.
"""

from __future__ import annotations

import math

import numpy as np

from opforge.errors import KernelError
from opforge.kernels.portable._binding import prepares, separate, steps
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


def _extreme_dim(arg, api: str, self, dim, values, indices) -> None:
    # max.dim / min.dim: the value at np.argmax / np.argmin, so the first extreme wins ties
    # and the first NaN is the extreme, as in ATen.
    if self.ndim == 0:
        np.copyto(values, self, casting="unsafe")
        indices.fill(0)
        return
    axis = dim % self.ndim
    if self.shape[axis] == 0:
        raise KernelError(
            f"`{api}`: self — found shape {self.shape}, empty along dim {dim} — valid: a "
            "non-empty dim (a max or min of nothing is undefined, ATen refuses it too) — "
            "reduce over a non-empty dim"
        )
    index = np.expand_dims(arg(self, axis=axis), axis)
    np.copyto(values, np.take_along_axis(self, index, axis).reshape(values.shape),
              casting="unsafe")
    np.copyto(indices, index.reshape(indices.shape), casting="unsafe")


@kernel("aten::max.dim_max")
def max_dim_max(self, dim, keepdim, max, max_values):
    _extreme_dim(np.argmax, "aten::max.dim_max", self, dim, max, max_values)


@kernel("aten::min.dim_min")
def min_dim_min(self, dim, keepdim, min, min_indices):
    _extreme_dim(np.argmin, "aten::min.dim_min", self, dim, min, min_indices)


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


@kernel("aten::linalg_vector_norm.out")
def linalg_vector_norm_out(self, ord, dim, keepdim, dtype, out):
    # ord 2 is sqrt(sum x^2), 1 sum |x|, inf / -inf max / min |x|, 0 the count of non-zeros
    # (NaN counts), any other p (sum |x|^p)^(1/p). dtype casts the input first; float16
    # (and integers, which ATen refuses) compute in float32.
    x = self if dtype is None else self.astype(dtype, copy=False)
    ct = accumulate_dtype(x.dtype) if is_floating(x.dtype) else np.dtype(np.float32)
    x = x.astype(ct, copy=False)
    ax = axes(dim, x.ndim)
    p = float(ord)
    with np.errstate(all="ignore"):  # 0 ** negative p is inf, as in ATen
        if p == 2:
            norm = np.sqrt(np.sum(x * x, axis=ax))
        elif p == 1:
            norm = np.sum(np.abs(x), axis=ax)
        elif p in (np.inf, -np.inf):
            reduced = x.size if ax is None else int(np.prod([x.shape[a] for a in ax]))
            if reduced == 0 and out.size:
                raise KernelError(
                    "`aten::linalg_vector_norm.out`: self — the reduced dims are empty — "
                    "valid: a non-empty reduction for ord=inf/-inf (a max has no identity; "
                    "ATen refuses it too) — reduce over non-empty dims"
                )
            norm = (np.max if p > 0 else np.min)(np.abs(x), axis=ax) if out.size else out
        elif p == 0:
            norm = np.sum(x != 0, axis=ax, dtype=ct)
        else:
            norm = np.sum(np.abs(x) ** ct.type(p), axis=ax) ** ct.type(1.0 / p)
    _store(out, norm)


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
    if math.prod(reduced) != out.size:  # math.prod: ~3 us less per bind than np.prod
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
    if math.prod(reduced) != out.size:  # math.prod: ~3 us less per bind than np.prod
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


def _prepare_logical(binder, ufunc: np.ufunc, with_dim: bool):
    @prepares(binder)
    def prepare(bound):
        # the dtypes, the rank and the reduced axes hold at every size: only the shape of
        # out's view changes (the kept dims' sizes)
        if binder(bound)[0] != ufunc.reduce:  # (a bound method: equal, not the same)
            return None
        self, dim = bound[0], bound[1] if with_dim else None
        ax = axes(dim, self.ndim)
        kept = [i for i in range(self.ndim) if not (ax is None or i in ax)]

        def rebind(args):
            self, out = args[0], args[-1]
            if with_dim and args[1] != dim or not self.size:
                return None
            shape = self.shape
            reduced = tuple([shape[i] for i in kept])
            if math.prod(reduced) != out.size:
                return None
            return ufunc.reduce, (self, ax, None, out.reshape(reduced), False)

        return rebind


for _binder, _ufunc, _with_dim in ((_bind_all, np.logical_and, False),
                                   (_bind_any, np.logical_or, False),
                                   (_bind_all_dim, np.logical_and, True),
                                   (_bind_any_dim, np.logical_or, True)):
    _prepare_logical(_binder, _ufunc, _with_dim)
