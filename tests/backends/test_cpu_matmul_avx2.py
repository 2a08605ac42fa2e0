"""The engine's own float32 matmul on AVX2 + FMA (native/small_matmul_avx2.cpp): on a CPU
without AVX-512 it takes every matmul against constant weights, any number of rows. Its
numbers against float64 on row counts across its register blocks (1-6 rows, up to 8 in one
pass over K) and its K-sliced path (9 rows on: K in slices of 256, partial sums stored and
reloaded), K across the slices, N across the 16-column panels and 64-column blocks, bias
per column, one for all or none, the register post-ops and those after the kernel (a GELU;
a residual add, a binary post-op), NaN and inf inputs (torch's NaN-exact relu and clip),
and 1 and 2 threads (bit for bit the same: the threads split columns, each sum is one
chain). An AVX-512 machine runs the kernel with OPFORGE_CPU_SMALL_MATMUL_AVX512=0, so
every x86-64 CPU runs every test.

Tolerance: test_cpu_small_matmul.py's (each output a float32 chain of K fused multiply-adds
in order, then the bias: within 2·(K + 2)·2^-24·(Σ|a·b| + |bias|) of float64).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import test_cpu_hostile_plans as hostile  # noqa: E402
import test_cpu_small_matmul as small  # noqa: E402

OWN = "matmul on AVX2 (own kernel)"
pytestmark = [hostile.pytestmark,
              pytest.mark.skipif(not {"avx2", "fma"} <= hostile.cpu_flags(),
                                 reason="the kernel needs AVX2 and FMA")]


@pytest.fixture(autouse=True)
def avx2_kernel(monkeypatch):
    """The AVX2 kernel wherever the CPU has it (the AVX-512 one off)."""
    monkeypatch.delenv("OPFORGE_CPU_CAPABILITY", raising=False)
    monkeypatch.delenv("OPFORGE_CPU_MATMUL_AVX2", raising=False)
    monkeypatch.setenv("OPFORGE_CPU_SMALL_MATMUL_AVX512", "0")


SHAPES = [(1, 1, 1), (1, 300, 70), (2, 64, 33), (3, 7, 17), (4, 257, 128), (5, 33, 65),
          (6, 128, 16), (7, 3, 64), (8, 513, 200), (9, 256, 48), (13, 257, 65), (24, 600, 130),
          (64, 100, 15), (128, 768, 96), (200, 300, 33)]


@pytest.mark.parametrize("m,k,n", SHAPES, ids=[f"{m}x{k}x{n}" for m, k, n in SHAPES])
@pytest.mark.parametrize("post", list(small.POSTS))
def test_matmuls_match_float64(m, k, n, post):
    described = small._check(m, k, n, post=post, transposed=(m + n) % 2 == 0,
                              bias=("column", "one", None)[(k + n) % 3])
    assert OWN in described, described


@pytest.mark.parametrize("m", [4, 20])
@pytest.mark.parametrize("post", ["relu", "relu6", "none"])
def test_nan_and_inf_rows_stay_as_torch_computes_them(m, post):
    assert OWN in small._check(m, 300, 40, post=post, specials=True)


def _residual_plan(m, k, n):
    """y = x @ w + bias + r (a binary post-op after the kernel) and its arrays."""
    rng = np.random.default_rng(m + 7 * k + n)
    w = rng.standard_normal((k, n)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    p = hostile.Plan()
    a = p.tensor(hostile.F32, [m, k], role="input")
    r = p.tensor(hostile.F32, [m, n], role="input")
    y = p.tensor(hostile.F32, [m, n], role="output")
    p.op("matmul", [a, p.const(w), p.const(bias, dims=[1, n])], [y],
         post=[[0, small.RELU, 0.0, 0.0, -1], [1, 100, 0.0, 0.0, r]])
    return p, w, bias


@pytest.mark.parametrize("m,k,n", [(1, 64, 40), (5, 300, 70), (40, 520, 33)])
def test_a_residual_add_runs_after_the_kernel(m, k, n):
    p, w, bias = _residual_plan(m, k, n)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((m, k)).astype(np.float32)
    res = rng.standard_normal((m, n)).astype(np.float32)
    handle = p.handle()
    assert OWN in handle.describe()
    got = hostile.run(handle, x, res)[0]
    exact = x.astype(np.float64) @ w.astype(np.float64) + bias
    want = np.maximum(exact, 0) + res
    size = np.abs(x).astype(np.float64) @ np.abs(w).astype(np.float64) + np.abs(bias)
    tol = 2 * (k + 2) * 2.0**-24 * size + 2.0**-24 * np.abs(want)  # + the add's rounding
    assert (np.abs(got - want) <= tol).all(), float((np.abs(got - want) / tol).max())


@pytest.mark.parametrize("m,k,n", [(3, 1024, 1000), (96, 600, 300)])
def test_two_threads_give_the_same_bits(m, k, n):
    # over 2^20 multiply-adds: the op runs on the engine's threads, split by column blocks
    p, _, _ = small._plan(m, k, n, transposed=True, bias="column", post="relu")
    x = np.random.default_rng(5).standard_normal((m, k)).astype(np.float32)
    one, two = p.handle(threads=1), p.handle(threads=2)
    assert OWN in one.describe() and OWN in two.describe()
    assert np.array_equal(hostile.run(one, x)[0], hostile.run(two, x)[0])


def test_which_matmuls_the_kernel_takes(monkeypatch):
    assert OWN in small._check(200, 64, 48)                      # any number of rows
    assert OWN in small._check(2, 16, 16, batch_rank=2, transposed=True)
    # a computed right-hand side stays on oneDNN
    p = hostile.Plan()
    a = p.tensor(hostile.F32, [4, 8], role="input")
    b = p.tensor(hostile.F32, [8, 5], role="input")
    p.op("matmul", [a, b], [p.tensor(hostile.F32, [4, 5], role="output")])
    assert OWN not in p.handle().describe()
    monkeypatch.setenv("OPFORGE_CPU_MATMUL_AVX2", "0")
    assert OWN not in small._check(20, 64, 48)
    monkeypatch.delenv("OPFORGE_CPU_MATMUL_AVX2")
    monkeypatch.setenv("OPFORGE_CPU_CAPABILITY", "default")
    assert OWN not in small._check(20, 64, 48)


@pytest.mark.skipif("avx512f" not in hostile.cpu_flags(), reason="compares with the AVX-512 kernel")
@pytest.mark.parametrize("m,k,n", [(1, 64, 40), (4, 257, 128), (8, 100, 65)])
def test_the_avx512_kernel_gives_the_same_bits(m, k, n, monkeypatch):
    p, _, _ = small._plan(m, k, n, transposed=False, bias="column", post="relu6")
    x = np.random.default_rng(9).standard_normal((m, k)).astype(np.float32)
    avx2 = p.handle()
    monkeypatch.delenv("OPFORGE_CPU_SMALL_MATMUL_AVX512")
    avx512 = p.handle()
    assert OWN in avx2.describe() and small.OWN in avx512.describe()
    assert np.array_equal(hostile.run(avx2, x)[0], hostile.run(avx512, x)[0])


# --- cases for the sanitized run (test_cpu_sanitized.py): both paths and their edges
def _case(m, k, n):
    def run():
        import os

        os.environ["OPFORGE_CPU_SMALL_MATMUL_AVX512"] = "0"  # read when the op is built
        if not {"avx2", "fma"} <= hostile.cpu_flags():
            return "ran ok"  # (no AVX2 CPU: nothing of this kernel to check)
        described = small._check(m, k, n, post="relu6", transposed=m % 2 == 0)
        return "ran ok" if OWN in described else f"another kernel: {described}"
    return run


CASES, EXPECT = hostile.ran_ok_cases({f"matmul_avx2_{m}x{k}x{n}": _case(m, k, n)
                                     for m, k, n in [(1, 300, 70), (3, 7, 17), (8, 513, 200),
                                                     (13, 257, 65), (24, 600, 130)]})
test_the_case_file_runs = hostile.case_file_test(__file__, CASES, EXPECT)


if __name__ == "__main__":
    hostile.report_cases(CASES, sys.argv[1:])
