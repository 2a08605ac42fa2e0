"""Which oneDNN implementation the cpu backend's int8 convolutions run, and that the one it
steps to computes the same: oneDNN's AMX kernel for 1×1 convolutions loses to its
AVX512-VNNI one when the reduction is short (at most 64 input channels per group), so the
engine takes the next implementation without AMX there (quantization.cpp, short_1x1_without_amx).
On CPUs without AMX oneDNN never offers it, and the same checks hold.

Reference: float64 of the exact integer sums (the one rounding at the end compared as in
test_cpu_qdepthwise.py: equal wherever the value is not within 1e-3 of a rounding
boundary, at most one step off there).
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
REQUANT_RELU6 = qdw.REQUANT_RELU6


def _pointwise(c_in, c_out, h, w, *, seed, post):
    """(plan output [N, K, H, W], the op's implementation, the float64 reference and its
    values before each rounding) of a u8 1×1 convolution, channels-last."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, size=(1, c_in, h, w)).astype(np.uint8)
    weights = rng.integers(-127, 128, size=(c_out, c_in, 1, 1)).astype(np.int8)
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
    return (got, handle.impls()[0], *qdw.requantized(f, post, y_q))


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
    assert impl and ("amx" in impl) == HAS_AMX, impl
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
    assert len(impls) == len(names) == 1
    assert (impls[0] == "") == (names[0] == qdw.OWN), (names, impls)
