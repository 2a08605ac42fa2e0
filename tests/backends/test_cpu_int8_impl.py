"""Which oneDNN implementation the cpu backend's int8 convolutions run, and that the one it
steps to computes the same: oneDNN's AMX kernel for 1×1 convolutions loses to its
AVX512-VNNI one when the reduction is short (at most 64 input channels per group), so the
engine takes the next implementation without AMX there (quantization.cpp, short_1x1_without_amx).
On CPUs without AMX oneDNN never offers it, and the same checks hold.

Reference: float64 of the exact integer sums (the one rounding at the end compared as in
test_cpu_qdepthwise.py: equal wherever the value is not within 1e-3 of a rounding
boundary, at most one step off there).

On CPUs without VNNI (AVX2, AVX-512 before Cascade Lake) oneDNN's int8 kernels sum u8·s8
pairs in int16 and saturate, so the engine runs qconv/qmatmul through float32 there
(dequantize, float32 convolution of float32(w)·scale, quantize: quantization.cpp);
OPFORGE_CPU_INT8_FLOAT=1 forces that path, which the last tests take on every CPU.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import test_cpu_hostile_plans as hostile  # noqa: E402
import test_cpu_qdepthwise as qdw  # noqa: E402

pytestmark = hostile.pytestmark

HAS_AMX = "amx_int8" in hostile.cpu_flags()
# where oneDNN's int8 kernels may saturate, the engine takes the float32 path on its own
VIA_FLOAT = not ({"avx512_vnni", "avx_vnni", "amx_int8"} & set(hostile.cpu_flags()))
REQUANT_RELU6 = qdw.REQUANT_RELU6


def _pointwise(c_in, c_out, h, w, *, seed, post, extreme=False):
    """(plan output [N, K, H, W], the op's implementation, the float64 reference and its
    values before each rounding) of a u8 1×1 convolution, channels-last."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, size=(1, c_in, h, w)).astype(np.uint8)
    weights = rng.integers(-127, 128, size=(c_out, c_in, 1, 1)).astype(np.int8)
    if extreme:  # every pair of products 255·127 (or -255·127): what int16 sums saturate on
        x[:] = 255
        weights = np.where(rng.random(weights.shape) < 0.5, 127, -127).astype(np.int8)
    scales = rng.uniform(0.002, 0.02, size=c_out).astype(np.float32)
    bias = rng.normal(0, 2, size=c_out).astype(np.float32)
    x_q, y_q = (0.03, 117), (0.21, 9)
    p = hostile.Plan()
    xt = qdw._channels_last(p, [1, c_in, h, w], "input")
    yt = qdw._channels_last(p, [1, c_out, h, w], "output")
    ins = [xt, p.const(weights), p.const(scales), p.const(bias)]
    # [zp_x, zp_y, scale mask (per output channel), bias, 2-d, strides, pads, dilations]
    p.op("qconv", ins, [yt], [x_q[1], y_q[1], 1, 1, 2, 1, 1, 0, 0, 0, 0, 1, 1], [x_q[0], y_q[0]], post=post)
    handle = p.handle()
    flat = np.ascontiguousarray(x.transpose(0, 2, 3, 1)).reshape(-1)
    got = hostile.run(handle, flat)[0].reshape(1, h, w, c_out).transpose(0, 3, 1, 2)
    # the reference: acc - zp_x·Σw, scaled, biased, the post-ops, to u8
    acc = np.einsum("nchw,kc->nkhw", x.astype(np.int64), weights[:, :, 0, 0].astype(np.int64))
    acc -= x_q[1] * weights.astype(np.int64).sum(axis=(1, 2, 3))[None, :, None, None]
    f = acc * (x_q[0] * scales.astype(np.float64))[None, :, None, None] + bias.astype(np.float64)[None, :, None, None]
    # the convolution's implementation (the float32 path's dequantize and quantize have none)
    impl = next((i for i in handle.impls() if i), "")
    return (got, impl, *qdw.requantized(f, post, y_q))


@pytest.mark.parametrize("c_in,c_out,h", [(16, 96, 12), (24, 144, 7), (32, 16, 9), (64, 40, 5)])
@pytest.mark.parametrize("chain", ["none", "requant_relu6"])
def test_short_reductions_leave_amx_and_stay_exact(c_in, c_out, h, chain):
    post = qdw.CHAINS[chain]
    got, impl, want, rounded = _pointwise(c_in, c_out, h, h + 1, seed=c_in + c_out, post=post)
    assert impl and "amx" not in impl and "ref" not in impl, impl
    qdw._check(got, want, rounded)


def test_long_reductions_keep_what_onednn_chose():
    """At 128 input channels the rule does not apply: AMX where the CPU has it (oneDNN's
    own first choice there), and the answer is the same."""
    got, impl, want, rounded = _pointwise(128, 64, 8, 8, seed=5, post=REQUANT_RELU6)
    assert impl and ("amx" in impl) == (HAS_AMX and not VIA_FLOAT), impl
    qdw._check(got, want, rounded)


def test_own_kernels_report_no_onednn_implementation():
    c = 64
    x, weights, scales, bias = qdw._case(c, 9, 9, seed=3)
    p = hostile.Plan()
    xt = qdw._channels_last(p, [1, c, 9, 9], "input")
    yt = qdw._channels_last(p, [1, c, 9, 9], "output")
    ins = [xt, p.const(weights.reshape(c, 1, 1, 3, 3)), p.const(scales), p.const(bias)]
    p.op("qconv", ins, [yt], [117, 9, 3, 1, 2, 1, 1, 1, 1, 1, 1, 1, 1], [0.05, 0.11])
    handle = p.handle()
    names, impls = handle.describe(), handle.impls()
    if VIA_FLOAT and qdw.OWN not in names:  # dequantize, the float32 convolution, quantize
        assert len(impls) == len(names) == 3 and [bool(i) for i in impls] == [False, True, False], (names, impls)
        return
    assert len(impls) == len(names) == 1
    assert (impls[0] == "") == (names[0] == qdw.OWN), (names, impls)


@pytest.mark.parametrize("extreme, chain", [(False, "none"), (False, "requant_relu6"), (True, "none")])
def test_the_float32_path_gives_the_integer_sums(monkeypatch, extreme, chain):
    """OPFORGE_CPU_INT8_FLOAT=1: the engine dequantizes, convolves in float32 and quantizes,
    and the answer is the exact sums' (the rounding compared as above). The extreme case
    (every input 255, every weight ±127) is what oneDNN's int8 kernels get wrong on a CPU
    without VNNI: 24 output steps off on an 8a8w MLP on an AMD Zen 3 before the engine
    took this path there."""
    monkeypatch.setenv("OPFORGE_CPU_INT8_FLOAT", "1")
    got, impl, want, rounded = _pointwise(64, 40, 5, 6, seed=11, post=qdw.CHAINS[chain], extreme=extreme)
    assert impl and "ref" not in impl, impl
    qdw._check(got, want, rounded)


def test_the_float32_path_is_named_and_can_be_refused(monkeypatch):
    """The engine says which path each int8 op took; =0 keeps oneDNN's int8 kernel."""
    for value, want in (("1", "int8 convolution (via float32)"), ("0", "int8 convolution")):
        monkeypatch.setenv("OPFORGE_CPU_INT8_FLOAT", value)
        p = hostile.Plan()
        xt = qdw._channels_last(p, [1, 16, 4, 4], "input")
        yt = qdw._channels_last(p, [1, 8, 4, 4], "output")
        w = np.ones((8, 16, 1, 1), np.int8)
        ins = [xt, p.const(w), p.const(np.full(8, 0.01, np.float32))]
        p.op("qconv", ins, [yt], [3, 5, 1, 0, 2, 1, 1, 0, 0, 0, 0, 1, 1], [0.1, 0.2])
        names = p.handle().describe()
        assert want in names and (value == "1") == ("dequantize" in names), names
