"""What every portable-kernel test file does: build inputs in a chosen memory layout, run a
kernel both ways the runtime can (called directly, and bound once then called twice), and
compare each out with PyTorch's result under the file's tolerance table. Special values
(±inf, NaN, inputs whose float32 intermediates overflow) are compared with
:func:`float64_reference` instead.

Imported by the ``test_kernels_*.py`` files beside it (pytest puts this folder on
``sys.path``); not a test module itself.
"""

from __future__ import annotations

import numpy as np
import torch

from opforge.kernels.portable import portable_kernels

KERNELS = portable_kernels()


def make_array(shape, dtype, layout="contiguous", seed=0, *, ints=(-4, 4), floats=None,
               bool_p=0.5):
    """``(array, tensor)`` with the same values. ``layout``: ``contiguous``, ``transposed``
    (``shape`` reached through ``.T`` of a C-contiguous array) or ``strided`` (every second
    element of the last axis). Integers are uniform over ``ints`` (inclusive); floats are
    standard normal, or uniform over ``floats = (low, high)``; bools true with ``bool_p``.
    The tensor is a contiguous copy, so torch never sees NumPy's strides."""
    rng = np.random.default_rng(seed)
    full = tuple(reversed(shape)) if layout == "transposed" else tuple(shape)
    if layout == "strided" and full:
        full = full[:-1] + (full[-1] * 2,)
    if dtype == np.bool_:
        base = rng.random(full) < bool_p
    elif np.issubdtype(dtype, np.integer):
        base = rng.integers(ints[0], ints[1] + 1, full).astype(dtype)
    elif floats is None:
        base = rng.standard_normal(full).astype(dtype)
    else:
        base = rng.uniform(floats[0], floats[1], full).astype(dtype)
    base = np.asarray(base)  # 0-d results come back as NumPy scalars
    if layout == "transposed":
        base = base.T
    elif layout == "strided" and shape:
        base = base[..., ::2]
    return base, torch.from_numpy(np.ascontiguousarray(base))


def run_bound(key, args, outs):
    """Run ``key`` the way the executor does: ``kernel.bind(args)`` once (with fresh outs),
    then the bound pair twice — the second time over garbage left in the outs, so a fast
    path that forgot to write an element or reuses a stale workspace fails."""
    bind = getattr(KERNELS[key], "bind", None)
    fn, bound_args = bind(args) if bind is not None else (KERNELS[key], args)
    fn(*bound_args)
    for out in outs:
        out.fill(True if out.dtype == np.bool_ else 7)
    fn(*bound_args)


def check_kernel(key, expected, *args, tols, tol=None, list_out=False):
    """Run ``key`` on ``args`` + fresh outs shaped like ``expected`` (a tensor or a tuple of
    them), unbound and bound, and compare every out with torch's result: same dtype, and
    values within ``tol`` (or ``tols[dtype]``; exact for dtypes not in ``tols``).
    ``list_out``: the schema takes its outs as one ``Tensor(a!)[] out`` argument."""
    expected = tuple(expected) if isinstance(expected, (tuple, list)) else (expected,)
    for bound in (False, True):
        outs = [np.empty(tuple(e.shape), dtype=e.numpy().dtype) for e in expected]
        full = (*args, *([outs] if list_out else outs))
        if bound:
            run_bound(key, full, outs)
        else:
            assert KERNELS[key](*full) is None
        for out, e in zip(outs, expected):
            assert out.dtype == e.numpy().dtype
            t = tols.get(out.dtype.type, 0) if tol is None else tol
            np.testing.assert_allclose(out, e.numpy(), rtol=t, atol=t)


# Why special values get their own reference: ATen's float32 and float16 kernels are
# vectorised, and what a vectorised formula does at ±inf, NaN or near overflow depends on
# the code path (CPU, ATEN_CPU_CAPABILITY, vector width, a single element or several,
# PyTorch version). With PyTorch 2.13 on an AVX-512 Xeon, float32 GELU of +inf is NaN for
# arrays of two elements or more, and +inf for one element or in float64; float32 GELU of
# 3e38 is inf (an intermediate overflows) where the value is 3e38. A test comparing with
# those passes on one machine and fails on another, so special inputs are compared with the
# function computed in float64 and rounded once, and non-finite inputs with stated values,
# which no machine's code path decides.
def float64_reference(fn, x: np.ndarray, at_inf: float, at_neg_inf: float) -> torch.Tensor:
    """``fn`` (a torch function) of ``x`` computed in float64 and rounded to ``x.dtype``,
    with NaN at NaN inputs, ``at_inf`` at +inf and ``at_neg_inf`` at -inf (the values the
    op is specified to give there), as a tensor for :func:`check_kernel`."""
    with np.errstate(all="ignore"):
        ref = fn(torch.from_numpy(x.astype(np.float64))).numpy().copy()
        ref[np.isnan(x)] = np.nan
        ref[x == np.inf] = at_inf
        ref[x == -np.inf] = at_neg_inf
        return torch.from_numpy(ref.astype(x.dtype))
