"""The engine's own matmul for a few rows against constant weights (small_matmul.cpp):
which calls it takes, and its numbers against float64 on every row and column count
around its blocks (4 rows, 4 panels of 16 columns), weights row-major and transposed
(a linear layer's), bias per column or one for all, and the post-ops it runs (relu, clip,
linear), NaN and inf inputs included (torch's NaN-exact relu and clip); the same plans on
oneDNN (OPFORGE_CPU_CAPABILITY=default) must agree.

Tolerance: each output is a float32 sum of K products in order, one rounding each (FMA),
so it lies within K·2^-24 · Σ|a·b| of the exact value (plus a rounding of the bias add and
of each post-op); 2·(K + 2)·2^-24 · (Σ|a·b| + |bias|) covers both sides' roundings.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import test_cpu_hostile_plans as hostile  # noqa: E402

pytestmark = hostile.pytestmark
capability = hostile.capability  # the engine's own kernels, then oneDNN's paths

RELU, LINEAR, CLIP, GELU = 0, 6, 13, 15  # the blob's eltwise codes (lowering/core.py)
OWN = "matmul on few rows (own kernel)"
POSTS = {
    "none": ([], lambda v: v),
    "relu": ([[0, RELU, 0.0, 0.0, -1]], lambda v: np.where(np.isnan(v), v, np.maximum(v, 0))),
    "relu6": ([[0, CLIP, 0.0, 6.0, -1]], lambda v: np.where(np.isnan(v), v, np.clip(v, 0, 6))),
    "scale, clip": ([[0, LINEAR, -0.5, 0.25, -1], [0, CLIP, -1.0, 1.0, -1]],
                    lambda v: np.where(np.isnan(v), v, np.clip(v * -0.5 + 0.25, -1, 1))),
    # relu in the kernel, then GELU and a clip after it (in place: the Epilogue)
    "relu, gelu, clip": ([[0, RELU, 0.0, 0.0, -1], [0, GELU, 0.0, 0.0, -1], [0, CLIP, -1.0, 2.0, -1]],
                         lambda v: np.where(np.isnan(v), v, np.clip(_gelu(np.maximum(v, 0)), -1, 2))),
}


def _gelu(v: np.ndarray) -> np.ndarray:
    return 0.5 * v * (1 + np.vectorize(math.erf, otypes=[np.float64])(v / math.sqrt(2)))


def _plan(m, k, n, *, transposed, bias, post, batch_rank=0):
    """A matmul plan [.., m, k] x [.., k, n] (+ bias) with `post`; its constant arrays."""
    rng = np.random.default_rng(m * 10007 + k * 101 + n)
    w = rng.standard_normal((k, n)).astype(np.float32)
    lead = [1] * batch_rank
    p = hostile.Plan()
    a = p.tensor(hostile.F32, [*lead, m, k], role="input")
    if transposed:  # a linear layer's weight [n, k], read as its transpose
        wt = p.const(np.ascontiguousarray(w.T))
        b = p.alias(wt, [*lead, k, n], [*([k * n] * batch_rank), 1, k])
    else:
        b = p.const(w, dims=[*lead, k, n])
    ins = [a, b]
    bias_values = None
    if bias == "column":
        bias_values = rng.standard_normal(n).astype(np.float32)
        ins.append(p.const(bias_values, dims=[*lead, 1, n]))
    elif bias == "one":
        bias_values = np.full(n, 0.75, np.float32)
        ins.append(p.const(np.array([0.75], np.float32), dims=[*lead, 1, 1]))
    y = p.tensor(hostile.F32, [*lead, m, n], role="output")
    p.op("matmul", ins, [y], post=POSTS[post][0])
    return p, w, bias_values


def _check(m, k, n, *, transposed=False, bias="column", post="none", specials=False, batch_rank=0):
    p, w, bias_values = _plan(m, k, n, transposed=transposed, bias=bias, post=post,
                              batch_rank=batch_rank)
    rng = np.random.default_rng(m + k + n)
    x = rng.standard_normal((m, k)).astype(np.float32)
    if specials:
        x[0, k // 2] = np.nan
        if m > 1:
            x[1, 0] = np.inf
    handle = p.handle()
    got = hostile.run(handle, x.reshape([1] * batch_rank + [m, k]))[0].reshape(m, n)
    with np.errstate(invalid="ignore"):
        exact = x.astype(np.float64) @ w.astype(np.float64)
        size = np.abs(x).astype(np.float64) @ np.abs(w).astype(np.float64)
    if bias_values is not None:
        exact = exact + bias_values
        size = size + np.abs(bias_values)
    want = POSTS[post][1](exact)
    tol = 2 * (k + 2) * 2.0**-24 * size
    if "gelu" in post:  # GELU's slope is at most 1.13, and oneDNN's is within a few ulp
        tol = 1.2 * tol + 8 * 2.0**-24 * np.abs(want)
    with np.errstate(invalid="ignore"):
        assert np.array_equal(np.isnan(got), np.isnan(want)), "NaNs where torch has none, or lost"
        finite = np.isfinite(want)
        assert np.array_equal(got[~finite & ~np.isnan(want)], want[~finite & ~np.isnan(want)])
        err = np.abs(got[finite] - want[finite])
    assert (err <= tol[finite]).all(), float((err / np.maximum(tol[finite], 1e-30)).max())
    return handle.describe()


SHAPES = [(1, 1, 1), (1, 64, 10), (3, 7, 17), (4, 64, 128), (5, 33, 65), (8, 128, 200),
          (2, 130, 48), (7, 3, 64)]


@pytest.mark.parametrize("m,k,n", SHAPES, ids=[f"{m}x{k}x{n}" for m, k, n in SHAPES])
@pytest.mark.parametrize("post", list(POSTS))
def test_few_row_matmuls_match_float64(m, k, n, post, capability):
    _check(m, k, n, post=post, transposed=(m + n) % 2 == 0, bias=("column", "one", None)[(k + n) % 3])


@pytest.mark.parametrize("post", ["relu", "relu6", "none"])
def test_nan_and_inf_rows_stay_as_torch_computes_them(post, capability):
    _check(4, 64, 40, post=post, specials=True)


def test_the_own_kernel_takes_few_rows_against_constants_and_nothing_else(monkeypatch):
    monkeypatch.delenv("OPFORGE_CPU_CAPABILITY", raising=False)
    if "avx512f" not in hostile.cpu_flags():
        pytest.skip("the kernel needs AVX-512 (oneDNN runs these elsewhere; the other tests cover it)")
    assert OWN in _check(4, 64, 128, post="relu")
    assert OWN in _check(2, 16, 16, batch_rank=2, transposed=True)
    assert OWN not in _check(9, 64, 128)                 # more than 8 rows
    assert OWN not in _check(8, 512, 512)                # over 2^20 multiply-adds: threads
    assert OWN in _check(4, 64, 128, post="relu, gelu, clip")  # the GELU after the kernel
    residual = _plan(4, 16, 16, transposed=False, bias=None, post="none")[0]
    other = residual.tensor(hostile.F32, [4, 16], role="input")
    residual.ops[-1]["post"] = [[1, 100, 0.0, 0.0, other]]  # an add of another tensor
    assert OWN not in residual.handle().describe()
    monkeypatch.setenv("OPFORGE_CPU_CAPABILITY", "default")
    assert OWN not in _check(4, 64, 128)


# --- cases for the sanitized run (test_cpu_sanitized.py): the blocks and their edges
CASES, EXPECT = hostile.ran_ok_cases({
    f"small_matmul_{m}x{k}x{n}": (lambda m=m, k=k, n=n: (_check(m, k, n, post="relu6"), "ran ok")[1])
    for m, k, n in SHAPES})
test_the_case_file_runs = hostile.case_file_test(__file__, CASES, EXPECT)


if __name__ == "__main__":
    hostile.report_cases(CASES, sys.argv[1:])
