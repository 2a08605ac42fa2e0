"""The engine's direct kernel for small float32 convolutions (smallconv.cpp): which
convolutions take it, its numbers against float64 over kernel sizes 1-5, strides 1-3,
paddings 0-2 (uneven ones too), input channels 8-32, output channels around its 16-channel
panels and 4-panel blocks (1, 8, 20, 64, 70), output rows around its 6-pixel blocks,
batches, strided sources and two threads, with the post-ops it runs in registers (relu,
relu6, linear and clip) or after it (GELU); NaN and ±inf inputs must come out as torch's (a
NaN stays NaN through relu and clip). The same plans on oneDNN
(OPFORGE_CPU_CAPABILITY=default) must agree.

Tolerance: the worst-case rounding bound of a sum of C·KH·KW products and the bias in
float32, |error| ≤ (C·KH·KW + 2)·2^-24·(Σ|x·w| + |bias|) per output, then the post-ops'
own roundings. A lost term, channel or bias, or a weight off by 0.1%, is far past it.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import test_cpu_hostile_plans as hostile  # noqa: E402
from test_cpu_winograd import (  # noqa: E402
    POSTS, _feed, assert_bounds_follow_calls, assert_within, nhwc, own_kernel, read_through_pool)

pytestmark = hostile.pytestmark
capability = hostile.capability  # the engine's own kernels, then oneDNN's paths

OWN = "convolution (own small kernel)"
U = 2.0**-24


def _out(size, lo, hi, k, s):
    return (size + lo + hi - k) // s + 1


def _plan(n, c, k, h, w, kernel=(3, 3), stride=(1, 1), pads=(1, 1, 1, 1), *, post="none", bias=True,
          gap=0, grouped=False, seed=0, weights=None, reader=False):
    """A convolution of channels-last views of row-major [N, H, W, C(+gap)] input and
    [N, OH, OW, K] output; pads are (top, left, bottom, right)."""
    rng = np.random.default_rng(seed)
    kh, kw = kernel
    wt = (rng.standard_normal((k, c, kh, kw)) / np.sqrt(c * kh * kw)).astype(np.float32)
    if weights is not None:
        wt = weights
    b = rng.standard_normal(k).astype(np.float32) if bias else np.zeros(k, np.float32)
    oh, ow = _out(h, pads[0], pads[2], kh, stride[0]), _out(w, pads[1], pads[3], kw, stride[1])
    p = hostile.Plan()
    xr = p.tensor(hostile.F32, [n, h, w, c + gap], role="input")
    xi = p.alias(xr, [n, c, h, w], nhwc([n, c, h, w], gap))
    wi = p.const(wt, dims=[1, k, c, kh, kw]) if grouped else p.const(wt)
    ins = [xi, wi] + ([p.const(b)] if bias else [])
    yr = p.tensor(hostile.F32, [n, oh, ow, k], role="output")
    yi = p.alias(yr, [n, k, oh, ow], nhwc([n, k, oh, ow]))
    entries, operand = [], None
    for e in POSTS[post][0]:
        if e[4] == "channel":
            values = rng.standard_normal(k).astype(np.float32)
            e = [*e[:4], p.const(values, dims=[1, k, 1, 1], strides=[k, 1, 1, 1])]
            operand = values.astype(np.float64).reshape(1, k, 1, 1)
        elif e[4] == "residual":
            raise ValueError("a residual add is another test's")
        entries.append(e)

    def conv(out):
        p.op("conv", ins, [out], [2, *stride, *pads, 1, 1, int(bias)], post=entries)
    if reader:  # through a max pooling, which reads the kernel's bound
        read_through_pool(p, yi, [n, k, oh, ow], conv)
    else:
        conv(yi)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    return p, x, wt, b, operand



def reference(x, wt, bias, pads, stride):
    """The exact convolution and Σ|x·w| over each output's window (float64)."""
    n, c, h, w = x.shape
    k, _, kh, kw = wt.shape
    oh, ow = _out(h, pads[0], pads[2], kh, stride[0]), _out(w, pads[1], pads[3], kw, stride[1])
    xp = np.zeros((n, c, h + pads[0] + pads[2], w + pads[1] + pads[3]), np.float64)
    xp[:, :, pads[0]:pads[0] + h, pads[1]:pads[1] + w] = x
    win = np.lib.stride_tricks.sliding_window_view(xp, (kh, kw), axis=(2, 3))
    win = win[:, :, ::stride[0], ::stride[1]][:, :, :oh, :ow]  # [N, C, OH, OW, KH, KW]
    w64 = wt.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        exact = np.einsum("ncyxij,kcij->nkyx", win, w64) + bias[None, :, None, None]
        size = np.einsum("ncyxij,kcij->nkyx", np.abs(win), np.abs(w64))
    return exact, size


def check(n, c, k, h, w, kernel=(3, 3), stride=(1, 1), pads=(1, 1, 1, 1), *, post="none", threads=1,
          gap=0, bias=True, grouped=False, seed=0, x=None):
    """Runs the plan; asserts its output against float64; returns the handle."""
    p, x0, wt, b, other = _plan(n, c, k, h, w, kernel, stride, pads, post=post, bias=bias, gap=gap,
                                grouped=grouped, seed=seed)
    x = x0 if x is None else x
    handle = p.handle(threads=threads)
    got = hostile.run(handle, _feed(x, gap))[0].transpose(0, 3, 1, 2)
    exact, size = reference(x, wt, b, pads, stride)
    terms = c * kernel[0] * kernel[1]
    _, ref, lipschitz = POSTS[post]
    with np.errstate(invalid="ignore", over="ignore"):
        want = ref(exact, other)
        tol = (lipschitz * (terms + 2) * U * (size + np.abs(b)[None, :, None, None])
               + 8 * U * np.abs(want))
    assert_within(got, want, tol)
    return handle


# (N, C, K, H, W, kernel, stride, pads): the zoo's layers (cnn's 8 → 16, resnet_block's
# strided 3×3 and 1×1, depthwise_separable's pointwise one), output channels around the
# panel (1, 8, 20) and the 4-panel block (64, 70), rows around the blocks of 16, 8 and 6
# pixels and their tails (W 1, 3, 5, 7, 13, 21), kernels 1-5 and non-square, strides 1-3,
# paddings 0-2 and uneven, batches
SHAPES = [
    (1, 8, 8, 32, 32, (3, 3), (1, 1), (1, 1, 1, 1)),
    (1, 8, 16, 16, 16, (3, 3), (1, 1), (1, 1, 1, 1)),
    (1, 16, 32, 16, 16, (3, 3), (2, 2), (1, 1, 1, 1)),
    (1, 16, 32, 16, 16, (1, 1), (2, 2), (0, 0, 0, 0)),
    (1, 16, 32, 16, 16, (1, 1), (1, 1), (0, 0, 0, 0)),
    (2, 9, 20, 7, 9, (2, 3), (1, 2), (0, 1, 1, 2)),
    (1, 8, 70, 6, 5, (3, 3), (1, 1), (2, 2, 2, 2)),
    (1, 8, 1, 3, 3, (3, 3), (1, 1), (0, 0, 0, 0)),
    (3, 10, 64, 13, 11, (5, 5), (3, 3), (2, 0, 1, 2)),
    (1, 12, 9, 1, 7, (1, 3), (1, 1), (0, 1, 0, 1)),
    (1, 11, 24, 5, 21, (3, 3), (1, 1), (1, 1, 1, 1)),
]
IDS = [f"{n}x{c}x{k}x{h}x{w}-k{kh}{kw}-s{s[0]}{s[1]}-p{''.join(map(str, p))}"
       for n, c, k, h, w, (kh, kw), s, p in SHAPES]
POSTS_HERE = ["none", "relu", "relu6", "scale, clip", "relu, gelu", "add per channel"]


@pytest.mark.parametrize("shape", SHAPES, ids=IDS)
@pytest.mark.parametrize("post", POSTS_HERE)
def test_small_conv_matches_float64(shape, post, capability):
    n, c, k, h, w, kernel, stride, pads = shape
    check(n, c, k, h, w, kernel, stride, pads, post=post, bias=(c + k) % 3 != 0)


@pytest.mark.parametrize("threads", [1, 2])
def test_two_threads_and_the_largest(threads, capability):
    # 2^21 multiply-adds exactly: 32·32 pixels × 64 outputs × 32 terms (a 1×1 of 32 channels)
    handle = check(1, 32, 64, 32, 32, (1, 1), (1, 1), (0, 0, 0, 0), post="relu6", threads=threads)
    check(2, 8, 24, 20, 20, (3, 3), (1, 1), (1, 1, 1, 1), post="relu", threads=threads)
    assert handle is not None


def test_strided_and_grouped_sources(capability):
    check(1, 8, 16, 9, 9, gap=5, post="relu")                             # pixels 13 floats apart
    check(1, 8, 16, 9, 9, (1, 1), (2, 2), (0, 0, 0, 0), gap=3)            # unpadded, strided
    check(1, 8, 16, 9, 9, (1, 3), (1, 1), (0, 0, 0, 0), gap=2)            # unpadded, KW runs of C
    check(2, 8, 12, 6, 7, grouped=True)                                   # weights [1, K, C, 3, 3]


@pytest.mark.parametrize("post", ["relu", "relu6", "none"])
def test_nan_and_inf_come_out_as_torchs(post, capability):
    n, c, k, h, w = 1, 8, 16, 8, 8
    x = np.random.default_rng(1).standard_normal((n, c, h, w)).astype(np.float32)
    x[0, 3, 2, 5] = np.nan
    x[0, 7, 6, 1] = np.inf
    x[0, 1, 0, 0] = -np.inf
    check(n, c, k, h, w, post=post, x=x)


def _own(monkeypatch):
    own_kernel(monkeypatch, "OPFORGE_CPU_SMALL_CONV")


def test_the_kernel_takes_small_convolutions_and_nothing_else(monkeypatch):
    _own(monkeypatch)

    def names(*args, **kw):
        return _plan(*args, **kw)[0].handle().describe()

    assert names(1, 8, 8, 32, 32) == [OWN]
    assert names(1, 7, 8, 32, 32) == ["convolution"]                  # fewer than 8 channels in
    assert names(1, 16, 32, 16, 16, (1, 1), (2, 2), (0, 0, 0, 0)) == [OWN]
    assert names(1, 16, 16, 8, 8) == ["convolution (Winograd F(4x4 3x3))"]  # Winograd's
    assert names(1, 32, 64, 32, 32, (1, 1), (1, 1), (0, 0, 0, 0)) == [OWN]  # 2^21
    assert names(1, 32, 65, 32, 32, (1, 1), (1, 1), (0, 0, 0, 0)) == ["convolution"]  # past it
    assert names(1, 8, 16, 8, 8, grouped=True) == [OWN]
    # dilation 2: oneDNN's
    p, *_ = _plan(1, 8, 16, 8, 8)
    p.ops[-1]["ia"] = [2, 1, 1, 2, 2, 2, 2, 2, 2, 1]  # (paddings 2 keep an 8×8 output)
    assert p.handle().describe() == ["convolution"]
    # an infinite weight with padding: 0·inf would be NaN where oneDNN skips the tap
    wt = np.ones((16, 8, 3, 3), np.float32)
    wt[3, 2, 1, 1] = np.inf
    assert names(1, 8, 16, 8, 8, weights=wt) == ["convolution"]
    assert names(1, 8, 16, 8, 8, pads=(0, 0, 0, 0), weights=wt) == [OWN]
    monkeypatch.setenv("OPFORGE_CPU_SMALL_CONV", "0")
    assert names(1, 8, 8, 32, 32) == ["convolution"]
    monkeypatch.delenv("OPFORGE_CPU_SMALL_CONV")
    monkeypatch.setenv("OPFORGE_CPU_CAPABILITY", "default")
    assert names(1, 8, 8, 32, 32) == ["convolution"]


@pytest.mark.parametrize("post", ["relu6", "none", "relu, gelu"])
def test_its_output_bound_is_the_largest_magnitude_it_stored(post, monkeypatch):
    """The bound its readers trust to skip their scans for NaN (here a max pooling; a guarded
    convolution too)."""
    _own(monkeypatch)
    p, x, *_ = _plan(1, 8, 20, 9, 9, post=post, reader=True)
    handle = p.handle()
    assert_bounds_follow_calls(handle, lambda v: hostile.run(handle, _feed(v, 0))[0], x, post)


def test_its_output_bound_covers_every_image_of_a_batch(monkeypatch):
    """A batch of 3 whose first image holds the largest value, then a NaN: the bound is over
    all images (each image's rows keep their own peaks), not the last image's alone."""
    _own(monkeypatch)
    p, x, *_ = _plan(3, 8, 20, 9, 9, post="none", reader=True)
    handle = p.handle()
    x[0] *= 50
    got = hostile.run(handle, _feed(x, 0))[0]
    assert handle.out_bounds() == {0: float(np.abs(got).max())}, (
        f"the bound {handle.out_bounds()} is not the largest magnitude of the batch's output, "
        f"{float(np.abs(got).max())} (image 0's), last image's {float(np.abs(got[-1]).max())}")
    x[0, 3, 2, 2] = np.nan
    assert np.isnan(hostile.run(handle, _feed(x, 0))[0][0]).any()
    assert handle.out_bounds() == {0: math.inf}, "a NaN in image 0 of 3 left the bound finite"


@pytest.mark.parametrize("post", ["relu6", "none"])
def test_a_bound_no_op_reads_is_not_tracked(post, monkeypatch):
    """Without a reader of its bound the kernel skips the per-value peak (a fifth of its
    vector instructions) and sets none; its numbers are the same."""
    _own(monkeypatch)
    p, x, *_ = _plan(1, 8, 20, 9, 9, post=post)
    handle = p.handle()
    got = hostile.run(handle, _feed(x, 0))[0]
    assert handle.out_bounds() == {}
    p, x, *_ = _plan(1, 8, 20, 9, 9, post=post, reader=True)
    read = p.handle()
    np.testing.assert_array_equal(got, hostile.run(read, _feed(x, 0))[0])
    assert list(read.out_bounds()) == [0]


# --- cases for the sanitized run (test_cpu_sanitized.py): blocks, edges, paddings, threads
CASES, EXPECT = hostile.ran_ok_cases({
    **{f"small_conv_{i}": (lambda s=s: (check(*s, post="relu6"), "ran ok")[1])
       for i, s in zip(IDS, SHAPES)},
    "small_conv_two_threads": lambda: (check(2, 8, 24, 20, 20, threads=2), "ran ok")[1],
    "small_conv_strided": lambda: (check(1, 8, 16, 9, 9, gap=5, post="relu, gelu"), "ran ok")[1],
})
test_the_case_file_runs = hostile.case_file_test(__file__, CASES, EXPECT)


if __name__ == "__main__":
    hostile.report_cases(CASES, sys.argv[1:])
