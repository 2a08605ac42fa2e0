"""The three kernels of the cpu backend's ``int_dot_matmul`` (native/int_dot_matmul.cpp:
AVX512-VNNI, AVX2, the portable loops) on plans written by hand: equal results, bit for
bit (they sum the same integers exactly and run the same float epilogue in the same order),
and equal to the contract's arithmetic.

The AVX2 kernel multiplies u8 by s8 with vpmaddubsw, which adds each pair of products into
int16 with saturation: the extreme rows here (activations all ±127 against weights all
-128, 127, -8 or 7) reach the largest pairs, 2·128·127 (8 bits, |w| by q with w's sign) and
2·15·127 over 4 quad rows in int16 (4 bits), and a kernel that saturates is off by
thousands there. Each kernel is chosen by its switches (read when the op is built); one the
CPU lacks falls back (the op's name says which ran), so every CPU runs every test.
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

KERNELS = {"vnni": {"OPFORGE_CPU_INT_DOT_VNNI": "1", "OPFORGE_CPU_INT_DOT_AVX2": "1"},
           "avx2": {"OPFORGE_CPU_INT_DOT_VNNI": "0", "OPFORGE_CPU_INT_DOT_AVX2": "1"},
           "portable": {"OPFORGE_CPU_INT_DOT_VNNI": "0", "OPFORGE_CPU_INT_DOT_AVX2": "0"}}
EPS = 2.0 ** -64


def _cpu_flags() -> set:
    try:
        with open("/proc/cpuinfo") as f:
            return next((set(l.split(":")[1].split()) for l in f if l.startswith("flags")), set())
    except OSError:
        return set()


def scales_const(p, panel_scales: torch.Tensor) -> int:
    """The panel scales as a constant of plan ``p`` (float16 ones as their bytes, retyped:
    the helper's const has no float16); its tensor id."""
    if panel_scales.dtype != torch.float16:
        return p.const(panel_scales.numpy())
    s_id = p.const(panel_scales.view(torch.uint8).numpy(), dims=list(panel_scales.shape))
    p.tensors[s_id]["dtype"] = 5
    return s_id


def _plan(q: np.ndarray, scales: np.ndarray, m: int, group: int, bits: int, bias=None):
    from opforge.backends.cpu.lowering.int_dot import pack
    from opforge.backends.cpu.lowering.int_weights import IntWeight

    n, k = q.shape
    packed, panel_scales = pack(IntWeight(torch.from_numpy(q), torch.from_numpy(scales), group, bits))
    p = hostile.Plan()
    a = p.tensor(hostile.F32, [m, k], role="input")
    y = p.tensor(hostile.F32, [m, n], role="output")
    ins = [a, p.const(packed.numpy()), scales_const(p, panel_scales)] + ([] if bias is None else [p.const(bias)])
    p.op("int_dot_matmul", ins, [y], ia=[bits, group], fa=[EPS])
    return p


def _run_kernels(plan, x, monkeypatch, threads=(1,)) -> dict:
    """kernel name → (op name, [output per thread count])"""
    out = {}
    for kernel, env in KERNELS.items():
        for name, value in env.items():
            monkeypatch.setenv(name, value)  # read when the op is built
        runs, names = [], set()
        for t in threads:
            h = plan.handle(threads=t)
            names.add(",".join(h.describe()))  # (the op's name holds a comma)
            runs.append(hostile.run(h, x)[0])
            h.close()
        out[kernel] = (" ".join(sorted(names)), runs)
    flags = _cpu_flags()
    assert "AVX" not in out["portable"][0], out["portable"][0]
    if {"avx2", "fma", "f16c"} <= flags:
        assert "AVX2" in out["avx2"][0], out["avx2"][0]
    if {"avx512f", "avx512bw", "avx512_vnni"} <= flags:
        assert "AVX512-VNNI" in out["vnni"][0], out["vnni"][0]
    return out


def _contract(x, q, scales, group, bits, bias=None):
    """The contract's integers in int64 and its float sum in float64: (S·s_a·s_w summed, the
    bound on a float32 evaluation's error). The activations are quantized with the float32
    operations the contract names (NumPy's rint: half to even)."""
    m, k = x.shape
    blocks = k // group
    xb = x.reshape(m, blocks, group)
    amax = np.abs(np.where(np.isnan(xb), 0, xb)).max(-1).astype(np.float32)
    sa = np.maximum(amax, np.float32(EPS)) / np.float32(127)
    inv = np.float32(1) / sa
    with np.errstate(invalid="ignore"):
        xq = np.clip(np.rint(xb * inv[..., None]), -127, 127)
    xq = np.where(np.isnan(xq), -127, xq).astype(np.int64)
    s = np.einsum("mgk,ngk->mng", xq, q.astype(np.int64).reshape(-1, blocks, group))
    terms = s * (sa[:, None, :].astype(np.float64) * scales[None].astype(np.float64))
    extra = 0 if bias is None else np.abs(bias.astype(np.float64))
    want = terms.sum(-1) + (0 if bias is None else bias.astype(np.float64))
    gamma = (blocks + 3) * 2.0 ** -24 / (1 - (blocks + 3) * 2.0 ** -24)
    return want, 2 * gamma * (np.abs(terms).sum(-1) + extra)


# (M, K, group): M 1..9 (row blocks of 4 and remainders), blocks of 32, odd and even single
# blocks (4 bits: a half padded quad pair), small groups, groups past 4 quad rows (4 bits:
# the int16 sums widened more than once per block)
CASES = [(1, 96, 32), (2, 64, 32), (3, 45, 45), (4, 36, 36), (5, 36, 12), (6, 200, 100),
         (7, 20, 4), (8, 512, 256), (9, 96, 32)]


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("m,k,group", CASES)
def test_kernels_equal_bit_for_bit_and_the_contract(m, k, group, bits, monkeypatch):
    rng = np.random.default_rng(m * 1000 + k + bits)
    n = (40, 67, 17)[m % 3]  # a chunk of 3 panels; 4 full chunks and a 3-column panel; 2 panels
    top = 127 if bits == 8 else 7
    q = rng.integers(-top - 1, top + 1, (n, k)).astype(np.int8)
    scales = (rng.random((n, k // group)) * 0.05 + 0.001).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32) if m % 2 else None
    x = (rng.standard_normal((m, k)) * 3).astype(np.float32)
    x[0, k // 2] = 0.5 * abs(x[0]).max()  # (a value on no step)
    if m > 2:
        x[1, :] = 0  # every block at eps
        x[2, 1] = np.nan  # a NaN: its block's integers unspecified, the same in every kernel
    out = _run_kernels(_plan(q, scales, m, group, bits, bias), x, monkeypatch, threads=(1, 2))
    want, bound = _contract(x, q, scales, group, bits, bias)
    ref = out["portable"][1][0]
    ok = ~np.isnan(x).any(-1)
    assert np.all(np.abs(ref[ok].astype(np.float64) - want[ok]) <= bound[ok])
    for kernel, (name, runs) in out.items():
        for got in runs:
            np.testing.assert_array_equal(got, ref, err_msg=f"{kernel} ({name})")


@pytest.mark.parametrize("bits", [4, 8])
def test_extreme_rows_do_not_saturate(bits, monkeypatch):
    """Activations all ±127 (a block's amax 127: scale 1, so q = x) against weights all at
    the ends of their range, and mixed; scales powers of two, so every result is an integer
    times a power of two, summed exactly: the contract's value, exactly, in every kernel."""
    top = 127 if bits == 8 else 7
    k, group = 128, 32
    ends = [-top - 1, top, -top] if bits == 8 else [-8, 7, -7]
    rows_q = [np.full(k, v) for v in ends] + [np.resize([top, -top - 1], k), np.resize([-top - 1, top], k)]
    q = np.array(rows_q * 4, np.int8)[:18]  # 18 columns: two panels, the second of 2
    scales = np.full((q.shape[0], k // group), 2.0 ** -6, np.float32)
    x = np.array([np.full(k, 127.0), np.full(k, -127.0), np.resize([127.0, -127.0], k),
                  np.resize([-127.0, -127.0, 127.0, 127.0], k), np.resize([127.0] * 5 + [-127.0] * 3, k)],
                 np.float32)
    out = _run_kernels(_plan(q, scales, x.shape[0], group, bits), x, monkeypatch)
    want, _ = _contract(x, q, scales, group, bits)
    for kernel, (name, runs) in out.items():
        np.testing.assert_array_equal(runs[0], want.astype(np.float32), err_msg=f"{kernel} ({name})")
