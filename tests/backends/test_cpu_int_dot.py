"""Linears on dynamically quantized int8 activations (schemes 8da8w / 8da4w,
opforge/quantize/dynamic.py) on the cpu backend's ``int_dot_matmul``
(lowering/int_dot.py, native/int_dot_matmul.cpp), against the lean runtime of the same
program, which runs the graph's float chain (quantize_affine, dequantize_affine, matmul).

Shapes: M = 1..9, 33 and 128 rows (the kernel's row blocks of 4 and their remainders), K a
multiple of 32 (blocks of 32) and not (one block of K, odd and even, 4-bit quad pairs with
and without a padded half), N around the 16-column panels and 64-column chunks; int8 and
int4 weights; with and without bias; the AVX512-VNNI, AVX2 and portable kernels
(test_cpu_int_dot_kernels.py compares them on plans written by hand).

Tolerance: both sides quantize the activations to the same integers (the same float32
operations, round half to even; a test below plants values on .5 steps). Lean then sums K
products of the dequantized float32 values a_d = fl(q·s), w_d = fl(q_w·s_w) in NumPy's
order: within γ(K+1)·(Σ|a_d·w_d| + |b|) of their exact sum. The engine sums each block's
integer products exactly and adds K/32 (or 1) float32 terms fl(s·s_w)·S (one rounding each,
one for S's conversion past 2^24) and the bias: within γ(K/g + 3)·Σ|q·q_w·s·s_w| (+ |b|) of
Σ q·q_w·s·s_w, which is within γ(2)·Σ|a_d·w_d| of lean's exact sum (the two dequantize
roundings). Together: under 2·γ(K + 4)·(Σ_k |a_d·w_d| + |b|), element for element
(γ(n) = n·u / (1 - n·u), u = 2^-24, Higham). A change to the activations' integers (one
step on one element) moves a result by s·|w_d|, far beyond it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from opforge.backends import get_backend
from opforge.backends.cpu import blob
from opforge.export import export
from opforge.runtime import load

sys.path.insert(0, str(Path(__file__).resolve().parent))  # test_cpu_hostile_plans

pytest.importorskip("torchao")  # torchao::quantize_affine / dequantize_affine
pytestmark = pytest.mark.skipif(get_backend("cpu").unavailable() is not None,
                                reason="the cpu backend's oneDNN is not installed")

from opforge.quantize.dynamic import DynamicQuantLinear  # noqa: E402

U = 2.0 ** -24


def _kernel(monkeypatch, kernel: str) -> None:
    """Choose the op's kernel (the switches are read when the op is built)."""
    from test_cpu_int_dot_kernels import KERNELS

    for name, value in KERNELS[kernel].items():
        monkeypatch.setenv(name, value)

# (M, K, N): every M of 1..9, 33 and 128; K = 32·j (blocks of 32) or not (one block: 45
# odd, 36 = 9 quads: a 4-bit last quad pair half padding, 20)
SHAPES = [(1, 64, 67), (2, 45, 17), (3, 96, 1), (4, 256, 129), (5, 36, 31), (6, 32, 50),
          (7, 20, 65), (8, 128, 15), (9, 160, 33), (33, 64, 47), (128, 96, 20)]


class Linears(torch.nn.Module):
    """One dynamically quantized linear per shape, each on its own input; ``bias``: every
    other layer has one (True), or none does."""

    def __init__(self, bits: int, bias: bool, shapes=SHAPES, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.shapes = shapes
        self.layers = torch.nn.ModuleList(
            DynamicQuantLinear(torch.nn.Linear(k, n, bias=bias and i % 2 == 0), bits)
            for i, (_, k, n) in enumerate(shapes))

    def forward(self, *xs):
        return tuple(layer(x) for layer, x in zip(self.layers, xs))


def _inputs(shapes=SHAPES, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(m, k, generator=g) * 3 for m, k, _ in shapes)


def _dequantized_activation(layer: DynamicQuantLinear, x: torch.Tensor) -> torch.Tensor:
    """What the chain hands the linear (torch's ops, which lean reproduces bit for bit)."""
    g, k = layer.group, layer.in_features
    s = x.reshape(*x.shape[:-1], k // g, g).abs().amax(-1).clamp(min=2.0 ** -64) / 127
    zero = torch.zeros_like(s, dtype=torch.int32)
    ops = torch.ops.torchao
    xq = ops.quantize_affine(x, [1, g], s, zero, torch.int8, -127, 127)
    return ops.dequantize_affine(xq, [1, g], s, zero, torch.int8, -127, 127)


def _bound(layer: DynamicQuantLinear, x: torch.Tensor) -> np.ndarray:
    """2·γ(K+4)·(Σ_k |a_d·w_d| + |b|) per output (module docstring)."""
    a = _dequantized_activation(layer, x).double().numpy()
    w = layer.weight().double().numpy()
    k = w.shape[1]
    gamma = (k + 4) * U / (1 - (k + 4) * U)
    extra = 0.0 if layer.bias is None else np.abs(layer.bias.double().numpy())
    return 2 * gamma * (np.abs(a) @ np.abs(w).T + extra)


def _kinds(program) -> list:
    out = []
    for d in program.delegates:
        plan, _ = blob.parse(program.segments[d.segment].data)
        out += [(op["kind"], op["ia"]) for op in plan["ops"]]
    return out


def _check(model, inputs, got, want):
    for layer, x, g, w in zip(model.layers, inputs, got, want):
        assert g.shape == w.shape and g.dtype == np.float32
        excess = np.abs(g.astype(np.float64) - w) - _bound(layer, x)
        assert excess.max() <= 0, ((layer.in_features, layer.out_features), float(excess.max()))


@pytest.fixture(scope="module", params=[4, 8])
def exported(request):
    """(model, inputs, cpu program, lean's outputs) per weight bit width."""
    bits = request.param
    model = Linears(bits, True, seed=bits).eval()
    inputs = _inputs(seed=bits)
    program = export(model, inputs, backends=["cpu"])
    want = load(export(model, inputs)).method("forward")(*[x.numpy() for x in inputs])
    return model, inputs, program, want


@pytest.mark.parametrize("kernel", ["vnni", "avx2", "portable"])
def test_int_dot_matches_lean(exported, kernel, monkeypatch):
    _kernel(monkeypatch, kernel)
    model, inputs, program, want = exported
    kinds = _kinds(program)
    taken = [ia for kind, ia in kinds if kind == "int_dot_matmul"]
    bits = model.layers[0].bits
    assert len(taken) == len(SHAPES) and all(ia[0] == bits for ia in taken), kinds
    # nothing of the float chain is left: no matmul, reduction or quantize
    assert {k for k, _ in kinds} == {"int_dot_matmul"}, kinds
    got = load(program).method("forward")(*[x.numpy() for x in inputs])
    _check(model, inputs, got, want)


def test_kernels_equal_bit_for_bit(exported, monkeypatch):
    """The kernels sum the same integers and run the same float epilogue in the same
    order: equal results, bit for bit, at 1 and 2 threads (a kernel the CPU lacks falls
    back to the next: AVX2, then portable)."""
    _, inputs, program, _ = exported
    arrays = [x.numpy() for x in inputs]
    outs = []
    for kernel in ("portable", "vnni", "avx2"):
        _kernel(monkeypatch, kernel)
        for threads in (1, 2):
            outs.append((kernel, threads, load(program, num_threads=threads).method("forward")(*arrays)))
    for kernel, threads, got in outs[1:]:
        for g, f in zip(got, outs[0][2]):
            np.testing.assert_array_equal(g, f, err_msg=f"{kernel} threads {threads}")


def test_native_runtime_runs_the_program(exported):
    """The C++ runtime reads the same blob and runs the same engine op: the Python
    runtime's results, bit for bit (its blob checks once refused the op's kind)."""
    _, inputs, program, _ = exported
    arrays = [x.numpy() for x in inputs]
    want = load(program).method("forward")(*arrays)
    got = load(program, executor="native").method("forward")(*arrays)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.asarray(g), w)


@pytest.mark.parametrize("bits", [4, 8])
def test_activation_rounds_half_to_even(bits, monkeypatch):
    """Values planted on .5 steps: a block whose largest magnitude is 127 has scale 1 (127 /
    127) and inverse 1, so x = 2.5 quantizes to 2 (half to even; 3 half away from zero),
    -2.5 to -2, 3.5 to 4, 0.5 to 0, 1.5 to 2. Output n reads only element n + 1 (weight 1 →
    q_w = 127 or -8 in its block), so a kernel rounding otherwise is off by ~1 there."""
    planted = [2.5, -2.5, 3.5, 0.5, -0.5, 1.5, -3.5, 126.5]
    linear = torch.nn.Linear(32, len(planted), bias=False)
    with torch.no_grad():
        linear.weight.zero_()
        for n in range(len(planted)):
            linear.weight[n, n + 1] = 1.0
    model = Linears(bits, False, shapes=[(2, 32, len(planted))]).eval()
    model.layers[0] = DynamicQuantLinear(linear, bits)
    x = torch.zeros(2, 32)
    x[:, 0] = 127.0
    x[0, 1:1 + len(planted)] = torch.tensor(planted)
    x[1, 1:1 + len(planted)] = -torch.tensor(planted)
    program = export(model, (x,), backends=["cpu"])
    assert [k for k, _ in _kinds(program)] == ["int_dot_matmul"]
    want = load(export(model, (x,))).method("forward")(x.numpy())[0]
    w = model.layers[0].weight().numpy()
    even = np.rint(np.array([planted, [-p for p in planted]], np.float32))
    for kernel in ("vnni", "avx2", "portable"):
        _kernel(monkeypatch, kernel)
        got = load(program).method("forward")(x.numpy())[0]
        _check(model, (x,), [got], [want])
        np.testing.assert_allclose(got, even * np.diag(w[:, 1:1 + len(planted)]), rtol=1e-6)


@pytest.mark.slow  # ~30 s: two exports of the dynamic decoder, 13 s each on this machine
def test_tiny_decoder_8da4w_greedy_tokens_equal_lean():
    """The bundled decoder (small config) quantized 8da4w: every linear (the output head
    included) on int_dot_matmul, and the greedy tokens of the cpu backend equal lean's."""
    from opforge.examples.decoder import TinyDecoder, export_decoder, greedy_decode
    from opforge.quantize.dynamic import quantize_dynamic

    model = quantize_dynamic(TinyDecoder(max_len=48, seed=5).eval(), "8da4w")
    linears = sum(isinstance(m, DynamicQuantLinear) for m in model.modules())
    cpu = export_decoder(model, backends=["cpu"])
    assert [k for k, _ in _kinds(cpu)].count("int_dot_matmul") == linears
    lean = load(export_decoder(model)).method("forward")
    engine = load(cpu)
    method = engine.method("forward")
    for prompt in ([5, 1, 9, 30], [7] * 11):
        engine.reset_state()
        want = greedy_decode(lambda t, p: lean(t.numpy(), p.numpy())[0], prompt, 24)
        got = greedy_decode(lambda t, p: method(t.numpy(), p.numpy())[0], prompt, 24)
        assert got == want


def test_weights_stored_packed(exported):
    """The delegate holds the weights as bytes (4 bits: two a byte) and their scales in
    float16 (opforge.quantize.dynamic rounds them to float16 values), no float32 copy of them:
    8 bits 1.0625 and 4 bits 0.5625 bytes a weight (K of 32·j; the shapes' padding to 16
    columns and 8 quads adds to it), of float32's 4."""
    _, _, program, _ = exported
    floats = sum(k * n * 4 for _, k, n in SHAPES)
    stored = sum(len(program.segments[d.segment].data) for d in program.delegates)
    assert stored < floats / 3, (stored, floats)
    scale_dtypes = set()
    for d in program.delegates:
        plan, _ = blob.parse(program.segments[d.segment].data)
        scale_dtypes |= {plan["tensors"][op["in"][2]]["dtype"] for op in plan["ops"]
                         if op["kind"] == "int_dot_matmul"}
    assert scale_dtypes == {5}  # float16


def test_off_switch_keeps_the_float_chain(monkeypatch):
    monkeypatch.setenv("OPFORGE_CPU_INT_DOT", "0")
    program = export(Linears(8, True, shapes=SHAPES[:2]).eval(), _inputs(SHAPES[:2]),
                     backends=["cpu"])
    assert "int_dot_matmul" not in [k for k, _ in _kinds(program)]


# --- plans written by hand: the contract ------------------------------------------------
def _dot_plan(m=2, k=64, n=20, group=32, bits=4, scales_as=None):
    import test_cpu_hostile_plans as hostile

    from opforge.backends.cpu.lowering.int_dot import pack
    from opforge.backends.cpu.lowering.int_weights import IntWeight

    g = torch.Generator().manual_seed(0)
    top = 7 if bits == 4 else 127
    q = torch.randint(-top - 1, top + 1, (n, k), generator=g, dtype=torch.int8)
    scales = torch.rand(n, k // group, generator=g) * 0.05 + 0.001
    if scales_as is not None:  # float16 values, stored as float16 or as float32
        scales = scales.half().float()
    packed, panel_scales = pack(IntWeight(q, scales, group, bits))
    if scales_as is not None:
        assert panel_scales.dtype == torch.float16  # pack stores float16 values in 2 bytes
        panel_scales = panel_scales.to(scales_as)
    p = hostile.Plan()
    a = p.tensor(hostile.F32, [m, k], role="input")
    y = p.tensor(hostile.F32, [m, n], role="output")
    from test_cpu_int_dot_kernels import scales_const

    p.op("int_dot_matmul", [a, p.const(packed.numpy()), scales_const(p, panel_scales)], [y], ia=[bits, group],
         fa=[2.0 ** -64])
    return p


@pytest.mark.parametrize("change", ["bits", "group", "group > 65536", "eps", "w dims",
                                    "w dtype", "scales dims"])
def test_contract_refuses_malformed_int_dot_matmul(change):
    import test_cpu_hostile_plans as hostile

    from opforge.errors import OpforgeError

    p = _dot_plan()
    op, tensors = p.ops[0], p.tensors
    if change == "bits":
        op["ia"][0] = 5
    elif change == "group":
        op["ia"][1] = 24  # does not divide K
    elif change == "group > 65536":
        op["ia"][1] = 1 << 17
    elif change == "eps":
        op["fa"][0] = 0.1  # not a float32 value
    elif change == "w dims":
        tensors[op["in"][1]]["dims"] = [4, 2, 2, 64]  # the same bytes, other panels
        tensors[op["in"][1]]["strides"] = [256, 128, 64, 1]
    elif change == "w dtype":
        tensors[op["in"][1]]["dtype"] = hostile.I8
    else:  # [P, G, 16]: the layout before the chunk order (a program exported then)
        tensors[op["in"][2]]["dims"] = [2, 2, 16]
        tensors[op["in"][2]]["strides"] = [32, 16, 1]
    with pytest.raises(OpforgeError, match="int_dot_matmul"):
        p.handle()


@pytest.mark.parametrize("kernel", ["vnni", "avx2", "portable"])
@pytest.mark.parametrize("bits", [4, 8])
def test_float16_scales_read_as_their_float32_values(bits, kernel, monkeypatch):
    """Scales that are float16 values (what opforge.quantize.dynamic's rounding makes) are
    stored in 2 bytes and read as the same float32 values: the results equal those of the same
    scales stored as float32, bit for bit (N = 40: a chunk of 3 panels; K = 96: 3 blocks)."""
    import test_cpu_hostile_plans as hostile

    _kernel(monkeypatch, kernel)
    x = np.random.default_rng(0).standard_normal((5, 96)).astype(np.float32)
    outs = [hostile.run(_dot_plan(m=5, k=96, n=40, bits=bits, scales_as=dtype).handle(), x)[0]
            for dtype in (torch.float16, torch.float32)]
    assert np.isfinite(outs[0]).all() and np.abs(outs[0]).max() > 0
    np.testing.assert_array_equal(outs[0], outs[1])


def test_hand_written_plan_runs():
    import test_cpu_hostile_plans as hostile

    x = np.random.default_rng(0).standard_normal((2, 64)).astype(np.float32)
    out = hostile.run(_dot_plan().handle(), x)[0]
    assert out.shape == (2, 20) and np.isfinite(out).all()
