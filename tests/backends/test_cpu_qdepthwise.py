"""The engine's uint8 depthwise 3×3 convolution kernel (native/qdepthwise.cpp: AVX-512
VNNI, channels a multiple of 64) and oneDNN's int8 convolution it replaces there
(``OPFORGE_CPU_CAPABILITY=default``, what a CPU without VNNI runs), each against an exact
reference computed here: the int32 sums in int64, the scales, bias and post-ops in
float64, round half to even.

Both compute the epilogue in float32: a value within float32's error of a rounding
boundary (in the post-op round or the final one) may land on either side. So an output
must equal the reference wherever both roundings are clear of a boundary by 1e-3 (float32
carries ~1e-7 relative; the values here are below 300, so 3e-5 absolute), and be within
one step elsewhere; at least 98% of the outputs must be clear. A wrong tap, weight lane,
zero-point compensation or channel order gives errors of many steps on most outputs.
Shapes cover images smaller than the window (every tap a padding), odd and even sizes,
strides 1 and 2, paddings 0, 1, 2 and one-sided, batches of 2 and 2 threads.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import test_cpu_hostile_plans as hostile  # noqa: E402

pytestmark = hostile.pytestmark

LINEAR, RELU, CLIP, ROUND = 6, 0, 13, 16  # the blob's eltwise codes (lowering/core.py)
OWN = "int8 depthwise 3x3 (own kernel)"
HAS_VNNI = {"avx512_vnni", "avx512bw"} <= hostile.cpu_flags()


capability = hostile.capability  # the engine's own kernels, then oneDNN's paths


def channels_last(dims):
    n, c, h, w = dims
    return [h * w * c, 1, w * c, c]


def _channels_last(plan, dims, role) -> int:
    """A [N, C, H, W] view, channels-last, of a flat delegate input or output (which the
    runtime passes C-contiguous)."""
    flat = plan.tensor(hostile.U8, [int(np.prod(dims))], role=role)
    return plan.alias(flat, dims, channels_last(dims))


def _conv(x, weights, scales, bias, *, stride, pads, x_q, y_q, post, threads=1, dilation=1):
    """The plan's output and op names: x u8 [N, C, H, W] (channels-last), weights s8 [C, 3, 3]."""
    n, c, h, w = x.shape
    (pt, pl), (pb, pr) = pads
    k = 2 * dilation + 1
    oh, ow = (h + pt + pb - k) // stride + 1, (w + pl + pr - k) // stride + 1
    p = hostile.Plan()
    xt = _channels_last(p, [n, c, h, w], "input")
    ins = [xt, p.const(weights.reshape(c, 1, 1, 3, 3)), p.const(scales)]
    if bias is not None:
        ins.append(p.const(bias))
    yt = _channels_last(p, [n, c, oh, ow], "output")
    mask = 3 if scales.size == c else 0
    ia = [x_q[1], y_q[1], mask, int(bias is not None), 2, stride, stride, pt, pl, pb, pr,
          dilation, dilation]
    p.op("qconv", ins, [yt], ia, [x_q[0], y_q[0]], post=post)
    handle = p.handle(threads=threads)
    out = hostile.run(handle, np.ascontiguousarray(x.transpose(0, 2, 3, 1)).reshape(-1))[0]
    return out.reshape(n, oh, ow, c).transpose(0, 3, 1, 2), handle.describe()


def _reference(x, weights, scales, bias, *, stride, pads, x_q, y_q, post):
    """(output, the fractional parts at each rounding) in float64."""
    n, c, h, w = x.shape
    (pt, pl), (pb, pr) = pads
    xp = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (pt, pb), (pl, pr)), constant_values=x_q[1])
    oh, ow = (h + pt + pb - 3) // stride + 1, (w + pl + pr - 3) // stride + 1
    acc = np.zeros((n, c, oh, ow), np.int64)
    for kh in range(3):
        for kw in range(3):
            tap = xp[:, :, kh:kh + stride * (oh - 1) + 1:stride, kw:kw + stride * (ow - 1) + 1:stride]
            acc += tap * weights[:, kh, kw].astype(np.int64)[None, :, None, None]
    acc -= x_q[1] * weights.astype(np.int64).sum(axis=(1, 2))[None, :, None, None]
    s = np.broadcast_to(scales.astype(np.float64), (c,))[None, :, None, None]
    f = acc * (x_q[0] * s) + (0.0 if bias is None else bias.astype(np.float64)[None, :, None, None])
    return requantized(f, post, y_q)


def requantized(f, post, y_q):
    """The u8 output of the float64 accumulator values f after the post-ops, and the values
    before each rounding (the int8 convolutions' epilogue, exactly)."""
    rounded = []
    for _, code, a, b, _ in post:
        if code == LINEAR:
            f = a * f + b
        elif code == ROUND:
            rounded.append(f.copy())
            f = np.round(f)
        elif code == CLIP:
            f = np.clip(f, a, b)
        else:
            f = np.maximum(f, 0.0)
    v = f / y_q[0]
    rounded.append(v)
    return np.clip(np.round(v) + y_q[1], 0, 255), rounded


def _check(got, want, rounded):
    clear = np.ones(got.shape, bool)
    for v in rounded:
        clear &= np.abs(np.abs(v - np.floor(v)) - 0.5) > 1e-3
    diff = np.abs(got.astype(np.int64) - want.astype(np.int64))
    assert clear.mean() > 0.98, clear.mean()
    assert diff[clear].max(initial=0) == 0, (int(diff[clear].max()), int(np.count_nonzero(diff[clear])))
    assert diff.max(initial=0) <= 1
    assert len(np.unique(want)) > 8  # outputs spread over the range, not clipped to one end


REQUANT_RELU6 = [[0, LINEAR, 6.25, 0.0, -1], [0, ROUND, 0.0, 0.0, -1], [0, CLIP, -120.0, 135.0, -1],
                 [0, LINEAR, 0.16, 0.0, -1], [0, CLIP, 0.0, 6.0, -1]]
FOLDED = [[0, ROUND, 0.0, 0.0, -1], [0, CLIP, -20.0, 37.5, -1]]
CHAINS = {"none": [], "folded": FOLDED, "requant_relu6": REQUANT_RELU6, "relu": [[0, RELU, 0.0, 0.0, -1]]}


def _case(c, h, w, seed, n=1, per_channel=True, with_bias=True):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, (n, c, h, w), dtype=np.uint8)
    weights = rng.integers(-127, 128, (c, 3, 3), dtype=np.int8)
    scales = (rng.random(c if per_channel else 1) * 0.004 + 0.002).astype(np.float32)
    bias = (rng.standard_normal(c) * 2).astype(np.float32) if with_bias else None
    return x, weights, scales, bias


SHAPES = [  # (C, H, W, stride, ((pad_t, pad_l), (pad_b, pad_r)))
    (64, 9, 12, 1, ((1, 1), (1, 1))),
    (128, 7, 5, 2, ((1, 1), (1, 1))),
    (192, 8, 8, 2, ((0, 0), (1, 1))),     # one-sided ("same" at stride 2)
    (64, 6, 7, 1, ((0, 0), (0, 0))),      # no padding
    (64, 5, 4, 1, ((2, 2), (2, 2))),      # padding 2: rows and columns of only padding
    (128, 1, 1, 1, ((1, 1), (1, 1))),     # one pixel: 8 of 9 taps are padding
    (64, 2, 3, 2, ((1, 1), (1, 1))),
]


@pytest.mark.parametrize("shape", SHAPES, ids=[f"c{s[0]}_{s[1]}x{s[2]}_s{s[3]}" for s in SHAPES])
@pytest.mark.parametrize("chain", list(CHAINS))
def test_depthwise_matches_the_exact_reference(capability, shape, chain):
    c, h, w, stride, pads = shape
    x, weights, scales, bias = _case(c, h, w, seed=c + h + w + stride)
    kw = dict(stride=stride, pads=pads, x_q=(0.05, 117), y_q=(0.11 if chain != "folded" else 0.9, 9),
              post=CHAINS[chain])
    got, names = _conv(x, weights, scales, bias, **kw)
    assert (OWN in names) == (capability == "native" and HAS_VNNI), names
    _check(got, *_reference(x, weights, scales, bias, **kw))


@pytest.mark.parametrize("per_channel, with_bias, x_zp, threads", [
    (False, False, 0, 1), (True, False, 255, 2), (True, True, 128, 2)])
def test_batches_zero_points_scales_and_threads(capability, per_channel, with_bias, x_zp, threads):
    x, weights, scales, bias = _case(128, 13, 11, seed=5, n=2, per_channel=per_channel,
                                     with_bias=with_bias)
    kw = dict(stride=1, pads=((1, 1), (1, 1)), x_q=(0.05, x_zp), y_q=(0.11, 60), post=REQUANT_RELU6)
    got, names = _conv(x, weights, scales, bias, threads=threads, **kw)
    assert (OWN in names) == (capability == "native" and HAS_VNNI), names
    _check(got, *_reference(x, weights, scales, bias, **kw))


@pytest.mark.parametrize("what", ["channels_96", "dilation_2", "binary_post_op", "leaky_relu"])
def test_what_the_kernel_does_not_take_stays_on_onednn(what):
    c = 96 if what == "channels_96" else 64
    x, weights, scales, bias = _case(c, 9, 9, seed=3)
    p = hostile.Plan()
    xt = _channels_last(p, [1, c, 9, 9], "input")
    dil = 2 if what == "dilation_2" else 1
    o = 9 - 2 * dil + 2
    yt = _channels_last(p, [1, c, o, o], "output")
    post = {"binary_post_op": [[1, 100, 0.0, 0.0, xt]],
            "leaky_relu": [[0, RELU, 0.1, 0.0, -1]]}.get(what, [])
    ins = [xt, p.const(weights.reshape(c, 1, 1, 3, 3)), p.const(scales), p.const(bias)]
    p.op("qconv", ins, [yt], [117, 9, 3, 1, 2, 1, 1, 1, 1, 1, 1, dil, dil], [0.05, 0.11], post=post)
    names = p.handle().describe()
    # (on a CPU without VNNI: "int8 convolution (via float32)", quantization.cpp)
    assert OWN not in names and any(n.startswith("int8 convolution") for n in names), names


# --- cases for the sanitized run (test_cpu_sanitized.py): the kernel on the plans above
# that reach every border path, and on scales a hostile blob may hold (inf, NaN-making 0·inf),
# each checked here as in the tests, or (hostile) only run to its end

def _case_file(shape, chain, threads=1):
    c, h, w, stride, pads = shape
    x, weights, scales, bias = _case(c, h, w, seed=11, n=2)
    kw = dict(stride=stride, pads=pads, x_q=(0.05, 117), y_q=(0.11, 9), post=CHAINS[chain])
    got, _ = _conv(x, weights, scales, bias, threads=threads, **kw)
    _check(got, *_reference(x, weights, scales, bias, **kw))
    return "ran ok"


def qdw_borders():
    return _case_file(SHAPES[4], "requant_relu6")


def qdw_one_pixel():
    return _case_file(SHAPES[5], "folded")


def qdw_stride2_one_sided_threads():
    return _case_file(SHAPES[2], "relu", threads=2)


def qdw_infinite_scales():
    x, weights, scales, bias = _case(64, 5, 5, seed=2)
    scales[:7] = np.inf
    weights[:3] = 0  # 0 · inf: NaN before the conversion
    got, _ = _conv(x, weights, scales, bias, stride=1, pads=((1, 1), (1, 1)), x_q=(0.05, 117),
                   y_q=(0.11, 9), post=FOLDED)
    assert got.dtype == np.uint8 and got.shape == (1, 64, 5, 5)
    return "ran ok"


CASES = {f.__name__: f for f in [qdw_borders, qdw_one_pixel, qdw_stride2_one_sided_threads,
                                 qdw_infinite_scales]}
EXPECT = {name: "ran ok$" for name in CASES}


def test_the_case_file_runs():
    hostile.check_case_file(__file__, list(CASES), EXPECT)


if __name__ == "__main__":
    hostile.report_cases(CASES, sys.argv[1:])
