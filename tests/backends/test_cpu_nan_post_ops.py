"""NaN and ±inf through every fused post-op chain, whichever operand they arrive in.

A convolution or linear with fused post-ops (a residual add or a mask multiply, then relu or
ReLU6) must give torch's NaN and inf positions whether the special value is in the op's own
input or in the other operand of its binary post-op, on the engine's own kernels (Winograd
takes the 3×3 convolution and runs the add, relu and clip in its registers) and on oneDNN's
with the NaN guard (guard.cpp). A relu or clip that returns its bound for a NaN turns NaN
into 0 or 6 silently; only a NaN in the residual operand reaches it while the convolution's
own input is finite (the kernel then runs), so the NaN tests of the convolution's input
alone cannot see it.

And the guard's bound counts every term: a linear whose bias alone takes the bound past
what float32 holds must run the exact way (bias 3.4e38: its outputs overflow to ±inf, times
a zero of the mask NaN, which a fused relu would make 0).
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

from cpu_reference import spread
from test_cpu_hostile_plans import cpu_flags

pytestmark = pytest.mark.skipif(cpu_engine.missing() is not None,
                                reason=f"cpu backend: {cpu_engine.missing()}")


class Residual(nn.Module):
    """act(conv3x3(x) + conv1x1(r)): 16 channels, so Winograd takes the 3×3 convolution (r has 8:
    the small convolution takes the 1×1 one, and the inputs' shapes differ); the
    add and the activation are its post-ops, the 1×1 convolution's output the add's other
    operand. (The add fuses into the op that computes its operands last: the 1×1 one runs
    first here, else the add and the activation would be its post-ops, not Winograd's.)"""

    def __init__(self, act, pool=False):
        super().__init__()
        self.conv = nn.Conv2d(16, 16, 3, padding=1)
        self.side = nn.Conv2d(8, 16, 1)
        self.act = act
        self.pool = pool

    def forward(self, x, r):
        side = self.side(r)
        y = self.act(self.conv(x) + side)
        # a max pooling reads the convolution's output bound to skip its scan for NaN: a
        # NaN the residual brought must leave the bound unproved
        return nn.functional.max_pool2d(y, 2) if self.pool else y


class Masked(nn.Module):
    """act(Linear(x) * mask): the multiply and the activation are the matmul's post-ops
    (12 rows: oneDNN's matmul with the guard; 8 or fewer take the engine's own kernel)."""

    def __init__(self, act, shift=0.0):
        super().__init__()
        self.linear = nn.Linear(16, 32)
        self.act = act
        self.shift = shift  # a constant added before the multiply (an eltwise post-op)

    def forward(self, x, mask):
        y = self.linear(x)
        return self.act((y + self.shift if self.shift else y) * mask)


CHAINS = {
    "conv3x3 + conv1x1 (residual), relu": (lambda: Residual(nn.ReLU()), ("input", "residual"),
                                           [(1, 16, 8, 8), (1, 8, 8, 8)]),
    "conv3x3 + conv1x1 (residual), relu6": (lambda: Residual(nn.ReLU6()), ("input", "residual"),
                                            [(1, 16, 8, 8), (1, 8, 8, 8)]),
    "conv3x3 + conv1x1 (residual), relu6, max pool": (
        lambda: Residual(nn.ReLU6(), pool=True), ("input", "residual"), [(1, 16, 8, 8), (1, 8, 8, 8)]),
    "linear * mask, relu": (lambda: Masked(nn.ReLU()), ("input", "mask"), [(12, 16), (12, 32)]),
    "linear * mask, relu6": (lambda: Masked(nn.ReLU6()), ("input", "mask"), [(12, 16), (12, 32)]),
}


ADD, MUL = 100, 102  # binary post-op codes (lowering/core.py)


def _handle(model, inputs, binary_chain=True):
    program = export(model, tuple(inputs), backends=["cpu"])
    assert len(program.delegates) == 1
    plan, data = blob.parse(program.segments[program.delegates[0].segment].data)
    if binary_chain:  # the chain under test is fused: the binary op and the activation are
        # the last convolution's or matmul's post-ops
        last = [op for op in plan["ops"] if op["kind"] in ("conv", "matmul")][-1]
        assert [p[1] for p in last["post"]][:1] in ([ADD], [MUL]) and len(last["post"]) == 2, last
    return cpu_engine.EngineHandle(plan, data, 1, 1 << 30, None, {}, named=NamedDataMap(program))


def _call(handle, arrays):
    """The delegate's output for the model's inputs ``arrays`` (the delegate takes them in its
    own order: matched by shape, every input's shape differs)."""
    shapes = [a.shape for a in arrays]
    assert len(set(shapes)) == len(shapes)
    ordered = [arrays[shapes.index(tuple(dims))] for dims, _ in handle.inputs]
    outs = [np.zeros(dims, cpu_engine.NUMPY[dtype]) for dims, dtype in handle.outputs]
    Binding(handle, ordered, outs)()
    return outs[0]


def assert_as_torch(got, want, what):
    """got's NaN and ±inf where torch's are (the message names the first that is not), the
    finite values close."""
    for kind, mask_of in (("NaN", np.isnan), ("inf", np.isposinf), ("-inf", np.isneginf)):
        lost = mask_of(want) & ~mask_of(got)
        if lost.any():
            at = tuple(int(i) for i in np.argwhere(lost)[0])
            raise AssertionError(f"{what}: {kind} became {float(got[at])!r} at {at} "
                                 f"({int(lost.sum())} of {int(mask_of(want).sum())} lost)")
        extra = mask_of(got) & ~mask_of(want)
        if extra.any():
            at = tuple(int(i) for i in np.argwhere(extra)[0])
            raise AssertionError(f"{what}: {kind} at {at} where torch has {float(want[at])!r}")
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-4, atol=1e-4, err_msg=what)


@pytest.fixture(autouse=True)
def _onednn_matmuls(monkeypatch):
    """Matmuls of more than 8 rows on oneDNN with the guard, which the guard's tests below
    read: on a CPU with AVX2 but no AVX-512 the engine's own matmul (NaN-exact without a
    guard) takes every one otherwise (the `kernels` fixture's "own kernels" turns it on)."""
    monkeypatch.setenv("OPFORGE_CPU_MATMUL_AVX2", "0")


@pytest.fixture(params=["own kernels", "oneDNN"])
def kernels(request, monkeypatch):
    """The engine's own kernels (Winograd, where the CPU has AVX-512; the matmul, where it
    has AVX2 only) or oneDNN's with the NaN guard for every convolution and matmul."""
    monkeypatch.delenv("OPFORGE_CPU_CAPABILITY", raising=False)
    for switch in ("OPFORGE_CPU_WINOGRAD", "OPFORGE_CPU_SMALL_CONV", "OPFORGE_CPU_DEPTHWISE",
                   "OPFORGE_CPU_MATMUL_AVX2"):
        if request.param == "oneDNN":
            monkeypatch.setenv(switch, "0")
        else:
            monkeypatch.delenv(switch, raising=False)
    return request.param


@pytest.mark.parametrize("chain", list(CHAINS))
def test_nan_and_inf_in_either_operand_of_a_fused_chain_reach_the_output(chain, kernels):
    make, names, shapes = CHAINS[chain]
    model = spread(make())
    g = torch.Generator().manual_seed(7)
    inputs = [torch.randn(s, generator=g) for s in shapes]
    if "mask" in names:
        inputs[1] = (inputs[1] > 0).float()  # zeros and ones
    handle = _handle(model, inputs)
    try:
        own = kernels == "own kernels" and "avx512f" in cpu_flags() and "conv" in chain
        for special in (float("nan"), float("inf"), float("-inf")):
            for k, name in enumerate(names):
                arrays = [t.clone() for t in inputs]
                flat = arrays[k].view(-1)
                flat[[5, 40, flat.numel() - 3]] = special  # a 16-channel pixel's channel, a corner
                before = handle.winograd_calls()
                got = _call(handle, [a.numpy() for a in arrays])
                with torch.no_grad():
                    want = model(*arrays).numpy()
                assert_as_torch(got, want, f"{chain} on {kernels}: {special} in the {name} operand")
                if own and name == "residual":  # the input is finite: the kernel ran, post-ops too
                    after = handle.winograd_calls()
                    assert [a[0] - b[0] for a, b in zip(after.values(), before.values())] == [1], (
                        "the Winograd kernel did not run this call", before, after)
        # and ordinary values afterwards: no special value sticks
        assert_as_torch(_call(handle, [t.numpy() for t in inputs]),
                        model(*inputs).detach().numpy(), f"{chain} on {kernels}: ordinary inputs")
    finally:
        handle.close()


@pytest.mark.parametrize("act", [nn.ReLU, nn.ReLU6])
@pytest.mark.parametrize("term", ["bias", "shift"])
def test_a_bias_alone_past_float32s_range_makes_the_guard_run_the_exact_way(act, term):
    """Linear(16 → 32) with every |w| = 0.25 and inputs ±1e36: the weights' part of the bound
    is 16 × 0.25 × 1e36 = 4e36, under the guard's limit (1e37); the bias, ±3.4e38, takes it
    past (or, "shift", a constant 3.4e38 added after the linear, an eltwise post-op before
    the multiply). Outputs whose bias and sum share a sign overflow to ±inf (3.4e38 + 4e36 >
    float32's 3.40282e38), and times a zero of the mask they are NaN: torch's relu keeps
    NaN, oneDNN's fused relu would give 0."""
    model = Masked(act(), shift=3.4e38 if term == "shift" else 0.0).eval()
    g = torch.Generator().manual_seed(11)
    with torch.no_grad():
        model.linear.weight.copy_(0.25 * torch.where(torch.rand(32, 16, generator=g) < 0.5, -1.0, 1.0))
        if term == "bias":
            model.linear.bias.copy_(3.4e38 * torch.where(torch.arange(32) % 2 == 0, 1.0, -1.0))
        else:
            model.linear.bias.zero_()
    x = torch.where(torch.rand(12, 16, generator=g) < 0.5, -1e36, 1e36)
    mask = (torch.rand(12, 32, generator=g) < 0.5).float()
    with torch.no_grad():
        want = model(x, mask).numpy()
    assert np.isnan(want).any() and np.isfinite(want).any()  # the case is what it says
    handle = _handle(model, [x, mask], binary_chain=term == "bias")
    try:
        got = _call(handle, [x.numpy(), mask.numpy()])
        guarded = handle.guard_calls()
    finally:
        handle.close()
    what = "bias ±3.4e38" if term == "bias" else "+ 3.4e38 after it"
    assert_as_torch(got, want, f"Linear with {what}, inputs ±1e36, * mask, {act.__name__}")
    assert list(guarded.values()) == [(0, 1)], (
        f"the guard's bound left out the {term} (3.4e38): the op ran fused "
        f"(fused, exact calls: {guarded})")


@pytest.mark.parametrize("special", ["nan", "inf", "large"])
def test_a_strided_input_is_scanned_in_every_row(kernels, special):
    """A convolution whose input has gaps (channels-last pixels 21 floats apart, 16 used) is
    scanned row by row for its bound, by the NaN guard and by Winograd alike: a NaN, an inf
    or a value too large to prove anything (1e36) in a later row, not the first, must send
    the call the exact way, and the results are torch's. Then an ordinary call runs fused."""
    import test_cpu_winograd as wg

    n, c, k, h, w = 1, 16, 32, 8, 8
    x = np.random.default_rng(1).standard_normal((n, c, h, w)).astype(np.float32)
    data = x.copy()
    data[0, 9, 6, 5] = {"nan": np.nan, "inf": np.inf, "large": 1e36}[special]
    for values, exact in [(data, 1), (x, 0)]:
        handle = wg.check(n, c, k, h, w, post="relu", gap=5, x=values)
        calls = {**handle.guard_calls(), **handle.winograd_calls()}
        assert list(calls.values()) == [(1 - exact, exact)], (
            f"{special} at row 6 of a strided input on {kernels}: (fused, exact) calls "
            f"{list(calls.values())}, not [{(1 - exact, exact)}]: the scan missed it")


class Saturated(nn.Module):
    """relu(Linear(tanh(Linear(x)))): tanh bounds its output by 1 whatever it reads, except
    NaN, which it keeps; the second linear's guard takes its input's bound from the first."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(16, 32), nn.Linear(32, 8)

    def forward(self, x):
        return torch.relu(self.b(torch.tanh(self.a(x))))


def test_a_bound_is_not_passed_on_past_a_value_it_could_not_bound():
    """The first linear's input is a delegate input no bound covers: its output bound is
    none, though tanh's is 1, since a NaN there stays NaN. Trusting 1, the second linear ran
    fused and its relu made the NaN 0."""
    model = spread(Saturated())
    x = torch.randn(12, 16, generator=torch.Generator().manual_seed(4))  # > 8 rows: oneDNN
    special = x.clone()
    special[3, 5] = float("nan")
    handle = _handle(model, [x], binary_chain=False)
    try:
        for values in (x, special, x):
            got = _call(handle, [values.numpy()])
            with torch.no_grad():
                want = model(values).numpy()
            assert_as_torch(got, want, "relu(Linear(tanh(Linear(x)))) with a NaN in x"
                            if values is special else "relu(Linear(tanh(Linear(x))))")
        assert sorted(handle.guard_calls().values())[-1] == (2, 1), handle.guard_calls()
    finally:
        handle.close()


def test_a_convolution_after_one_whose_bound_is_unknown_scans_and_runs_its_kernel(monkeypatch):
    """Two 3×3 convolutions, the first with relu then GELU (a post-op after the last NaN-unsafe
    one leaves its output bound unknown): the second one's input bound is then its scan's,
    and ordinary values run Winograd, not its direct fallback."""
    monkeypatch.delenv("OPFORGE_CPU_CAPABILITY", raising=False)
    monkeypatch.delenv("OPFORGE_CPU_WINOGRAD", raising=False)
    if "avx512f" not in cpu_flags():
        pytest.skip("Winograd needs AVX-512")
    model = spread(nn.Sequential(nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(), nn.GELU(),
                                 nn.Conv2d(16, 16, 3, padding=1), nn.ReLU()))
    x = torch.randn(1, 16, 8, 8, generator=torch.Generator().manual_seed(6))
    handle = _handle(model, [x], binary_chain=False)
    try:
        got = _call(handle, [x.numpy()])
        calls = handle.winograd_calls()
    finally:
        handle.close()
    assert_as_torch(got, model(x).detach().numpy(), "conv, relu, gelu, conv, relu")
    assert list(calls.values()) == [(1, 0), (1, 0)], (
        f"Winograd (calls, direct calls) per convolution: {list(calls.values())}: the second "
        "gave up on an unknown input bound instead of scanning its input")


class Clamped(nn.Module):
    """relu(Linear(clamp(Linear(x), lo, hi))): the first op's output lies in [lo, hi], its
    bound is max(|lo|, |hi|), whatever its input's bound is (only a clip around 0 can keep a
    smaller one)."""

    def __init__(self, lo, hi):
        super().__init__()
        self.a, self.b = nn.Linear(16, 32), nn.Linear(32, 8)
        self.lo, self.hi = lo, hi

    def forward(self, x):
        return torch.relu(self.b(torch.clamp(self.a(x), self.lo, self.hi)))


@pytest.mark.parametrize("lo, hi", [(2e38, 3e38), (-3e38, -2e38)])
def test_a_clip_away_from_zero_bounds_by_its_limits_not_by_its_input(lo, hi):
    """clamp(2e38, 3e38) of small values is 2e38 everywhere (clamp(-3e38, -2e38): -2e38): the
    next linear's sums overflow (NaN and ±inf), so it must run the exact way. Taking the
    clip's bound from its small input instead, it ran fused, its relu turning NaN into 0."""
    model = spread(Clamped(lo, hi))
    with torch.no_grad():
        pattern = torch.where(torch.arange(256).reshape(8, 32) % 3 == 0, -1.0, 1.0)
        model.b.weight.copy_(pattern if lo > 0 else -pattern)  # the same products
    x = torch.randn(12, 16, generator=torch.Generator().manual_seed(8))  # > 8 rows: oneDNN
    handle = _handle(model, [x], binary_chain=False)
    try:
        got = _call(handle, [x.numpy()])
        guarded = handle.guard_calls()
    finally:
        handle.close()
    with torch.no_grad():
        want = model(x).numpy()
    assert not np.isfinite(want).all()  # the case is what it says
    assert guarded[max(guarded)] == (0, 1), (
        f"the second linear's input is clamp(·, {lo}, {hi}): it must run the exact way; "
        f"(fused, exact) calls per guarded op: {guarded}")
    both = np.isfinite(want) & np.isfinite(got)
    np.testing.assert_allclose(got[both], want[both], rtol=1e-5)
    np.testing.assert_array_equal(np.isfinite(got), np.isfinite(want))


def test_a_nan_in_the_bound_sticks_through_a_post_op_that_bounds_its_output():
    """relu(sigmoid(Linear(x) * mask)) with an inf in x and a mask of zeros: the bound before
    the multiply is inf, times the mask's 0 it is NaN (no proof), and sigmoid's own bound (1)
    must not replace that NaN: inf · 0 is NaN in the values too, which a fused relu would
    turn into 0."""
    model = spread(Masked(nn.Sequential(nn.Sigmoid(), nn.ReLU())))
    x = torch.randn(12, 16, generator=torch.Generator().manual_seed(9))  # > 8 rows: oneDNN
    x[4, 7] = float("inf")
    mask = torch.zeros(12, 32)
    with torch.no_grad():
        want = model(x, mask).numpy()
    assert np.isnan(want).any()  # the case is what it says
    handle = _handle(model, [x, mask], binary_chain=False)
    try:
        got = _call(handle, [x.numpy(), mask.numpy()])
        guarded = handle.guard_calls()
    finally:
        handle.close()
    assert_as_torch(got, want, "relu(sigmoid(Linear(x) * zeros)) with an inf in x")
    assert list(guarded.values()) == [(0, 1)], guarded


def test_a_winograd_convolutions_bias_counts_in_the_bound_it_passes_on(monkeypatch):
    """Two Winograd-sized 3×3 convolutions, the first with a bias of 3e38 on one channel:
    its outputs there are ~3e38 however small its input, so they prove nothing to the second
    one, which must run direct (its transforms would overflow; its sums do overflow, to ±inf
    and NaN as torch's do). (The first runs direct too: the engine passes on the bound its
    proof allows, 1e37.) A bound without the bias let the second run Winograd."""
    monkeypatch.delenv("OPFORGE_CPU_CAPABILITY", raising=False)
    monkeypatch.delenv("OPFORGE_CPU_WINOGRAD", raising=False)
    if "avx512f" not in cpu_flags():
        pytest.skip("Winograd needs AVX-512")
    model = spread(nn.Sequential(nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
                                 nn.Conv2d(16, 16, 3, padding=1), nn.ReLU()))
    with torch.no_grad():
        model[0].bias[5] = 3e38
    x = torch.randn(1, 16, 8, 8, generator=torch.Generator().manual_seed(10))
    handle = _handle(model, [x], binary_chain=False)
    try:
        got = _call(handle, [x.numpy()])
        calls = handle.winograd_calls()
    finally:
        handle.close()
    assert list(calls.values())[1] == (0, 1), (
        f"Winograd (calls, direct calls) per convolution: {list(calls.values())}: the second "
        "took the first one's bound without its bias (3e38) as proof")
    with torch.no_grad():
        want = model(x).numpy()
    both = np.isfinite(want) & np.isfinite(got)
    np.testing.assert_allclose(got[both], want[both], rtol=1e-4, atol=1e-4)
