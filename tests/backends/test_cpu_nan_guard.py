"""The NaN guard (native/guard.cpp): a convolution or matmul whose post-ops hold relu, clip
(ReLU6) or hardsigmoid, which oneDNN's kernels make map a NaN to a number, runs with them
fused on a call whose bounds prove no NaN reaches them, and the exact way otherwise.

Each model below runs through the engine directly (its delegate is the whole model), so
the test reads how many calls of each guarded op ran which way. On ordinary inputs every
guarded op must run fused and the results match eager within float64's criterion; with a
NaN or an inf in the input, the first guarded op runs the exact way and the NaN and inf
positions are eager's; an input whose magnitude makes the bound exceed what float32 holds
runs the exact way, one just below runs fused. (The MLPs run more than 8 rows: a matmul of
fewer against constant weights takes the engine's own kernel, NaN-exact with no guard,
test_cpu_small_matmul.py.)
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from opforge.backends.cpu import blob
from opforge.backends.cpu import engine as cpu_engine
from opforge.backends.cpu.binding import Binding
from opforge.backends.named_data import NamedDataMap
from opforge.export import export

from cpu_reference import check_against_float64, spread

pytestmark = pytest.mark.skipif(cpu_engine.missing() is not None,
                                reason=f"cpu backend: {cpu_engine.missing()}")


@pytest.fixture(autouse=True)
def _onednn_convolutions(monkeypatch):
    """These models' convolutions and matmuls on oneDNN with the guard: the engine's own
    depthwise and small-convolution kernels, and its matmul on a CPU with AVX2 but no
    AVX-512, NaN-exact without a guard, would take them otherwise (test_cpu_depthwise.py,
    test_cpu_small_conv.py and test_cpu_matmul_avx2.py test those with NaN and inf)."""
    monkeypatch.setenv("OPFORGE_CPU_DEPTHWISE", "0")
    monkeypatch.setenv("OPFORGE_CPU_SMALL_CONV", "0")
    monkeypatch.setenv("OPFORGE_CPU_MATMUL_AVX2", "0")


class InvertedResidual(nn.Module):
    """MobileNetV2's block: 1x1 expansion + ReLU6, depthwise 3x3 + ReLU6, 1x1 projection,
    residual add; then a hardsigmoid gate."""

    def __init__(self, c=8, expand=3):
        super().__init__()
        h = c * expand
        self.body = nn.Sequential(
            nn.Conv2d(c, h, 1, bias=False), nn.BatchNorm2d(h), nn.ReLU6(),
            nn.Conv2d(h, h, 3, padding=1, groups=h, bias=False), nn.BatchNorm2d(h), nn.ReLU6(),
            nn.Conv2d(h, c, 1, bias=False), nn.BatchNorm2d(c))
        self.gate = nn.Conv2d(c, c, 1)

    def forward(self, x):
        y = x + self.body(x)
        return nn.functional.hardsigmoid(self.gate(y)) * y


class BasicBlock(nn.Module):
    """ResNet's block: conv-BN-ReLU, conv-BN, residual add, ReLU."""

    def __init__(self, c=8):
        super().__init__()
        self.a = nn.Sequential(nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c), nn.ReLU())
        self.b = nn.Sequential(nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c))

    def forward(self, x):
        return torch.relu(x + self.b(self.a(x)))


def _mlp():
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU6(), nn.Linear(32, 4))


class ElementwiseChain(nn.Module):
    """Ten elementwise ops reading the input three times: one binary op with the rest as
    post-ops (the relu, NaN-unsafe, guarded), each later read of x a binary post-op."""

    def forward(self, x):
        y = torch.relu(x * 1.5 + 0.25) - x
        y = torch.tanh(torch.sigmoid(y) * x)
        return -(torch.abs(y) + x)


MODELS = {
    "elementwise_chain": (ElementwiseChain, (4, 300)),
    "inverted_residual": (InvertedResidual, (1, 8, 10, 10)),
    "basic_block": (BasicBlock, (1, 8, 9, 9)),
    "mlp": (_mlp, (12, 16)),  # more than 8 rows: oneDNN's matmul (few rows: small_matmul.cpp)
}


def _engine(model, x):
    program = export(model, (x,), backends=["cpu"])
    assert len(program.delegates) == 1
    plan, data = blob.parse(program.segments[program.delegates[0].segment].data)
    return cpu_engine.EngineHandle(plan, data, 1, 1 << 30, None, {}, named=NamedDataMap(program))


def _run(handle, x):
    outs = [np.zeros(dims, cpu_engine.NUMPY[dtype]) for dims, dtype in handle.outputs]
    Binding(handle, [x], outs)()
    return outs


def _once(model, x):
    """One call of the model's engine: (its output, its guard calls)."""
    handle = _engine(model, x)
    try:
        return _run(handle, x.numpy())[0], handle.guard_calls()
    finally:
        handle.close()


def _model(name):
    make, shape = MODELS[name]
    model = spread(make())
    return model, torch.randn(shape, generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize("name", list(MODELS))
def test_ordinary_inputs_run_fused_and_match_eager(name):
    model, x = _model(name)
    handle = _engine(model, x)
    try:
        calls = 3
        for _ in range(calls):
            got = _run(handle, x.numpy())
        guarded = handle.guard_calls()
    finally:
        handle.close()
    # every relu/ReLU6/hardsigmoid sits on a convolution or linear: each is a guarded op
    want = {"elementwise_chain": 1, "inverted_residual": 3, "basic_block": 2, "mlp": 2}[name]
    assert len(guarded) == want, guarded
    assert all(c == (calls, 0) for c in guarded.values()), guarded
    check_against_float64(model, (x,), got)


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("special", [float("nan"), float("inf"), float("-inf")])
def test_a_special_input_runs_the_exact_way_as_eager_does(name, special):
    model, x = _model(name)
    x.view(-1)[[3, 17]] = special
    got, guarded = _once(model, x)
    first = min(guarded)
    assert guarded[first] == (0, 1), guarded
    with torch.no_grad():
        want = model(x).numpy()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    both = np.isfinite(want)
    np.testing.assert_allclose(got[both], want[both], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("scale, fused", [(5e36, False), (1e36, True)])
def test_a_bound_past_what_float32_holds_runs_the_exact_way(scale, fused):
    """Linear(16 → 32) + ReLU with every |w| = 0.25 and no bias: the bound is 16 × 0.25 ×
    max|x| = 4 × scale. 2e37 is past the guard's limit (1e37, where rounding could reach
    float32's 3.4e38), 4e36 is not; the values themselves stay finite in both."""
    model = nn.Sequential(nn.Linear(16, 32, bias=False), nn.ReLU()).eval()
    with torch.no_grad():
        signs = torch.where(torch.rand(32, 16, generator=torch.Generator().manual_seed(1)) < 0.5, -1.0, 1.0)
        model[0].weight.copy_(0.25 * signs)
    x = torch.where(torch.arange(192).reshape(12, 16) % 3 == 0, -scale, scale)  # > 8 rows: oneDNN's
    got, guarded = _once(model, x)
    assert list(guarded.values()) == [(1, 0) if fused else (0, 1)], guarded
    with torch.no_grad():
        want = model.double()(x.double()).numpy()
    assert np.isfinite(got).all()
    # 16-term sums of ±scale/4 in float32: off by a few ulps of their terms' scale
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6 * scale)


class ConvPoolReduce(nn.Module):
    """A guarded convolution (its ReLU) read by a max pooling, a max reduction and a
    softmax: each of those scans its input for NaN unless that convolution's bound this
    call proves it finite (native/guard.cpp, special_input)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x):
        y = torch.relu(self.conv(x))
        return (nn.functional.max_pool2d(y, 2), y.amax(dim=(2, 3)),
                torch.softmax(y.flatten(2), dim=-1))


@pytest.mark.parametrize("special", [None, float("nan"), float("inf")])
def test_readers_of_a_bounded_output_skip_their_scan_only_when_it_is_proved(special):
    # a NaN or inf input: the convolution runs the exact way (no bound), so the pooling,
    # the reduction and the softmax scan, find the NaN the ReLU kept, and give torch's
    # values; without one the bound proves every value finite and the scans are skipped
    model = spread(ConvPoolReduce())
    x = torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(5))
    if special is not None:
        x[0, 1, 3, 4] = special
    handle = _engine(model, x)
    try:
        got = _run(handle, x.numpy())
        guarded = handle.guard_calls()
    finally:
        handle.close()
    assert list(guarded.values()) == [(1, 0) if special is None else (0, 1)], guarded
    with torch.no_grad():
        want = [t.numpy() for t in model(x)]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.isnan(g), np.isnan(w))
        np.testing.assert_array_equal(np.isinf(g), np.isinf(w))
        assert np.isfinite(w).all() == (special is None)
        both = np.isfinite(w)
        np.testing.assert_allclose(g[both], w[both], rtol=1e-5, atol=1e-6)
