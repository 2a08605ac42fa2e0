"""Softmax rows with -inf entries (an attention mask) keep the fast path's values (the
row kernel's, or oneDNN's where it runs) when the row's max is finite; only rows holding
NaN or +inf, rows of only -inf, and log-softmax rows with an inf are recomputed by the
engine's exact loop (native/softmax.cpp). Both kinds of row, side by side in one call,
against float64 torch: masked entries are exactly 0 as in torch, the rest within float32
rounding (1e-6 of probabilities at most 1). test_cpu_softmax_rows.py runs both paths."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import test_cpu_hostile_plans as hostile  # noqa: E402

pytestmark = hostile.pytestmark


def _softmax(a: np.ndarray, log: bool, safe: bool) -> np.ndarray:
    p = hostile.Plan()
    x = p.tensor(hostile.F32, list(a.shape), role="input")
    y = p.tensor(hostile.F32, list(a.shape), role="output")
    p.op("softmax", [x], [y], [a.ndim - 1, int(log), int(safe)])
    return hostile.run(p.handle(), a)[0]


def _scores(shape, seed=0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    a = (rng.standard_normal(shape) * 20).astype(np.float32)
    mask = rng.random(shape) < 0.5
    mask[..., 0] = False  # every row keeps a finite score ...
    a[mask] = -np.inf
    a[0, 0, :] = -np.inf  # ... but one row of only -inf
    a[0, 1, 3] = np.nan   # one with a NaN
    a[1, 0, 2] = np.inf   # one with +inf
    return a, mask


@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("shape", [(2, 3, 7), (3, 128, 256), (2, 2, 1000)])
def test_masked_rows_match_torch(shape, log):
    a, mask = _scores(shape)
    got = _softmax(a, log, safe=False)
    t = torch.from_numpy(a).double()
    ref = (torch.log_softmax(t, -1) if log else torch.softmax(t, -1)).numpy()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(ref))
    finite = np.isfinite(ref)
    scale = np.maximum(np.abs(ref[finite]), 1.0)
    assert (np.abs(got[finite] - ref[finite]) / scale).max() < 2e-6
    if not log:  # masked entries of the rows oneDNN's values stand for: exactly 0
        ordinary = np.isfinite(a.max(-1, keepdims=True))  # (NaN, +inf, all -inf: not)
        assert (got[mask & ordinary] == 0).all()


def test_safe_softmax_zeroes_a_row_of_only_minus_inf():
    a, _ = _scores((2, 3, 7))
    got = _softmax(a, log=False, safe=True)
    assert (got[0, 0] == 0).all()
    ref = torch.softmax(torch.from_numpy(a[1, 1]).double(), -1).numpy()
    np.testing.assert_allclose(got[1, 1], ref, rtol=2e-6, atol=1e-7)
