"""Softmax, log-softmax and the normalisations: layer norm, batch norm (inference, and with
batch statistics as instance norm exports it), group norm.

Statistics are computed in float32 for float16 inputs (ATen's CPU opmath), in the input's
dtype otherwise, and variances are the biased (population) variance, as in ATen.

Bound (see ``_binding``), float32/float64 ops become fixed lists of ufunc and ufunc-reduce
steps writing into the outs and scratch buffers allocated at bind — the same operations in
the same order as the general kernels (``np.mean``'s division may round differently in
the last ulp). Inference batch norm with
constant statistics folds them at bind into a per-channel ``x * scale + shift``.
"""

from __future__ import annotations

import math

import numpy as np

from opforge.errors import KernelError
from opforge.kernels.portable._binding import prepares, read_only, separate, steps
from opforge.kernels.portable._promotion import accumulate_dtype
from opforge.kernels.portable._registry import Kernel, binder_for, kernel_decorator

__all__ = ["KERNELS"]

KERNELS: dict[str, Kernel] = {}
kernel = kernel_decorator(KERNELS)


def _shifted(self: np.ndarray, dim: int, out: np.ndarray) -> tuple[np.ndarray, int]:
    x = self.astype(accumulate_dtype(out.dtype), copy=False)
    axis = dim % x.ndim if x.ndim else None
    if x.size == 0:
        return x, axis
    # A row that is all -inf gives nan (-inf - -inf), exactly as ATen does.
    return x - np.max(x, axis=axis, keepdims=True), axis


@kernel("aten::_softmax.out")
def softmax_out(self, dim, half_to_float, out):
    z, axis = _shifted(self, dim, out)
    e = np.exp(z)
    e /= np.sum(e, axis=axis, keepdims=True)
    np.copyto(out, e, casting="unsafe")


@kernel("aten::_log_softmax.out")
def log_softmax_out(self, dim, half_to_float, out):
    z, axis = _shifted(self, dim, out)
    with np.errstate(divide="ignore"):
        z = z - np.log(np.sum(np.exp(z), axis=axis, keepdims=True))
    np.copyto(out, z, casting="unsafe")


@kernel("aten::native_layer_norm.out")
def native_layer_norm_out(input, normalized_shape, weight, bias, eps, out0, out1, out2):
    # mean and rstd keep the leading dims and have size 1 in the normalised ones.
    x = input.astype(accumulate_dtype(input.dtype), copy=False)
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    mean = np.mean(x, axis=axes, keepdims=True)
    centered = x - mean
    var = np.mean(centered * centered, axis=axes, keepdims=True)
    rstd = 1.0 / np.sqrt(var + eps)
    y = centered * rstd
    if weight is not None:
        y *= weight
    if bias is not None:
        y += bias
    np.copyto(out0, y, casting="unsafe")
    np.copyto(out1, mean.reshape(out1.shape), casting="unsafe")
    np.copyto(out2, rstd.reshape(out2.shape), casting="unsafe")


def _per_channel(v: np.ndarray, ndim: int) -> np.ndarray:
    """A (C,) vector shaped to broadcast against (N, C, *spatial)."""
    return v.reshape((1, -1) + (1,) * (ndim - 2))


@kernel("aten::_native_batch_norm_legit_no_training.out")
def batch_norm_no_training_out(input, weight, bias, running_mean, running_var, momentum,
                               eps, out0, out1, out2):
    # Inference: normalise with the running statistics. out1/out2 (the saved mean and
    # invstd of training) are empty (shape (0,)) in ATen and are left untouched.
    scale, shift = _inference_affine(input, weight, bias, running_mean, running_var, eps)
    y = input * scale
    y += shift
    np.copyto(out0, y, casting="unsafe")


def _inference_affine(input, weight, bias, running_mean, running_var, eps):
    """Batch norm with running statistics as ``input * scale + shift``: the two
    per-channel arrays, shaped to broadcast against ``input`` (channels on axis 1)."""
    ct = accumulate_dtype(input.dtype)
    scale = 1.0 / np.sqrt(running_var.astype(ct) + ct.type(eps))
    if weight is not None:
        scale = scale * weight
    shift = -running_mean.astype(ct) * scale
    if bias is not None:
        shift = shift + bias
    return (_per_channel(scale.astype(ct), input.ndim),
            _per_channel(shift.astype(ct), input.ndim))


@kernel("aten::_native_batch_norm_legit.no_stats_out")
def batch_norm_batch_stats_out(input, weight, bias, training, momentum, eps, out, save_mean,
                               save_invstd):
    # Normalise with this batch's own statistics (InstanceNorm exports to this, training
    # set, the input viewed as (1, N*C, *spatial)): per channel the mean and the biased
    # variance over N and the spatial dims. save_mean and save_invstd, shape (C,), get the
    # mean and 1/sqrt(var + eps), as in ATen.
    if not training:
        raise KernelError(
            "`aten::_native_batch_norm_legit.no_stats_out`: training=False — without running "
            "statistics there is nothing to normalise with (ATen refuses it too) — valid: "
            "training=True — export a model whose norms track running statistics"
        )
    ct = accumulate_dtype(input.dtype)
    x = input.astype(ct, copy=False)
    axes = (0,) + tuple(range(2, x.ndim))
    with np.errstate(all="ignore"):  # an empty batch gives NaN statistics, as in ATen
        mean = np.mean(x, axis=axes, keepdims=True)
        centered = x - mean
        var = np.mean(centered * centered, axis=axes, keepdims=True)
        invstd = 1.0 / np.sqrt(var + ct.type(eps))
    y = centered * invstd
    if weight is not None:
        y *= _per_channel(weight.astype(ct, copy=False), y.ndim)
    if bias is not None:
        y += _per_channel(bias.astype(ct, copy=False), y.ndim)
    np.copyto(out, y, casting="unsafe")
    np.copyto(save_mean, mean.reshape(save_mean.shape), casting="unsafe")
    np.copyto(save_invstd, invstd.reshape(save_invstd.shape), casting="unsafe")


@kernel("aten::native_group_norm.out")
def native_group_norm_out(input, weight, bias, N, C, HxW, group, eps, out0, out1, out2):
    # mean and rstd have shape (N, group).
    ct = accumulate_dtype(input.dtype)
    x = input.astype(ct, copy=False).reshape(N, group, C // group * HxW)  # N may be 0
    mean = np.mean(x, axis=2, keepdims=True)
    centered = x - mean
    var = np.mean(centered * centered, axis=2, keepdims=True)
    rstd = 1.0 / np.sqrt(var + eps)
    y = (centered * rstd).reshape((N, C) + input.shape[2:])
    if weight is not None:
        y *= _per_channel(weight, y.ndim)
    if bias is not None:
        y += _per_channel(bias, y.ndim)
    np.copyto(out0, y, casting="unsafe")
    np.copyto(out1, mean.reshape(out1.shape), casting="unsafe")
    np.copyto(out2, rstd.reshape(out2.shape), casting="unsafe")


# --- bind-time fast paths -------------------------------------------------------------------

def _floating_same(*arrays) -> bool:
    dtype = arrays[0].dtype
    return dtype in (np.float32, np.float64) and all(
        a is None or a.dtype == dtype for a in arrays)


# Ops of at most this many elements: their sums over trailing axes run as a matrix-vector
# product with ones (one BLAS call; NumPy's reduce pays per short row: 2-3 us -> 1 us for
# 32 rows of 64), and a layer norm's constant weight and bias are broadcast once to the
# input's shape (a same-shape multiply is ~2x faster than a broadcasting one).
_SMALL = 1 << 16


def _row_sum(a: np.ndarray, k: int, out: np.ndarray, ones: dict | None = None):
    """The step summing ``a`` over its last ``k`` axes into ``out`` (their keepdims shape)
    as ``a @ ones``, or None where that does not apply (large or non-contiguous).
    ``ones``: a prepared instruction's vectors of ones by length, made once (read only)."""
    if a.size > _SMALL or not (a.flags.c_contiguous and out.flags.c_contiguous):
        return None
    n = math.prod(a.shape[a.ndim - k:])
    if ones is None:
        vector = np.ones(n, a.dtype)
    else:
        vector = ones.get(n)
        if vector is None:
            vector = ones[n] = np.ones(n, a.dtype)
            vector.flags.writeable = False
    return np.matmul, (a.reshape(-1, n), vector, out.reshape(-1))


def _scratch(prepared: dict | None, name: str, shape: tuple[int, ...],
             dtype: np.dtype) -> np.ndarray:
    """A scratch array of ``shape``: a prefix of a prepared instruction's buffer ``name``
    (made once at the upper bound; one instance runs one shape at a time) where it is big
    enough, else a new one."""
    buffer = prepared.get(name) if prepared is not None else None
    n = math.prod(shape)
    if buffer is not None and n <= buffer.size:
        return buffer[:n].reshape(shape)
    return np.empty(shape, dtype)


def _row_max(a: np.ndarray, axis: int, out: np.ndarray, prepared: dict | None = None) -> list:
    """Steps taking ``a``'s maximum along ``axis`` into ``out`` (keepdims shape). Many short
    rows (attention scores) are first copied transposed, so the reduce runs down long
    contiguous columns: (8, 16, 16) 7.2 -> 3.5 us, (2, 4, 32, 32) 13.6 -> 7.1 us; from 64
    columns, or with few rows, NumPy's own reduce is faster."""
    n = a.shape[axis] if a.ndim else 1
    rows = a.size // max(n, 1)
    if axis == a.ndim - 1 and n <= 32 and rows >= 32 and a.size <= _SMALL and \
            a.flags.c_contiguous and out.flags.c_contiguous:
        columns = _scratch(prepared, "columns", (n, rows), a.dtype)
        return [(np.copyto, (columns, a.reshape(rows, n).T)),  # a view of a
                (np.maximum.reduce, (columns, 0, None, out.reshape(rows)))]
    return [(np.maximum.reduce, (a, axis, None, out, True))]


def _broadcast_copy(v: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """``v`` broadcast to ``shape`` into a new array (``broadcast_to(v, shape).copy()``
    without its Python-level checks: 0.8 instead of 2.4 us, paid per shape)."""
    full = np.empty(shape, v.dtype)
    np.copyto(full, v)
    return full


def _softmax_workspace(self, dim, out, prepared: dict | None = None):
    """``(axis, peak, total)`` for a bound (log-)softmax of ``self`` into ``out`` — the
    reduced axis and two row buffers — or None where the general kernel must run.
    ``prepared``: a prepared instruction's (``_prepare_softmax``), whose dtypes and memory
    were checked at the upper bound, with its row buffers at the upper bound."""
    if self.size == 0 or self.ndim == 0 or prepared is None and (
            not _floating_same(self, out) or not separate([out], self)):
        return None
    axis = dim % self.ndim
    keep = self.shape[:axis] + (1,) + self.shape[axis + 1:]
    return (axis, _scratch(prepared, "peak", keep, self.dtype),
            _scratch(prepared, "total", keep, self.dtype))


def _softmax(args, prepared: dict | None = None):
    self, dim, _half_to_float, out = args
    workspace = _softmax_workspace(self, dim, out, prepared)
    if workspace is None:
        return softmax_out, args
    axis, peak, total = workspace
    add = (np.add.reduce, (out, axis, None, total, True))
    return steps(_row_max(self, axis, peak, prepared) + [
        (np.subtract, (self, peak, out)), (np.exp, (out, out)),
        (_row_sum(out, 1, total, prepared and prepared["ones"])
         if axis == self.ndim - 1 else None) or add,
        (np.divide, (out, total, out)),
    ])


@binder_for(softmax_out)
def _bind_softmax(args):
    return _softmax(args)


@prepares(_bind_softmax)
def _prepare_softmax(bound):
    workspace = _softmax_workspace(*bound[:2], bound[3])
    if workspace is None:
        return None
    self, (_, peak, _) = bound[0], workspace
    prepared = {"peak": peak.reshape(-1), "total": np.empty(peak.size, self.dtype),
                "columns": np.empty(self.size, self.dtype), "ones": {}}
    return lambda args: _softmax(args, prepared)


@binder_for(log_softmax_out)
def _bind_log_softmax(args):
    self, dim, _half_to_float, out = args
    workspace = _softmax_workspace(self, dim, out)
    if workspace is None:
        return log_softmax_out, args
    axis, peak, total = workspace
    e = np.empty(self.shape, self.dtype)
    return steps([
        (np.maximum.reduce, (self, axis, None, peak, True)),
        (np.subtract, (self, peak, out)), (np.exp, (out, e)),
        (np.add.reduce, (e, axis, None, total, True)), (np.log, (total, total)),
        (np.subtract, (out, total, out)),
    ])


def _layer_norm_fast(args) -> bool:
    """Do the bound steps apply, as far as dtypes and memory go (sizes: ``_layer_norm``)?"""
    input, normalized_shape, weight, bias, _eps, out0, out1, out2 = args
    return _floating_same(input, weight, bias, out0, out1, out2) and \
        len(normalized_shape) > 0 and separate([out0, out1, out2], input, weight, bias)


def _layer_norm(args, prepared: dict | None = None):
    """The bound steps at these arguments' sizes, or None where the sizes do not fit.
    ``prepared`` (a prepared instruction's, ``_prepare_layer_norm``): ones vectors, 0-d
    constants, a scratch buffer at the upper bound, and the constant weight and bias
    broadcast once at the upper bound; each shape takes prefixes of them."""
    input, normalized_shape, weight, bias, eps, out0, out1, out2 = args
    k = len(normalized_shape)
    size = input.size
    if size == 0:
        return None
    ct = input.dtype
    ndim = input.ndim
    keep = input.shape[:ndim - k] + (1,) * k
    if out1.size != math.prod(keep) or out2.size != out1.size:
        return None
    mean, rstd = out1.reshape(keep), out2.reshape(keep)  # views: out1/out2 are contiguous
    n = size // out1.size if out1.size else 0
    if prepared is None:
        ones = None
        count, eps_, one = np.asarray(n, ct), np.asarray(eps, ct), np.asarray(1.0, ct)
        squares = np.empty(input.shape, ct)
    else:
        ones = prepared["ones"]
        count = prepared["count"].get(n)
        if count is None:
            count = prepared["count"][n] = np.asarray(n, ct)
        eps_, one = prepared["eps"] if eps == prepared["eps_value"] else np.asarray(eps, ct), \
            prepared["one"]
        scratch = prepared["squares"]
        squares = scratch[:size].reshape(input.shape) if size <= scratch.size else \
            np.empty(input.shape, ct)
    if size <= _SMALL:  # constants: broadcast once, see _SMALL
        if weight is not None and read_only(weight):
            weight = _broadcast(weight, input.shape, prepared)
        if bias is not None and read_only(bias):
            bias = _broadcast(bias, input.shape, prepared)
    axes = tuple(range(ndim - k, ndim))
    return _norm_steps(
        input, out0, mean, rstd, squares, count, eps_, one, weight, bias,
        _row_sum(input, k, mean, ones) or (np.add.reduce, (input, axes, None, mean, True)),
        _row_sum(squares, k, rstd, ones) or (np.add.reduce, (squares, axes, None, rstd, True)))


def _norm_steps(input, out0, mean, rstd, squares, count, eps, one, weight, bias, sum_input,
                sum_squares):
    """A layer norm's steps into ``out0`` (and ``mean``, ``rstd``: keepdims views), given
    the steps summing ``input`` into ``mean`` and ``squares`` into ``rstd``; ``count``,
    ``eps`` and ``one`` 0-d arrays, ``weight`` and ``bias`` arrays of input's shape (or
    broadcastable to it) or None."""
    pairs = [
        sum_input,
        (np.divide, (mean, count, mean)),
        (np.subtract, (input, mean, out0)),
        (np.multiply, (out0, out0, squares)),
        sum_squares,
        (np.divide, (rstd, count, rstd)),
        (np.add, (rstd, eps, rstd)), (np.sqrt, (rstd, rstd)),
        (np.divide, (one, rstd, rstd)),
        (np.multiply, (out0, rstd, out0)),
    ]
    if weight is not None:
        pairs.append((np.multiply, (out0, weight, out0)))
    if bias is not None:
        pairs.append((np.add, (out0, bias, out0)))
    return steps(pairs)


@binder_for(native_layer_norm_out)
def _bind_layer_norm(args):
    if not _layer_norm_fast(args):
        return native_layer_norm_out, args
    return _layer_norm(args) or (native_layer_norm_out, args)


@prepares(_bind_layer_norm)
def _prepare_layer_norm(bound):
    if not _layer_norm_fast(bound):
        return None
    input, weight, bias, eps = bound[0], bound[2], bound[3], bound[4]
    ct = input.dtype
    prepared = {"ones": {}, "count": {}, "eps_value": eps, "eps": np.asarray(eps, ct),
                "one": np.asarray(1.0, ct), "squares": np.empty(input.size, ct)}
    # weight and bias are over the normalized (last) dims, so every row of their broadcast
    # is the same: a prefix of the one at the upper bound is the broadcast at any size
    for v in (weight, bias):
        if v is not None and read_only(v) and input.size <= _SMALL and \
                v.shape == input.shape[input.ndim - v.ndim:]:
            full = _broadcast_copy(v, input.shape).reshape(-1)
            full.flags.writeable = False  # read by every shape's multiply and add
            prepared[id(v)] = (v, full)
    return lambda args: _layer_norm_rows(args, prepared) or _layer_norm(args, prepared)


def _layer_norm_rows(args, prepared: dict):
    """``_layer_norm``'s steps, straight-line, for its common prepared case: one normalized
    dimension, a small contiguous input, a constant weight and bias (or none) broadcast at
    the upper bound; None otherwise (about half its cost: 3 instead of 6 µs a shape)."""
    input, normalized_shape, weight, bias, eps, out0, out1, out2 = args
    size = input.size
    if len(normalized_shape) != 1 or not 0 < size <= _SMALL or eps != prepared["eps_value"] \
            or not (input.flags.c_contiguous and out0.flags.c_contiguous):
        return None
    n = input.shape[-1]
    rows = size // n
    keep = input.shape[:-1] + (1,)
    ones, count = prepared["ones"].get(n), prepared["count"].get(n)
    if out1.shape != keep or out2.shape != keep or ones is None or count is None:
        return None
    affine = []
    for v in (weight, bias):  # prefixes of this very array's broadcast at the upper bound
        entry = prepared.get(id(v)) if v is not None else (None, None)
        if entry is None or entry[0] is not v:
            return None
        affine.append(None if v is None else entry[1][:size].reshape(input.shape))
    flat = prepared["squares"][:size]
    return _norm_steps(
        input, out0, out1, out2, flat.reshape(input.shape), count, prepared["eps"],
        prepared["one"], *affine,
        (np.matmul, (input.reshape(rows, n), ones, out1.reshape(rows))),
        (np.matmul, (flat.reshape(rows, n), ones, out2.reshape(rows))))


def _broadcast(v: np.ndarray, shape: tuple[int, ...], prepared: dict | None) -> np.ndarray:
    """``v`` broadcast to ``shape``: a prefix of the prepared upper-bound broadcast where
    there is one for this very array, else a new copy."""
    entry = prepared.get(id(v)) if prepared is not None else None
    if entry is None or entry[0] is not v:
        return _broadcast_copy(v, shape)
    full = entry[1]
    return full[:math.prod(shape)].reshape(shape)


@binder_for(batch_norm_batch_stats_out)
def _bind_batch_stats(args):
    input, weight, bias, training, _momentum, eps, out, save_mean, save_invstd = args
    if not training or not _floating_same(input, weight, bias, out, save_mean, save_invstd) \
            or input.ndim < 2 or input.size == 0 or \
            not separate([out, save_mean, save_invstd], input, weight, bias):
        return batch_norm_batch_stats_out, args
    # The general kernel's steps into the outs: save_mean/save_invstd viewed (1, C, 1, ...).
    ct, axes = input.dtype, (0,) + tuple(range(2, input.ndim))
    keep = _per_channel(save_mean, input.ndim).shape
    mean, invstd = save_mean.reshape(keep), save_invstd.reshape(keep)
    count = np.asarray(input.size // max(input.shape[1], 1), ct)
    squares = np.empty(input.shape, ct)
    pairs = [
        (np.add.reduce, (input, axes, None, mean, True)), (np.divide, (mean, count, mean)),
        (np.subtract, (input, mean, out)), (np.multiply, (out, out, squares)),
        (np.add.reduce, (squares, axes, None, invstd, True)),
        (np.divide, (invstd, count, invstd)), (np.add, (invstd, np.asarray(eps, ct), invstd)),
        (np.sqrt, (invstd, invstd)), (np.divide, (np.asarray(1.0, ct), invstd, invstd)),
        (np.multiply, (out, invstd, out)),
    ]
    if weight is not None:
        pairs.append((np.multiply, (out, _per_channel(weight, input.ndim), out)))
    if bias is not None:
        pairs.append((np.add, (out, _per_channel(bias, input.ndim), out)))
    return steps(pairs)


@binder_for(batch_norm_no_training_out)
def _bind_batch_norm(args):
    input, weight, bias, running_mean, running_var, _momentum, eps, out0, _out1, _out2 = args
    if not _floating_same(input, out0) or input.ndim < 2 or not separate([out0], input) or \
            not read_only(weight, bias, running_mean, running_var):
        return batch_norm_no_training_out, args
    # The general kernel's scale and shift, computed once from the constant statistics.
    scale, shift = _inference_affine(input, weight, bias, running_mean, running_var, eps)
    return steps([(np.multiply, (input, scale, out0)), (np.add, (out0, shift, out0))])
