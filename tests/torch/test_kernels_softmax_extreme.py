"""Softmax and log-softmax on logits large enough to overflow ``exp``, against PyTorch in
float64, on every path the portable kernels take.

Softmax is shift-invariant, so ordinary logits (OpInfo's stay within about ±9) cannot
tell a kernel that subtracts the row maximum from one that does not, nor a right row
maximum from a wrong one: both give the same numbers. Logits of ±100 overflow float32's
``exp`` (above ~88.7) and ±1e4 overflow float64's (above ~709); then only the right
per-row maximum gives finite results. Rows differ in their maxima by thousands, so a
maximum taken from another row (a wrong axis, a wrong column of the transposed copy)
shows as nan, inf or 0 where PyTorch has a finite probability.

Paths (``normalization.py``): the general kernels (every dtype); the bound softmax's row
maximum through a transposed copy (last axis of at most 32 elements, at least 32 rows) or
``np.maximum.reduce``, and its row sum as ``x @ ones`` (last axis, at most ``_SMALL``
elements) or ``np.add.reduce``; the bound log-softmax's reduce steps. Each case below
asserts which path it takes, so a changed threshold cannot quietly stop testing one.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from opforge.kernels.portable import normalization, portable_kernels

KERNELS = portable_kernels()
SOFTMAX, LOG_SOFTMAX = "aten::_softmax.out", "aten::_log_softmax.out"
TORCH = {SOFTMAX: torch.ops.aten._softmax, LOG_SOFTMAX: torch.ops.aten._log_softmax}

# Against float64: float32 results are a few roundings off (the shifted logits are exact:
# x - max of two nearby float32 values loses nothing); log-softmax values reach -2e4, so
# their error is relative. float16 computes in float32 and rounds once.
TOL = {np.float16: (1e-3, 1e-3), np.float32: (2e-6, 1e-6), np.float64: (1e-12, 1e-13)}

# (shape, dim, layout, bound softmax's maximum path, its sum path). The transposed maximum
# takes a last axis of at most 32 with at least 32 rows and at most _SMALL (65536)
# elements; the x @ ones sum a last axis and at most _SMALL elements: cases sit on both
# sides of each threshold.
CASES = [
    ((8, 16, 16), -1, "contiguous", "transposed", "matmul"),
    ((2, 4, 8, 32), -1, "contiguous", "transposed", "matmul"),  # 32 columns
    ((40, 33), -1, "contiguous", "reduce", "matmul"),  # 33 columns
    ((32, 16), -1, "contiguous", "transposed", "matmul"),  # 32 rows
    ((31, 16), -1, "contiguous", "reduce", "matmul"),  # 31 rows
    ((4096, 16), -1, "contiguous", "transposed", "matmul"),  # exactly _SMALL elements
    ((4097, 16), -1, "contiguous", "reduce", "reduce"),  # one row more
    ((3, 40, 7), -1, "contiguous", "transposed", "matmul"),
    ((64, 1), -1, "contiguous", "transposed", "matmul"),  # rows of one element
    ((6, 5), -1, "contiguous", "reduce", "matmul"),  # few rows
    ((4, 64), -1, "contiguous", "reduce", "matmul"),  # long rows
    ((37,), -1, "contiguous", "reduce", "matmul"),  # 1-d
    ((1,), 0, "contiguous", "reduce", "matmul"),  # one element
    ((64, 16), -1, "transposed", "reduce", "matmul"),  # not contiguous
    ((300, 300), -1, "contiguous", "reduce", "reduce"),  # above _SMALL
    ((64, 16), 0, "contiguous", "reduce", "reduce"),  # not the last axis
    ((4, 16, 16), 1, "contiguous", "reduce", "reduce"),
    ((300, 300), 0, "transposed", "reduce", "reduce"),
]


def extreme_logits(shape, dim, dtype, scale, layout, seed=0) -> np.ndarray:
    """Logits of magnitude ``scale`` whose rows along ``dim`` are, in turn: spread over
    ±scale (one entry dominates); scale + noise, alternating in sign (a spread-out
    softmax of huge logits); the same with the first half -inf; half at +scale and half
    at -scale. One row is all -inf (nan, as in ATen)."""
    rng = np.random.default_rng(seed)
    n = shape[dim]
    moved = tuple(s for i, s in enumerate(shape) if i != dim % len(shape)) + (n,)
    rows = rng.standard_normal(moved).reshape(-1, n)
    for r, row in enumerate(rows):
        kind, sign = r % 4, (1 if (r // 4) % 2 == 0 else -1)
        if kind == 0:
            row[:] = rng.uniform(-scale, scale, n)
        elif kind == 1:
            row += sign * scale
        elif kind == 2:
            row += sign * scale
            row[: n // 2] = -np.inf
        else:
            row[: n // 2] += scale
            row[n // 2:] -= scale
    rows[len(rows) // 2] = -np.inf
    x = np.moveaxis(rows.reshape(moved), -1, dim).astype(dtype)
    if layout == "transposed":  # the same values reached through .T of a C-contiguous array
        return np.ascontiguousarray(x.T).T
    return np.ascontiguousarray(x)


def expected(key, x, dim) -> np.ndarray:
    return TORCH[key](torch.from_numpy(x.astype(np.float64)), dim, False).numpy()


def assert_close(out, want, dtype):
    rtol, atol = TOL[dtype]
    np.testing.assert_allclose(out.astype(np.float64), want, rtol=rtol, atol=atol)  # nan == nan


def bound_paths(fn, args) -> tuple[str, str]:
    """Which maximum and sum steps a bound softmax runs, read from its step list: a copy
    into the transposed buffer, and a matrix-vector product with ones."""
    pairs = args[0] if args and type(args[0]) is tuple else ((fn, args),)
    used = {step for step, _ in pairs}
    return ("transposed" if np.copyto in used else "reduce",
            "matmul" if np.matmul in used else "reduce")


@pytest.mark.parametrize("key", [SOFTMAX, LOG_SOFTMAX])
@pytest.mark.parametrize("scale", [100.0, 1e4])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape, dim, layout, peak, total", CASES, ids=str)
def test_bound_matches_torch_float64(shape, dim, layout, peak, total, dtype, scale, key):
    x = extreme_logits(shape, dim, dtype, scale, layout)
    assert x.shape == shape and x.flags.c_contiguous == (layout == "contiguous" or x.ndim == 1)
    out = np.empty(shape, dtype)
    fn, args = KERNELS[key].bind((x, dim, False, out))
    assert fn is not KERNELS[key], "the general kernel, not a fast path"
    if key == SOFTMAX:
        assert bound_paths(fn, args) == (peak, total)
    want = expected(key, x, dim)
    with np.errstate(all="ignore"):  # bound steps warn where ATen is silent (-inf - -inf)
        for _ in range(2):  # the second call over garbage left in out
            fn(*args)
            assert_close(out, want, dtype)
            out.fill(7)
        x[...] = -x  # new values through the same bound buffers: other rows, other maxima
        fn(*args)
    assert_close(out, expected(key, x, dim), dtype)


@pytest.mark.parametrize("key", [SOFTMAX, LOG_SOFTMAX])
@pytest.mark.parametrize("scale", [100.0, 1e4])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("shape, dim, layout", [((8, 16, 16), -1, "contiguous"),
                                                ((64, 16), 0, "transposed"),
                                                ((4, 16, 16), 1, "contiguous")], ids=str)
def test_general_kernel_matches_torch_float64(shape, dim, layout, dtype, scale, key):
    x = extreme_logits(shape, dim, dtype, scale, layout, seed=1)
    out = np.empty(shape, dtype)
    with np.errstate(all="ignore"):  # -inf - -inf warns in NumPy; ATen is silent
        assert KERNELS[key](x, dim, False, out) is None
    assert_close(out, expected(key, x, dim), dtype)


@pytest.mark.parametrize("bind", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_issue_example(dtype, bind):
    # softmax([100, 0, 1]): [nan, 0, 0] in float32 without the max subtraction.
    x = np.array([[100.0, 0.0, 1.0], [1e4, -1e4, 1e4 - 1.0], [-np.inf, 5.0, -np.inf],
                  [-np.inf, -np.inf, -np.inf]], dtype)
    for key in (SOFTMAX, LOG_SOFTMAX):
        out = np.empty_like(x)
        fn, args = KERNELS[key].bind((x, -1, False, out)) if bind else \
            (KERNELS[key], (x, -1, False, out))
        with np.errstate(all="ignore"):
            fn(*args)
        assert_close(out, expected(key, x, -1), dtype)
    assert np.isnan(out[3]).all() and out[2, 1] == 0.0  # log_softmax: nan row, log(1)


@pytest.mark.parametrize("bind", [False, True])
@pytest.mark.parametrize("key", [SOFTMAX, LOG_SOFTMAX])
@pytest.mark.parametrize("shape, dim", [((0, 4), 0), ((0, 4), -1), ((3, 0), -1), ((3, 0), 0),
                                        ((), 0), ((1,), 0), ((1, 1), -1)], ids=str)
def test_empty_zero_d_and_single_element(shape, dim, key, bind):
    # One element: softmax 1, log_softmax 0, whatever its size (1e4 overflows exp unshifted).
    x = np.full(shape, 1e4, np.float32)
    out = np.full(shape, 7.0, np.float32)
    fn, args = KERNELS[key].bind((x, dim, False, out)) if bind else \
        (KERNELS[key], (x, dim, False, out))
    fn(*args)
    assert_close(out, expected(key, x, dim), np.float32)


@pytest.mark.parametrize("key", [SOFTMAX, LOG_SOFTMAX])
def test_float16_binds_to_a_float32_computation(key):
    # float16 computes in float32 and rounds once (ATen's opmath): a bound float16 softmax
    # must not run its steps in float16.
    x = extreme_logits((8, 16, 16), -1, np.float16, 100.0, "contiguous")
    out = np.empty(x.shape, np.float16)
    fn, args = KERNELS[key].bind((x, -1, False, out))
    with np.errstate(all="ignore"):
        fn(*args)
    # within one float16 ulp of the exact result: a float32 computation rounded once
    np.testing.assert_array_max_ulp(out, expected(key, x, -1).astype(np.float16), maxulp=1)


@pytest.mark.parametrize("key", [SOFTMAX, LOG_SOFTMAX])
@pytest.mark.parametrize("shape", [(8, 16, 16), (4, 64), (300, 300)], ids=str)
def test_in_place_out_aliasing_self(shape, key):
    # out is self: the bound steps would overwrite the logits before the row maximum and
    # sum are done with them; the binder must fall back to the general kernel.
    x = extreme_logits(shape, -1, np.float32, 100.0, "contiguous")
    want = expected(key, x, -1)
    fn, args = KERNELS[key].bind((x, -1, False, x))
    with np.errstate(all="ignore"):
        fn(*args)
    assert_close(x, want, np.float32)


def test_row_sum_needs_both_arrays_contiguous():
    a = np.ones((8, 16), np.float32)
    assert normalization._row_sum(a, 1, np.empty(8, np.float32)) is not None
    assert normalization._row_sum(a, 1, np.empty((8, 2), np.float32)[:, 0]) is None
    assert normalization._row_sum(np.ones((16, 8), np.float32).T, 1,
                                  np.empty(8, np.float32)) is None
