"""The kernels of the cpu backend's ``int_matmul`` (native/int_matmul.cpp: AVX-512,
native/int_matmul_avx2.cpp: AVX2 + FMA, and the portable loops) on plans written by hand:
equal results, bit for bit (each weight float32(q)·scale, one rounding, then one chain of
fused multiply-adds per output, k in order, the bias after), and each within the error
bound of the exact sum of the same float32 weights.

Rows M 1..9 (the register path's blocks and remainders) and from 24 (the wide path, which
dequantizes a chunk once a call: against the register path of the same kernel too), K odd
and across groups and the wide path's 256-k blocks, N odd across the 16-column panels and
4-panel chunks, with and without bias, a row of NaN, 1 and 2 threads. Each kernel is
chosen by its switches (read when the op is built); one the CPU lacks falls back (the
op's name says which ran), so every CPU runs every test: an AVX-512 machine runs the AVX2
kernel with OPFORGE_CPU_INT_MATMUL_AVX512=0.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from opforge.backends import get_backend

sys.path.insert(0, str(Path(__file__).resolve().parent))

import test_cpu_hostile_plans as hostile  # noqa: E402

pytestmark = pytest.mark.skipif(get_backend("cpu").unavailable() is not None,
                                reason="the cpu backend's oneDNN is not installed")

SWITCHES = ("OPFORGE_CPU_INT_MATMUL_AVX512", "OPFORGE_CPU_INT_MATMUL_AVX2", "OPFORGE_CPU_INT_MATMUL_WIDE")
# kernel → its switches' values (AVX-512, AVX2, wide)
KERNELS = {"avx512": ("1", "1", "1"), "avx512 register": ("1", "1", "0"),
           "avx2": ("0", "1", "1"), "avx2 register": ("0", "1", "0"), "portable": ("0", "0", "1")}
U = 2.0 ** -24


def _plan(q: np.ndarray, scales: np.ndarray, m: int, group: int, bits: int, bias=None):
    from opforge.backends.cpu.lowering.int_weights import IntWeight

    n, k = q.shape
    packed, panel_scales = IntWeight(torch.from_numpy(q), torch.from_numpy(scales), group, bits).packed()
    p = hostile.Plan()
    a = p.tensor(hostile.F32, [m, k], role="input")
    y = p.tensor(hostile.F32, [m, n], role="output")
    ins = [a, p.const(packed.numpy()), p.const(panel_scales.numpy())] + ([] if bias is None else [p.const(bias)])
    p.op("int_matmul", ins, [y], ia=[bits, group])
    return p


def _run_kernels(plan, x, monkeypatch, threads=(1, 2)) -> dict:
    """kernel → (op name, [output per thread count]); checks each ran where the CPU has it"""
    out = {}
    for kernel, values in KERNELS.items():
        for name, value in zip(SWITCHES, values):
            monkeypatch.setenv(name, value)
        runs, names = [], set()
        for t in threads:
            h = plan.handle(threads=t)
            names.add(",".join(h.describe()))  # (the op's name holds commas)
            runs.append(hostile.run(h, x)[0])
            h.close()
        out[kernel] = (" ".join(sorted(names)), runs)
    flags = hostile.cpu_flags()
    assert "AVX" not in out["portable"][0], out["portable"][0]
    if {"avx2", "fma"} <= flags:
        assert "AVX2" in out["avx2"][0] and "AVX2" in out["avx2 register"][0], out["avx2"][0]
    if "avx512f" in flags:
        assert "AVX-512" in out["avx512"][0], out["avx512"][0]
    if x.shape[0] >= 24:  # the wide path where its kernel runs (int_matmul.cpp's kWideRows)
        for kernel in ("avx512", "avx2"):
            assert ("once a call" in out[kernel][0]) == ("AVX" in out[kernel][0]), out[kernel][0]
    assert "once a call" not in out["avx2 register"][0] + out["avx512 register"][0]
    return out


def _weights(q, scales, group):
    """The float32 weights float32(q)·scale as float64, [N, K]."""
    s = np.repeat(scales, group, axis=1)[:, :q.shape[1]]
    return (q.astype(np.float32) * s).astype(np.float64)


# (M, K, N, group): M 1..9 and around / past the wide path's 24 rows; K odd (a 4-bit one
# group only), across groups and the wide path's 256-k blocks; N odd and around 16 and 64
CASES = [(1, 96, 67, 32), (2, 130, 17, 64), (3, 33, 1, 33), (4, 256, 129, 128), (5, 64, 31, 32),
         (6, 7, 50, 7), (7, 96, 65, 32), (8, 128, 15, 64), (9, 45, 33, 45), (23, 300, 100, 32),
         (24, 257, 17, 257), (30, 520, 65, 128), (64, 513, 48, 513), (130, 96, 70, 32)]


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("m,k,n,group", CASES)
def test_kernels_equal_bit_for_bit_and_the_bound(m, k, n, group, bits, monkeypatch):
    if bits == 4 and group % 2 and group != k:
        pytest.skip("a 4-bit group is even or K")
    rng = np.random.default_rng(m * 1000 + k + n + bits)
    top = 127 if bits == 8 else 7
    q = rng.integers(-top - 1, top + 1, (n, k)).astype(np.int8)
    q[:, 0] = -top - 1  # both ends of the range in every column
    q[:, -1] = top
    scales = (rng.random((n, -(-k // group))) * 0.05 + 0.001).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32) if m % 2 else None
    x = (rng.standard_normal((m, k)) * 3).astype(np.float32)
    if m > 2:
        x[1, :] = 0
        x[2, k // 2] = np.nan  # its row NaN in every kernel
    out = _run_kernels(_plan(q, scales, m, group, bits, bias), x, monkeypatch)
    ref = out["portable"][1][0]
    w = _weights(q, scales, group)
    ok = ~np.isnan(x).any(-1)
    exact = x[ok].astype(np.float64) @ w.T + (0 if bias is None else bias.astype(np.float64))
    bound = (k + 1) * U / (1 - (k + 1) * U) * (np.abs(x[ok].astype(np.float64)) @ np.abs(w).T
                                               + (0 if bias is None else np.abs(bias.astype(np.float64))))
    assert (np.abs(ref[ok] - exact) <= bound).all()
    assert np.isnan(ref[~ok]).all()
    for kernel, (name, runs) in out.items():
        for got in runs:  # NaN where ref is NaN (its payload any), every other value's bits
            nan = np.isnan(ref)
            assert np.array_equal(np.isnan(got), nan), f"{kernel} ({name})"
            differ = int((got.view(np.uint32) != ref.view(np.uint32))[~nan].sum())
            assert differ == 0, f"{kernel} ({name}): {differ} of {ref.size} differ"
