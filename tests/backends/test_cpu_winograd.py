"""The engine's Winograd F(4×4, 3×3) convolution (winograd.cpp): which convolutions take
it, its numbers against float64 over channel counts around its blocks (16 channels a
register, 4 panels of output channels, 6 tiles a row block, 12 a block), map sizes that are
no multiple of its 4×4 tiles, every padding it takes, batches, strided sources, one and two
threads, and the post-ops it runs in registers (relu, clip, linear, a residual add) or after
it (GELU, a broadcast add); NaN, inf and huge inputs must run the direct convolution and get
torch's numbers. The same plans on oneDNN (OPFORGE_CPU_CAPABILITY=default) must agree.

Tolerance: both paths are held to the direct kernel's worst-case rounding bound: a sum of
9·C products and the bias, |error| ≤ (9·C + 2)·2^-24·(Σ|x·w| + |bias|) per output. The
Winograd kernel meets it with room (its largest error is 0.05-0.23 of it over these shapes,
the largest at C = 16, where the bound is smallest: measured at this commit; the kernel's
instructions are the same on every AVX-512 CPU, so the numbers are too). A bound derived for
Winograd itself (the same roundings through |Aᵀ|, |G|, |Bᵀ| in absolute value) is 300-700×
looser and would let a 0.1% kernel error through; this one does not (a 1e-3 relative error
is 20-100× over it). A wrong transform coefficient or a dropped channel is off by the
outputs' size.
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

RELU, LINEAR, CLIP, GELU, ADD = 0, 6, 13, 15, 100  # the blob's codes (lowering/core.py)
WINOGRAD = "convolution (Winograd F(4x4 3x3))"
U = 2.0**-24

def _gelu(v: np.ndarray) -> np.ndarray:
    return 0.5 * v * (1 + np.vectorize(math.erf, otypes=[np.float64])(v / math.sqrt(2)))


# post-op chains: the blob's entries (a residual's tensor filled in by _plan), the
# reference on float64, and the factor the chain multiplies an error by at most
POSTS = {
    "none": ([], lambda v, r: v, 1.0),
    "relu": ([[0, RELU, 0.0, 0.0, -1]], lambda v, r: np.maximum(v, 0), 1.0),
    "relu6": ([[0, CLIP, 0.0, 6.0, -1]], lambda v, r: np.clip(v, 0, 6), 1.0),
    "scale, clip": ([[0, LINEAR, -0.5, 0.25, -1], [0, CLIP, -1.0, 1.0, -1]],
                    lambda v, r: np.clip(v * -0.5 + 0.25, -1, 1), 0.5),
    "add, relu": ([[1, ADD, 0.0, 0.0, "residual"], [0, RELU, 0.0, 0.0, -1]],
                  lambda v, r: np.maximum(v + r, 0), 1.0),
    # relu in the kernel, GELU after it in place (the Epilogue)
    "relu, gelu": ([[0, RELU, 0.0, 0.0, -1], [0, GELU, 0.0, 0.0, -1]],
                   lambda v, r: _gelu(np.maximum(v, 0)), 1.13),
    # an add of one value per channel (broadcast): after the kernel, in place
    "add per channel": ([[1, ADD, 0.0, 0.0, "channel"]], lambda v, r: v + r, 1.0),
    # five register-able steps: the Winograd kernel holds four (kMaxSteps), the fifth runs
    # after it in place; the two scales multiply the error by 2 × 0.5
    "five steps": ([[0, LINEAR, 2.0, 0.5, -1], [0, CLIP, -3.0, 3.0, -1], [0, LINEAR, -0.5, 0.25, -1],
                    [0, CLIP, -1.0, 1.0, -1], [0, RELU, 0.0, 0.0, -1]],
                   lambda v, r: np.maximum(np.clip(np.clip(v * 2.0 + 0.5, -3, 3) * -0.5 + 0.25, -1, 1), 0),
                   1.0),
}


def nhwc(dims, gap=0):
    """Channels-last strides of [N, C, H, W] (`gap` extra elements after each pixel)."""
    n, c, h, w = dims
    return [h * w * (c + gap), 1, w * (c + gap), c + gap]


def _windows(x: np.ndarray, pads, oh: int, ow: int) -> np.ndarray:
    """[N, C, OH, OW, 3, 3]: each output's window of x padded with zeros."""
    pt, pl = pads[0], pads[1]
    n, c, h, w = x.shape
    xp = np.zeros((n, c, max(oh + 2, pt + h), max(ow + 2, pl + w)), np.float64)
    xp[:, :, pt:pt + h, pl:pl + w] = x
    return np.lib.stride_tricks.sliding_window_view(xp, (3, 3), axis=(2, 3))[:, :, :oh, :ow]


def reference(x, wt, bias, pads):
    """The exact convolution and Σ|x·w| over each output's window."""
    n, c, h, w = x.shape
    oh, ow = h + pads[0] + pads[2] - 2, w + pads[1] + pads[3] - 2
    taps = _windows(x, pads, oh, ow)                 # [N, C, OH, OW, 3, 3]
    w64 = wt.astype(np.float64)
    exact = np.einsum("ncyxij,kcij->nkyx", taps, w64) + bias[None, :, None, None]
    size = np.einsum("ncyxij,kcij->nkyx", np.abs(taps), np.abs(w64))
    return exact, size


def _plan(n, c, k, h, w, pads, *, post="none", bias=True, gap=0, grouped=False, seed=0):
    rng = np.random.default_rng(seed)
    wt = (rng.standard_normal((k, c, 3, 3)) / math.sqrt(9 * c)).astype(np.float32)
    b = rng.standard_normal(k).astype(np.float32) if bias else np.zeros(k, np.float32)
    oh, ow = h + pads[0] + pads[2] - 2, w + pads[1] + pads[3] - 2
    p = hostile.Plan()
    # channels-last views of row-major [N, H, W, C(+gap)] input and [N, OH, OW, K] output
    xr = p.tensor(hostile.F32, [n, h, w, c + gap], role="input")
    xi = p.alias(xr, [n, c, h, w], nhwc([n, c, h, w], gap))
    wi = p.const(wt, dims=[1, k, c, 3, 3]) if grouped else p.const(wt)
    ins = [xi, wi] + ([p.const(b)] if bias else [])
    yr = p.tensor(hostile.F32, [n, oh, ow, k], role="output")
    yi = p.alias(yr, [n, k, oh, ow], nhwc([n, k, oh, ow]))
    entries, extra, operand = [], [], None  # extra: the residual input; operand: as NCHW
    for e in POSTS[post][0]:
        if e[4] == "residual":
            rr = p.tensor(hostile.F32, [n, oh, ow, k], role="input")
            e = [*e[:4], p.alias(rr, [n, k, oh, ow], nhwc([n, k, oh, ow]))]
            extra.append(rng.standard_normal((n, oh, ow, k)).astype(np.float32))
            operand = extra[0].transpose(0, 3, 1, 2).astype(np.float64)
        elif e[4] == "channel":
            values = rng.standard_normal(k).astype(np.float32)
            e = [*e[:4], p.const(values, dims=[1, k, 1, 1], strides=[k, 1, 1, 1])]
            operand = values.astype(np.float64).reshape(1, k, 1, 1)
        entries.append(e)
    p.op("conv", ins, [yi], [2, 1, 1, *pads, 1, 1, int(bias)], post=entries)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    return p, x, wt, b, extra, operand


def _feed(x, gap):
    n, c, h, w = x.shape
    xin = np.zeros((n, h, w, c + gap), np.float32)
    xin[..., :c] = x.transpose(0, 2, 3, 1)
    return xin


def check(n, c, k, h, w, pads=(1, 1, 1, 1), *, post="none", threads=1, gap=0, bias=True,
          grouped=False, seed=0, x=None):
    """Runs the plan; asserts its output against float64; returns the handle."""
    p, x0, wt, b, extra, other = _plan(n, c, k, h, w, pads, post=post, bias=bias, gap=gap,
                                grouped=grouped, seed=seed)
    x = x0 if x is None else x
    handle = p.handle(threads=threads)
    got = hostile.run(handle, _feed(x, gap), *extra)[0].transpose(0, 3, 1, 2)
    with np.errstate(invalid="ignore", over="ignore"):
        exact, size = reference(x, wt, b, pads)
    tol = (9 * c + 2) * U * (size + np.abs(b)[None, :, None, None])
    _, ref, lipschitz = POSTS[post]
    want = ref(exact, other)
    tol = lipschitz * tol + 8 * U * np.abs(want)  # the post-ops' own roundings
    assert_within(got, want, tol)
    return handle


def assert_within(got, want, tol):
    """got's NaNs and infinities where want's are, every other value within tol of want
    (shared by the own convolution kernels' tests)."""
    with np.errstate(invalid="ignore"):
        assert np.array_equal(np.isnan(got), np.isnan(want)), "NaNs where torch has none, or lost"
        inf = np.isinf(want)
        assert np.array_equal(got[inf], want[inf]), "infinities differ"
        finite = np.isfinite(want)
        err = np.abs(got[finite] - want[finite])
    worst = float((err / np.maximum(tol[finite], 1e-30)).max()) if err.size else 0.0
    assert worst <= 1.0, f"error {worst:.3g}× the bound"


def read_through_pool(p, y, dims, conv) -> None:
    """Add ``conv(target)``, an op writing ``target``, then a 1×1 max pooling (the identity)
    of ``target`` into ``y`` (an NCHW view, ``dims``): an op that reads the convolution's
    bound to skip its scan for NaN, which an own kernel tracks only for such a reader."""
    target = p.tensor(hostile.F32, list(dims), nhwc(list(dims)))
    conv(target)
    p.op("pool", [target], [y], [0, 2, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1])


def assert_bounds_follow_calls(handle, run, x, post):
    """An own kernel's output bound (out_bounds(), which its readers trust to skip their
    scans for NaN): the largest |value| of each call's output, inf with a NaN in it, inf
    where a post-op runs after the kernel (`post` "relu, gelu"). run(x): the output."""
    def top(got):
        return float(np.abs(got).max()) if post != "relu, gelu" else math.inf
    got = run(x)
    assert handle.out_bounds() == {0: top(got)}
    x[0, 3, 2, 2] = np.nan
    assert np.isnan(run(x)).any()
    assert handle.out_bounds() == {0: math.inf}
    x[0, 3, 2, 2] = 1.0
    got = run(x)
    assert handle.out_bounds() == {0: top(got)}  # each call's own


# (N, C, K, H, W, pads): channels around 16 and the 4-panel blocks (K 16, 33: 3 panels, 80: 4
# + 1), maps with partial tiles (7×9), tile counts around the 6-tile row block and the
# 12-tile block, every padding 0-2 and uneven ones, batches
SHAPES = [
    (1, 16, 16, 8, 8, (1, 1, 1, 1)),
    (1, 17, 33, 7, 9, (1, 1, 1, 1)),
    (2, 32, 80, 13, 10, (0, 1, 2, 1)),
    (1, 16, 64, 12, 16, (0, 0, 0, 0)),
    (1, 24, 16, 5, 5, (2, 2, 2, 2)),
    (3, 16, 48, 6, 11, (1, 0, 1, 2)),
    (1, 64, 64, 20, 20, (1, 1, 1, 1)),
    (1, 40, 17, 4, 4, (1, 1, 1, 1)),
]
IDS = ["x".join(map(str, s[:5])) + "-p" + "".join(map(str, s[5])) for s in SHAPES]


@pytest.mark.parametrize("shape", SHAPES, ids=IDS)
@pytest.mark.parametrize("post", list(POSTS))
def test_winograd_matches_float64(shape, post, capability):
    n, c, k, h, w, pads = shape
    check(n, c, k, h, w, pads, post=post, bias=(c + k) % 3 != 0)


# U (36·C·K floats) past 1 MiB: blocks of up to 64 tiles, shared by the threads (128×128:
# 9 tiles, one block; 128×80 at 36×30: 72 tiles, two blocks)
THREADED = [(1, 64, 64, 56, 56), (2, 32, 32, 9, 9), (1, 16, 16, 4, 4), (1, 128, 128, 10, 10),
            (1, 128, 80, 36, 30)]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("shape", THREADED,
                         ids=["56x56x64", "batch2-9x9x32", "one-tile", "large-u", "large-u-2-blocks"])
def test_threads_and_sizes(shape, threads, capability):
    n, c, k, h, w = shape
    check(n, c, k, h, w, post="add, relu", threads=threads)


def test_strided_and_grouped_sources(capability):
    check(1, 16, 32, 9, 9, gap=5, post="relu")  # pixels 21 floats apart
    check(2, 20, 16, 8, 6, grouped=True)        # weights [1, K, C, 3, 3]


def own_kernel(monkeypatch, switch):
    """The engine's own kernels allowed, the one behind `switch` (its OPFORGE_CPU_* variable)
    too; the test skipped on a CPU without AVX-512 (shared by the own convolution kernels'
    tests)."""
    monkeypatch.delenv("OPFORGE_CPU_CAPABILITY", raising=False)
    monkeypatch.delenv(switch, raising=False)
    if "avx512f" not in hostile.cpu_flags():
        pytest.skip("the kernel needs AVX-512 (oneDNN runs these elsewhere; the other tests cover it)")


def _own(monkeypatch):
    own_kernel(monkeypatch, "OPFORGE_CPU_WINOGRAD")


@pytest.mark.parametrize("post", ["relu", "add, relu", "none"])
def test_nan_inf_and_huge_inputs_run_direct_with_torchs_numbers(post, monkeypatch):
    _own(monkeypatch)
    n, c, k, h, w = 1, 16, 32, 8, 8
    x = np.random.default_rng(1).standard_normal((n, c, h, w)).astype(np.float32)
    special = x.copy()
    special[0, 3, 2, 5] = np.nan
    special[0, 7, 6, 1] = np.inf
    special[0, 9, 0, 0] = -np.inf
    huge = x * np.float32(1e34)  # finite, but past what the kernel's bound allows (1e37)
    for data, kind in [(x, 0), (special, 1), (huge, 1), (x, 0)]:
        handle = check(n, c, k, h, w, post=post, x=data)
        calls = handle.winograd_calls()
        assert list(calls.values()) == [(1 - kind, kind)], (kind, calls)


def test_the_kernel_takes_3x3_stride_1_convolutions_and_nothing_else(monkeypatch):
    _own(monkeypatch)
    # (the small ones it leaves would take the small-convolution kernel: test_cpu_small_conv.py)
    monkeypatch.setenv("OPFORGE_CPU_SMALL_CONV", "0")

    def names(n, c, k, h, w, pads=(1, 1, 1, 1)):
        return _plan(n, c, k, h, w, pads)[0].handle().describe()

    assert names(1, 16, 16, 8, 8) == [WINOGRAD]
    assert names(1, 15, 16, 8, 8) == ["convolution"]            # C below 16
    assert names(1, 16, 15, 8, 8) == ["convolution"]            # K below 16
    assert names(1, 512, 512, 7, 7) == ["convolution"]          # 9.4 MB of U per tile
    assert names(1, 16, 16, 8, 8, pads=(3, 3, 3, 3)) == ["convolution"]  # padding past 2
    # stride 2 (output 4×4) and dilation 2 (output 6×6): shapes made to fit each
    p, *_ = _plan(1, 16, 16, 8, 8, (1, 1, 1, 1))
    p.tensors[-1]["dims"], p.tensors[-2]["dims"] = [1, 16, 4, 4], [1, 4, 4, 16]
    p.tensors[-1]["strides"], p.tensors[-2]["strides"] = nhwc([1, 16, 4, 4]), hostile.row_major([1, 4, 4, 16])
    p.ops[-1]["ia"] = [2, 2, 2, 1, 1, 1, 1, 1, 1, 1]
    assert p.handle().describe() == ["convolution"]
    p.ops[-1]["ia"] = [2, 1, 1, 0, 0, 0, 0, 2, 2, 1]             # dilation 2: 8 - 4 = 4
    assert p.handle().describe() == ["convolution"]
    monkeypatch.setenv("OPFORGE_CPU_WINOGRAD", "0")
    assert names(1, 16, 16, 8, 8) == ["convolution"]
    monkeypatch.delenv("OPFORGE_CPU_WINOGRAD")
    monkeypatch.setenv("OPFORGE_CPU_CAPABILITY", "default")
    assert names(1, 16, 16, 8, 8) == ["convolution"]


def test_its_bound_proves_the_next_convolution_input_finite(monkeypatch):
    """Two Winograd convolutions in a row (relu each): the second one's input bound comes
    from the first one's guard (no scan), and both count their calls as fused."""
    _own(monkeypatch)
    rng = np.random.default_rng(3)
    n, c, h, w = 1, 16, 8, 8
    p = hostile.Plan()
    xr = p.tensor(hostile.F32, [n, h, w, c], role="input")
    xi = p.alias(xr, [n, c, h, w], nhwc([n, c, h, w]))
    mid = p.tensor(hostile.F32, [n, c, h, w], nhwc([n, c, h, w]))
    yr = p.tensor(hostile.F32, [n, h, w, c], role="output")
    yi = p.alias(yr, [n, c, h, w], nhwc([n, c, h, w]))
    weights = [(rng.standard_normal((c, c, 3, 3)) / 12).astype(np.float32) for _ in range(2)]
    p.op("conv", [xi, p.const(weights[0])], [mid], [2, 1, 1, 1, 1, 1, 1, 1, 1, 0],
         post=[[0, RELU, 0.0, 0.0, -1]])
    p.op("conv", [mid, p.const(weights[1])], [yi], [2, 1, 1, 1, 1, 1, 1, 1, 1, 0],
         post=[[0, RELU, 0.0, 0.0, -1]])
    handle = p.handle()
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    got = hostile.run(handle, _feed(x, 0))[0].transpose(0, 3, 1, 2)
    first = np.maximum(reference(x, weights[0], np.zeros(c), (1, 1, 1, 1))[0], 0)
    want = np.maximum(reference(first, weights[1], np.zeros(c), (1, 1, 1, 1))[0], 0)
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
    assert handle.describe() == [WINOGRAD, WINOGRAD]
    assert handle.winograd_calls() == {0: (1, 0), 1: (1, 0)}
    assert handle.guard_calls() == {0: (1, 0), 1: (1, 0)}


# --- cases for the sanitized run (test_cpu_sanitized.py): blocks, edges, paddings, threads
CASES, EXPECT = hostile.ran_ok_cases({
    **{f"winograd_{i}": (lambda s=s: (check(*s[:5], s[5], post="add, relu"), "ran ok")[1])
       for i, s in zip(IDS, SHAPES)},
    "winograd_two_threads": lambda: (check(2, 32, 48, 9, 9, post="relu", threads=2), "ran ok")[1],
    "winograd_shared_blocks": lambda: (check(1, 128, 80, 36, 30, post="add, relu", threads=2), "ran ok")[1],
    "winograd_strided": lambda: (check(1, 16, 32, 9, 9, gap=5), "ran ok")[1],
})
test_the_case_file_runs = hostile.case_file_test(__file__, CASES, EXPECT)


if __name__ == "__main__":
    hostile.report_cases(CASES, sys.argv[1:])
