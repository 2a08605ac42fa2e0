"""The engine's float32 depthwise 3×3 convolution (depthwise.cpp): which convolutions take
it, its numbers against float64 over channel counts around its 16-channel vectors (1, 15,
16, 17, 33, 96), maps around its 8-pixel runs, strides 1 and 2, every padding 0-2 and
uneven ones, batches, strided sources, one and two threads, and the post-ops it runs in
registers (relu, relu6, linear and clip) or after it (GELU); NaN and ±inf inputs must come
out as torch's (a NaN stays NaN through relu and clip, which oneDNN's fused relu maps to 0).
The same plans on oneDNN (OPFORGE_CPU_CAPABILITY=default) must agree.

Tolerance: the worst-case rounding bound of a sum of 9 products and the bias in float32,
|error| ≤ (9 + 2)·2^-24·(Σ|x·w| + |bias|) per output, then the post-ops' own roundings. A
tap, channel or bias lost, or a weight off by 0.1%, is far past it (a 1e-3 relative error
is ~5000× the bound on an output whose terms do not cancel).
"""

from __future__ import annotations

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

OWN = "depthwise convolution 3x3 (own kernel)"
U = 2.0**-24


def _out(size: int, pad_lo: int, pad_hi: int, stride: int) -> int:
    return (size + pad_lo + pad_hi - 3) // stride + 1


def _plan(n, c, h, w, pads=(1, 1, 1, 1), *, stride=1, post="none", bias=True, gap=0, seed=0,
          reader=False):
    """A depthwise convolution of channels-last views of row-major [N, H, W, C(+gap)] input
    and [N, OH, OW, C] output; the pads are (top, left, bottom, right)."""
    rng = np.random.default_rng(seed)
    wt = (rng.standard_normal((c, 1, 3, 3)) / 3).astype(np.float32)
    b = rng.standard_normal(c).astype(np.float32) if bias else np.zeros(c, np.float32)
    oh, ow = _out(h, pads[0], pads[2], stride), _out(w, pads[1], pads[3], stride)
    p = hostile.Plan()
    xr = p.tensor(hostile.F32, [n, h, w, c + gap], role="input")
    xi = p.alias(xr, [n, c, h, w], nhwc([n, c, h, w], gap))
    ins = [xi, p.const(wt, dims=[c, 1, 1, 3, 3])] + ([p.const(b)] if bias else [])
    yr = p.tensor(hostile.F32, [n, oh, ow, c], role="output")
    yi = p.alias(yr, [n, c, oh, ow], nhwc([n, c, oh, ow]))
    entries, operand = [], None
    for e in POSTS[post][0]:
        if e[4] == "channel":
            values = rng.standard_normal(c).astype(np.float32)
            e = [*e[:4], p.const(values, dims=[1, c, 1, 1], strides=[c, 1, 1, 1])]
            operand = values.astype(np.float64).reshape(1, c, 1, 1)
        elif e[4] == "residual":
            raise ValueError("a residual add is another test's")
        entries.append(e)

    def conv(out):
        p.op("conv", ins, [out], [2, stride, stride, *pads, 1, 1, int(bias)], post=entries)
    if reader:  # through a max pooling, which reads the kernel's bound
        read_through_pool(p, yi, [n, c, oh, ow], conv)
    else:
        conv(yi)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    return p, x, wt, b, operand



def reference(x, wt, bias, pads, stride):
    """The exact convolution and Σ|x·w| over each output's window (float64)."""
    n, c, h, w = x.shape
    oh, ow = _out(h, pads[0], pads[2], stride), _out(w, pads[1], pads[3], stride)
    xp = np.zeros((n, c, h + pads[0] + pads[2], w + pads[1] + pads[3]), np.float64)
    xp[:, :, pads[0]:pads[0] + h, pads[1]:pads[1] + w] = x
    win = np.lib.stride_tricks.sliding_window_view(xp, (3, 3), axis=(2, 3))
    win = win[:, :, ::stride, ::stride][:, :, :oh, :ow]  # [N, C, OH, OW, 3, 3]
    w64 = wt.astype(np.float64)[:, 0]
    with np.errstate(invalid="ignore", over="ignore"):
        exact = np.einsum("ncyxij,cij->ncyx", win, w64) + bias[None, :, None, None]
        size = np.einsum("ncyxij,cij->ncyx", np.abs(win), np.abs(w64))
    return exact, size


def check(n, c, h, w, pads=(1, 1, 1, 1), *, stride=1, post="none", threads=1, gap=0,
          bias=True, seed=0, x=None):
    """Runs the plan; asserts its output against float64; returns the handle."""
    p, x0, wt, b, other = _plan(n, c, h, w, pads, stride=stride, post=post, bias=bias, gap=gap,
                                seed=seed)
    x = x0 if x is None else x
    handle = p.handle(threads=threads)
    got = hostile.run(handle, _feed(x, gap))[0].transpose(0, 3, 1, 2)
    exact, size = reference(x, wt, b, pads, stride)
    _, ref, lipschitz = POSTS[post]
    with np.errstate(invalid="ignore", over="ignore"):
        want = ref(exact, other)
        tol = lipschitz * 11 * U * (size + np.abs(b)[None, :, None, None]) + 8 * U * np.abs(want)
    assert_within(got, want, tol)
    return handle


# (N, C, H, W, pads, stride): channels around the 16-lane vector, rows around the 8-pixel
# run (W 7, 8, 9, 17, 26), maps with no interior column (W 1-3), every padding 0-2 and
# uneven ones, stride 2 with odd and even sizes, batches
SHAPES = [
    (1, 16, 16, 16, (1, 1, 1, 1), 1),
    (1, 1, 5, 7, (1, 1, 1, 1), 1),
    (1, 15, 8, 8, (0, 0, 0, 0), 1),
    (2, 17, 9, 9, (1, 1, 1, 1), 2),
    (1, 33, 6, 17, (2, 2, 2, 2), 1),
    (3, 32, 7, 26, (1, 0, 2, 1), 1),
    (1, 96, 10, 11, (0, 2, 1, 0), 2),
    (1, 24, 3, 1, (1, 1, 1, 1), 1),
    (1, 20, 2, 3, (0, 0, 1, 0), 1),
    (1, 48, 12, 12, (0, 1, 0, 1), 2),
]
IDS = [f"{n}x{c}x{h}x{w}-p{''.join(map(str, p))}-s{s}" for n, c, h, w, p, s in SHAPES]
POSTS_HERE = ["none", "relu", "relu6", "scale, clip", "relu, gelu", "add per channel"]


@pytest.mark.parametrize("shape", SHAPES, ids=IDS)
@pytest.mark.parametrize("post", POSTS_HERE)
def test_depthwise_matches_float64(shape, post, capability):
    n, c, h, w, pads, stride = shape
    check(n, c, h, w, pads, stride=stride, post=post, bias=(c + h) % 3 != 0)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("shape", [(1, 32, 112, 112, 1), (2, 144, 28, 28, 2), (1, 16, 3, 40, 1)],
                         ids=["112x112x32", "batch2-s2", "3-rows"])
def test_threads_and_sizes(shape, threads, capability):
    n, c, h, w, stride = shape
    check(n, c, h, w, stride=stride, post="relu6", threads=threads)


def test_strided_source(capability):
    check(1, 24, 9, 13, gap=5, post="relu")      # pixels 29 floats apart
    check(2, 16, 8, 10, gap=3, stride=2)


def _own(monkeypatch):
    own_kernel(monkeypatch, "OPFORGE_CPU_DEPTHWISE")


@pytest.mark.parametrize("post", ["relu", "relu6", "none"])
def test_nan_and_inf_come_out_as_torchs(post, capability):
    """NaN in, NaN out through relu and clip (the own kernel has no NaN guard to fall back
    on); ±inf make ±inf or NaN (inf - inf) as in float64."""
    n, c, h, w = 1, 32, 8, 8
    x = np.random.default_rng(1).standard_normal((n, c, h, w)).astype(np.float32)
    x[0, 3, 2, 5] = np.nan
    x[0, 7, 6, 1] = np.inf
    x[0, 9, 0, 0] = -np.inf
    x[0, 20, 4, 4] = np.inf
    x[0, 20, 4, 5] = -np.inf  # windows with both: NaN
    check(n, c, h, w, post=post, x=x)


def test_the_kernel_takes_depthwise_3x3_and_nothing_else(monkeypatch):
    _own(monkeypatch)

    def names(**kw):
        return _plan(**{"n": 1, "c": 16, "h": 8, "w": 8, **kw})[0].handle().describe()

    assert names() == [OWN]
    assert names(stride=2) == [OWN]
    assert names(post="relu, gelu") == [OWN]
    assert names(pads=(3, 3, 3, 3)) == ["convolution"]      # padding past 2
    p, *_ = _plan(1, 16, 8, 8)
    p.ops[-1]["ia"] = [2, 1, 1, 2, 2, 2, 2, 2, 2, 1]         # dilation 2: same output size
    assert p.handle().describe() == ["convolution"]
    p, *_ = _plan(1, 16, 9, 9, stride=2)
    p.ops[-1]["ia"] = [2, 2, 1, 1, 1, 1, 1, 1, 1, 1]         # strides 2 and 1
    p.tensors[-1]["dims"], p.tensors[-2]["dims"] = [1, 16, 5, 9], [1, 5, 9, 16]
    p.tensors[-1]["strides"], p.tensors[-2]["strides"] = nhwc([1, 16, 5, 9]), hostile.row_major([1, 5, 9, 16])
    assert p.handle().describe() == ["convolution"]
    # a residual add reads another tensor: oneDNN's, with its guard
    p, *_ = _plan(1, 16, 8, 8)
    rr = p.tensor(hostile.F32, [1, 8, 8, 16], role="input")
    p.ops[-1]["post"] = [[1, 100, 0.0, 0.0, p.alias(rr, [1, 16, 8, 8], nhwc([1, 16, 8, 8]))]]
    assert p.handle().describe() == ["convolution"]
    monkeypatch.setenv("OPFORGE_CPU_DEPTHWISE", "0")
    assert names() == ["convolution"]
    monkeypatch.delenv("OPFORGE_CPU_DEPTHWISE")
    monkeypatch.setenv("OPFORGE_CPU_CAPABILITY", "default")
    assert names() == ["convolution"]


@pytest.mark.parametrize("post", ["relu6", "none", "relu, gelu"])
def test_its_output_bound_is_the_largest_magnitude_it_stored(post, monkeypatch):
    """The bound its readers trust to skip their scans for NaN (here a max pooling; a guarded
    convolution too)."""
    _own(monkeypatch)
    p, x, *_ = _plan(1, 20, 9, 9, post=post, reader=True)
    handle = p.handle()
    assert_bounds_follow_calls(handle, lambda v: hostile.run(handle, _feed(v, 0))[0], x, post)


@pytest.mark.parametrize("post", ["relu6", "none"])
def test_a_bound_no_op_reads_is_not_tracked(post, monkeypatch):
    """Without a reader of its bound the kernel skips the per-value peak (a fifth of its
    vector instructions) and sets none; its numbers are the same."""
    _own(monkeypatch)
    p, x, *_ = _plan(1, 20, 9, 9, post=post)
    handle = p.handle()
    got = hostile.run(handle, _feed(x, 0))[0]
    assert handle.out_bounds() == {}
    p, x, *_ = _plan(1, 20, 9, 9, post=post, reader=True)
    read = p.handle()
    np.testing.assert_array_equal(got, hostile.run(read, _feed(x, 0))[0])
    assert list(read.out_bounds()) == [0]


def _chain(weights, post, n=1, c=24, h=10, w=9):
    """Depthwise convolutions (3×3, padding 1) one after another, each with its (weights,
    bias) and the post-ops ``post``, the last one read by a 1×1 max pooling (which reads
    its bound) into the output: [N, H, W, C] in and out."""
    p = hostile.Plan()
    dims = [n, c, h, w]
    xr = p.tensor(hostile.F32, [n, h, w, c], role="input")
    x = p.alias(xr, dims, nhwc(dims))
    yr = p.tensor(hostile.F32, [n, h, w, c], role="output")
    y = p.alias(yr, dims, nhwc(dims))
    for k, (wt, b) in enumerate(weights):
        ins = [x, p.const(wt, dims=[c, 1, 1, 3, 3]), p.const(b)]

        def conv(out, ins=ins):
            p.op("conv", ins, [out], [2, 1, 1, 1, 1, 1, 1, 1, 1, 1], post=POSTS[post][0])
        if k + 1 < len(weights):
            x = p.tensor(hostile.F32, dims, nhwc(dims))
            conv(x)
        else:
            read_through_pool(p, y, dims, conv)
    return p


@pytest.mark.parametrize("post", ["relu6", "none"])
def test_a_bound_proved_from_the_input_replaces_the_peaks(post, monkeypatch):
    """A depthwise convolution whose input comes from an op with a bound (here another
    one) proves its own: |sum| ≤ bound·max Σ|taps| + max|bias|, through the clamps. Its
    numbers are those of the same convolution run alone (which tracks its peaks), its
    bound covers every value, and a NaN in the input falls back to the peaks (inf)."""
    _own(monkeypatch)
    rng = np.random.default_rng(7)
    c = 24
    layers = [((rng.standard_normal((c, 1, 3, 3)) / 2).astype(np.float32),
               rng.standard_normal(c).astype(np.float32)) for _ in range(2)]
    x = rng.standard_normal((1, 10, 9, c)).astype(np.float32)
    chain = _chain(layers, post).handle()
    got = hostile.run(chain, x)[0]
    first = hostile.run(_chain(layers[:1], post).handle(), x)[0]
    alone = _chain(layers[1:], post).handle()
    np.testing.assert_array_equal(got, hostile.run(alone, first)[0])
    bounds = chain.out_bounds()
    assert bounds[0] == float(np.abs(first).max())  # the first one's peaks (no producer)
    wt, b = layers[1]
    proof = (bounds[0] * np.abs(wt.astype(np.float64)).sum((1, 2, 3)).max()
             + np.abs(b.astype(np.float64)).max()) * (1 + 1e-5)
    top = float(np.abs(got).max())
    if post == "relu6":
        assert bounds[1] == 6.0 and top < 6.0  # the clamp's, not the largest value stored
    else:
        assert top <= bounds[1] <= proof * (1 + 1e-5) and bounds[1] > top
    assert alone.out_bounds()[0] == top  # alone: its peaks
    x[0, 4, 4, 3] = np.nan
    got = hostile.run(chain, x)[0]
    assert np.isnan(got).any()
    assert chain.out_bounds() == {0: np.inf, 1: np.inf}


# --- cases for the sanitized run (test_cpu_sanitized.py): edges, paddings, strides, threads
CASES, EXPECT = hostile.ran_ok_cases({
    **{f"depthwise_{i}": (lambda s=s: (check(*s[:5], stride=s[5], post="relu6"), "ran ok")[1])
       for i, s in zip(IDS, SHAPES)},
    "depthwise_two_threads": lambda: (check(2, 48, 9, 9, stride=2, threads=2), "ran ok")[1],
    "depthwise_strided": lambda: (check(1, 24, 9, 13, gap=5, post="relu, gelu"), "ran ok")[1],
})
test_the_case_file_runs = hostile.case_file_test(__file__, CASES, EXPECT)


if __name__ == "__main__":
    hostile.report_cases(CASES, sys.argv[1:])
