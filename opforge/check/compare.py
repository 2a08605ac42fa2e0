"""Comparing a kernel's outputs with expected ones, and describing samples, in full.

    compare(got, want) → None, or the whole mismatch: how many elements differ, the max
                         absolute and relative error, the first index, expected vs got
    describe(value)    → "float32[3, 4] strides (1, 3) [[...]]", "dim=-1", ...

Floating outputs agree within rtol = atol = 1e-4 (float32, float16) or 1e-10 (float64),
NaN equal to NaN; integer and bool outputs exactly. Texts are never cut: a failing sample
is described whole so that it can be reproduced.
"""

from __future__ import annotations

import numpy as np

__all__ = ["compare", "describe", "describe_args", "tolerance"]

_SMALL = 24  # tensors with at most this many elements are shown with their values


def tolerance(dtype: np.dtype) -> float:
    dtype = np.dtype(dtype)
    return 1e-10 if dtype == np.float64 else 1e-4


def compare(got: np.ndarray, want: np.ndarray) -> str | None:
    """None if ``got`` matches ``want`` (see the module text), else the whole mismatch."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return f"shape {list(got.shape)}, expected {list(want.shape)}"
    if got.dtype != want.dtype:
        if want.dtype.kind == "f" and got.dtype.kind in "iub":
            pass  # compared as numbers below; a dtype mismatch is the fake's to report
        want = want.astype(got.dtype) if got.dtype.kind != "b" else want.astype(bool)
    if got.dtype.kind in "fc":
        tol = tolerance(got.dtype)
        close = np.isclose(got, want, rtol=tol, atol=tol, equal_nan=True)
    else:
        close = got == want
    if np.all(close):
        return None
    bad = ~np.asarray(close)
    first = tuple(int(i) for i in np.argwhere(bad)[0]) if got.ndim else ()
    text = f"{int(bad.sum())} of {got.size} element(s) differ"
    if got.dtype.kind in "fciu":
        g, w = got[bad].astype(np.float64), want[bad].astype(np.float64)
        with np.errstate(all="ignore"):
            abs_err = np.abs(g - w)
            rel_err = abs_err / np.maximum(np.abs(w), np.finfo(np.float64).tiny)
        finite = np.isfinite(abs_err)
        if finite.any():
            text += (f"; max abs error {abs_err[finite].max():.6g}, max rel error "
                     f"{rel_err[finite].max():.6g}")
    text += f"; first at index {first}: expected {want[first]!r}, got {got[first]!r}"
    if got.size <= _SMALL:
        text += f"\n      expected: {want.tolist()}\n      got:      {got.tolist()}"
    return text


def describe(value) -> str:
    """One argument of a sample, whole (shape, dtype, strides, small values)."""
    import torch

    if isinstance(value, torch.Tensor):
        text = f"{str(value.dtype).removeprefix('torch.')}{list(value.shape)}"
        if not value.is_contiguous():
            text += f" strides {tuple(value.stride())}"
        if value.numel() <= _SMALL and value.numel() > 0:
            text += f" {value.tolist()}"
        return text
    if isinstance(value, np.ndarray):
        text = f"{value.dtype}{list(value.shape)}"
        if value.size and value.size <= _SMALL:
            text += f" {value.tolist()}"
        return text
    if isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in value):
        return "[" + ", ".join(describe(v) for v in value) + "]"
    return repr(value)


def describe_args(names: list[str], args: list) -> str:
    return ", ".join(f"{n}={describe(a)}" for n, a in zip(names, args))
