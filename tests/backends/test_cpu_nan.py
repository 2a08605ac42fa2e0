"""NaN and ±inf through the cpu backend give what torch eager gives: oneDNN's relu, clip,
hardsigmoid, exp, binary max/min, max pooling, max/min reductions and softmax lose a NaN
(or turn +inf into numbers); the engine computes those cases itself (native/nan.cpp)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from opforge.backends.cpu import engine as cpu_engine

pytestmark = pytest.mark.skipif(cpu_engine.missing() is not None,
                                reason=f"cpu backend: {cpu_engine.missing()}")

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_cpu_hostile_plans import B_ADD, F32, RELU, Plan, run  # noqa: E402

CLIP, LINEAR, HARDSIGMOID, EXP, B_MAX, B_MIN = 13, 6, 19, 9, 104, 105
SPECIAL = np.array([np.nan, np.inf, -np.inf, -1.5, -0.0, 0.25, 3.0, 9.0], np.float32)


def test_exported_model_keeps_nan_and_inf_like_eager():
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    from opforge.export import export
    from opforge.runtime import load

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(2, 4, 3, padding=1)

        def forward(self, x):
            a = torch.relu(self.conv(x))  # relu fused into the convolution
            return (a, F.max_pool2d(a, 2), F.max_pool2d(x, 2), torch.relu(x),
                    F.hardtanh(x, -1.0, 1.0), F.relu6(x), F.hardsigmoid(x), torch.exp(x),
                    x.amax(-1), x.amin(-1), torch.softmax(x, -1), torch.log_softmax(x, -1),
                    torch.maximum(x, x * 0.5), torch.minimum(x, x * 0.5), torch.relu(x + 1.0))

    torch.manual_seed(0)
    model = Model().eval()
    x = torch.randn(3, 2, 8, 8)
    program = export(model, (x,), backends=["cpu"])
    assert program.delegates, "nothing was delegated"
    rng = np.random.default_rng(0)
    data = x.numpy().copy()
    flat = data.reshape(-1)
    spots = rng.choice(flat.size, 24, replace=False)
    flat[spots] = np.resize(SPECIAL[:3], spots.size)
    data[0, 1, 3] = np.nan  # a whole row: softmax and amax of NaN
    data[1, 0, 5, :] = -np.inf
    data[2, 1, 6, 2] = np.inf
    got = load(program).method("forward")(data)
    with torch.no_grad():
        want = model(torch.from_numpy(data))
    names = ["conv+relu", "maxpool(conv)", "maxpool", "relu", "hardtanh", "relu6", "hardsigmoid",
             "exp", "amax", "amin", "softmax", "log_softmax", "maximum", "minimum", "add+relu"]
    for name, g, w in zip(names, got, want):
        w = w.numpy()
        assert np.array_equal(np.isnan(g), np.isnan(w)), (name, int(np.isnan(g).sum()), int(np.isnan(w).sum()))
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5, err_msg=name)


def reference(code, alpha, beta, x):
    with np.errstate(invalid="ignore", over="ignore"):
        if code == RELU:
            return np.where(x < 0, 0, x)
        if code == CLIP:
            return np.clip(x, alpha, beta)
        if code == LINEAR:
            return alpha * x + beta
        if code == HARDSIGMOID:
            return np.clip(alpha * x + beta, 0, 1)
        if code == EXP:
            return np.exp(x)
    raise AssertionError(code)


@pytest.mark.parametrize("chain", [
    [(CLIP, 0.0, 6.0)],
    [(RELU, 0.0, 0.0), (LINEAR, 2.0, 1.0)],
    [(LINEAR, -1.0, 0.5), (HARDSIGMOID, 1 / 6, 0.5), (EXP, 0.0, 0.0)],
    [(LINEAR, 1.0, -1.0), "max", (RELU, 0.0, 0.0), "min"],
])
def test_post_op_chains_keep_nan(chain):
    # binary add of zero with a post-op chain: NaN-unsafe post-ops and everything after
    # them run after the primitive, in order
    n = 64
    x = np.resize(SPECIAL, n).astype(np.float32)
    b = np.resize(SPECIAL[::-1], n).astype(np.float32).reshape(1, n)
    p = Plan()
    xi = p.tensor(F32, [1, n], role="input")
    bi = p.tensor(F32, [1, n], role="input")
    zero = p.const(np.zeros((1, 1), np.float32))
    y = p.tensor(F32, [1, n], role="output")
    post, want = [], x.reshape(1, n).copy()
    for step in chain:
        if step == "max":
            post.append([1, B_MAX, 0.0, 0.0, bi])
            want = np.maximum(want, b)
        elif step == "min":
            post.append([1, B_MIN, 0.0, 0.0, bi])
            want = np.minimum(want, b)
        else:
            post.append([0, *step, -1])
            want = reference(*step, want)
    p.op("binary", [xi, zero], [y], [B_ADD], post=post)
    got = run(p.handle(), x.reshape(1, n), b)[0]
    assert np.array_equal(np.isnan(got), np.isnan(want)), (got, want)
    np.testing.assert_allclose(got, want.astype(np.float32), rtol=1e-5)


@pytest.mark.parametrize("where", [0, 4095, 4096, 70000 - 1])
def test_one_nan_anywhere_in_a_large_input_reaches_max_pooling_and_softmax(where):
    # the NaN check scans the input in blocks: a NaN at a block's edge or the last element
    x = np.random.default_rng(3).standard_normal(70000).astype(np.float32)
    x[where] = np.nan
    p = Plan()
    xi = p.tensor(F32, [1, 1, 70000], role="input")
    pool = p.tensor(F32, [1, 1, 35000], role="output")
    soft = p.tensor(F32, [1, 1, 70000], role="output")
    p.op("pool", [xi], [pool], [0, 1, 2, 2, 0, 0, 1])
    p.op("softmax", [xi], [soft], [2, 0])
    got_pool, got_soft = run(p.handle(), x.reshape(1, 1, -1))
    assert np.flatnonzero(np.isnan(got_pool)).tolist() == [where // 2]
    assert np.isnan(got_soft).all()


@pytest.mark.parametrize("activation", ["relu6", "hardtanh", "hardsigmoid", "relu"])
def test_clamping_activations_after_a_convolution_keep_nan_and_clamp_like_eager(activation):
    # the activation is a post-op of the convolution run after the primitive, in place on
    # its channels-last output (one flat pass over 5·7·9·11 = 3465 elements: whole vectors
    # and a remainder); NaN, ±inf and values on both sides of each bound, against eager
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    from opforge.export import export
    from opforge.program import KernelCall
    from opforge.runtime import load

    act = {"relu6": F.relu6, "hardtanh": lambda v: F.hardtanh(v, -0.5, 0.75),
           "hardsigmoid": F.hardsigmoid, "relu": F.relu}[activation]

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 7, 3, padding=1)

        def forward(self, x):
            return act(self.conv(x) * 4.0)

    torch.manual_seed(0)
    model = Model().eval()
    x = torch.randn(5, 3, 9, 11)
    program = export(model, (x,), backends=["cpu"])
    assert program.delegates and not any(
        type(i) is KernelCall for i in program.method("forward").instructions)
    data = x.numpy().copy()
    flat = data.reshape(-1)
    spots = np.random.default_rng(1).choice(flat.size, 40, replace=False)
    flat[spots] = np.resize(SPECIAL, spots.size)
    got = load(program).method("forward")(data)[0]
    with torch.no_grad():
        want = model(torch.from_numpy(data)).numpy()
    assert np.isnan(want).any() and np.isnan(got).sum() == np.isnan(want).sum()
    assert np.array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
