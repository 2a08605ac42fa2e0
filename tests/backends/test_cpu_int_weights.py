"""Linear layers on integer weights (lowering/int_weights.py, native/int_matmul.cpp): the
cpu backend reads the int8 / int4 weights packed and dequantizes them in registers, and
its outputs match the lean runtime's (which dequantizes to float32, then multiplies).

Shapes: rows M = 1..9 (the kernel's blocks of 4 rows and their remainders), K not a
multiple of the block (groups of 32/64/128 and a last partial one; odd K for 4 bits),
N odd and around the 16-column panels and 4-panel chunks; per channel and per block;
with and without bias; the AVX-512 kernel, the AVX2 one and the portable one (each where
the CPU has it: one it lacks falls back; test_cpu_int_matmul_kernels.py holds them equal
bit for bit).

Tolerance: both sides multiply the same float32 weights (the lowering takes a weight only
when float32(q)·scale reproduces the weight folded at export bit for bit) and sum K
products plus a bias in float32, each in its own order: each result lies within
γ(K+1)·(Σ_k |a·w| + |bias|) of the exact value (Higham, γ(n) = n·u / (1 - n·u),
u = 2^-24, any order, fused or not), so they differ by at most twice that.
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

pytest.importorskip("torchao")  # torchao::dequantize_affine (the quantize extra)
pytestmark = pytest.mark.skipif(get_backend("cpu").unavailable() is not None,
                                reason="the cpu backend's oneDNN is not installed")

U = 2.0 ** -24

# (M, K, N, group or None for per channel): every M of 1..9 once, odd K per channel, odd
# N across the panel (16) and chunk (64) boundaries. torchao's dequantize_affine needs K
# a multiple of its block; a last partial block is held to float64 on plans written by
# hand (test_partial_last_block_matches_float64)
SHAPES = [(1, 96, 67, 32), (2, 192, 17, 64), (3, 33, 1, None), (4, 256, 129, 128),
          (5, 64, 31, 32), (6, 7, 50, None), (7, 96, 65, 32), (8, 128, 15, 64),
          (9, 45, 33, None)]


class IntLinears(torch.nn.Module):
    """One linear per shape on ``dequantize(q)`` of a constant integer weight."""

    def __init__(self, bits: int, bias: bool, seed: int = 0, shapes=SHAPES) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.bits, self.shapes = bits, shapes
        top = 7 if bits == 4 else 127
        for i, (_, k, n, group) in enumerate(shapes):
            blocks = 1 if group is None else -(-k // group)
            q = torch.randint(-top - (bits == 4), top + 1, (n, k), generator=g, dtype=torch.int8)
            scale = torch.rand(n, blocks, generator=g) * 0.05 + 0.001
            self.register_buffer(f"q{i}", q)
            self.register_buffer(f"s{i}", scale if group is not None else scale.reshape(n))
            self.register_buffer(f"b{i}", torch.randn(n, generator=g) if bias else None)

    def weight(self, i: int) -> torch.Tensor:
        _, k, n, group = self.shapes[i]
        q, s = getattr(self, f"q{i}"), getattr(self, f"s{i}")
        lo, hi = (-8, 7) if self.bits == 4 else (-127, 127)
        if group is None:
            return torch.ops.quantized_decomposed.dequantize_per_channel(
                q, s, torch.zeros(n, dtype=torch.int64), 0, lo, hi, torch.int8)
        return torch.ops.torchao.dequantize_affine(q, [1, group], s, torch.zeros_like(s, dtype=torch.int32),
                                                   torch.int8, lo, hi)

    def forward(self, *xs):
        return tuple(torch.nn.functional.linear(x, self.weight(i), getattr(self, f"b{i}"))
                     for i, x in enumerate(xs))


def _inputs(seed: int = 1, shapes=SHAPES):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(m, k, generator=g) for m, k, _, _ in shapes)


def _bound(model: IntLinears, i: int, x: np.ndarray) -> np.ndarray:
    """2·γ(K+1)·(Σ_k |a·w| + |bias|) per output (module docstring)."""
    w = model.weight(i).double().numpy()
    k = w.shape[1]
    gamma = (k + 1) * U / (1 - (k + 1) * U)
    b = getattr(model, f"b{i}")
    extra = 0.0 if b is None else np.abs(b.double().numpy())
    return 2 * gamma * (np.abs(x.astype(np.float64)) @ np.abs(w).T + extra)


# kernel → (OPFORGE_CPU_INT_MATMUL_AVX512, OPFORGE_CPU_INT_MATMUL_AVX2), read when the op is built
KERNELS = {"avx512": ("1", "1"), "avx2": ("0", "1"), "portable": ("0", "0")}


def _kernel(monkeypatch, kernel: str) -> None:
    for name, value in zip(("OPFORGE_CPU_INT_MATMUL_AVX512", "OPFORGE_CPU_INT_MATMUL_AVX2"), KERNELS[kernel]):
        monkeypatch.setenv(name, value)


def _kinds(program) -> list:
    out = []
    for d in program.delegates:
        plan, _ = blob.parse(program.segments[d.segment].data)
        out += [(op["kind"], op["ia"]) for op in plan["ops"]]
    return out


@pytest.mark.parametrize("kernel", list(KERNELS))
@pytest.mark.parametrize("bits,bias", [(4, True), (8, False), (4, False), (8, True)])
def test_int_weights_match_lean(bits, bias, kernel, monkeypatch):
    _kernel(monkeypatch, kernel)
    model = IntLinears(bits, bias).eval()
    inputs = _inputs()
    program = export(model, inputs, backends=["cpu"])
    kinds = _kinds(program)
    taken = [ia for kind, ia in kinds if kind == "int_matmul"]
    assert len(taken) == len(SHAPES) and all(ia[0] == bits for ia in taken), kinds
    assert not [k for k, _ in kinds if k == "matmul"], kinds
    arrays = [x.numpy() for x in inputs]
    want = load(export(model, inputs)).method("forward")(*arrays)
    got = load(program).method("forward")(*arrays)
    for i, (g, w, x) in enumerate(zip(got, want, arrays)):
        assert g.shape == w.shape and g.dtype == np.float32
        excess = np.abs(g.astype(np.float64) - w) - _bound(model, i, x)
        assert excess.max() <= 0, (SHAPES[i], float(excess.max()))


# a prompt's rows: the wide path on AVX-512 (M >= 24), K across its 256-k blocks
WIDE_SHAPES = [(24, 256, 67, 32), (40, 320, 129, 64), (130, 96, 33, None), (33, 513, 20, None)]


@pytest.mark.parametrize("kernel", ["avx512", "avx2"])
@pytest.mark.parametrize("bits", [4, 8])
def test_many_rows_match_lean(bits, kernel, monkeypatch):
    """The wide path's outputs are lean's within the same bound as the register path's."""
    _kernel(monkeypatch, kernel)
    model = IntLinears(bits, True, shapes=WIDE_SHAPES).eval()
    inputs = _inputs(shapes=WIDE_SHAPES)
    program = export(model, inputs, backends=["cpu"])
    assert [k for k, _ in _kinds(program)].count("int_matmul") == len(WIDE_SHAPES)
    arrays = [x.numpy() for x in inputs]
    want = load(export(model, inputs)).method("forward")(*arrays)
    got = load(program).method("forward")(*arrays)
    for i, (g, w, x) in enumerate(zip(got, want, arrays)):
        excess = np.abs(g.astype(np.float64) - w) - _bound(model, i, x)
        assert excess.max() <= 0, (WIDE_SHAPES[i], float(excess.max()))


def test_int4_weights_are_stored_packed():
    """The delegate holds the 4-bit weights two a byte (and no float32 copy of them)."""
    model = IntLinears(4, False).eval()
    program = export(model, _inputs(), backends=["cpu"])
    floats = sum(k * n * 4 for _, k, n, _ in SHAPES)
    stored = sum(len(program.segments[d.segment].data) for d in program.delegates)
    assert stored < floats / 3, (stored, floats)


def test_int_weights_off_folds_to_float(monkeypatch):
    """OPFORGE_CPU_INT_WEIGHTS=0 keeps the folded float32 weights on oneDNN's matmul."""
    monkeypatch.setenv("OPFORGE_CPU_INT_WEIGHTS", "0")
    program = export(IntLinears(8, True).eval(), _inputs(), backends=["cpu"])
    kinds = [k for k, _ in _kinds(program)]
    assert "int_matmul" not in kinds and kinds.count("matmul") == len(SHAPES), kinds


# --- plans written by hand: a last partial block, threads, the contract -------------------
def _int_plan(m, k, n, group, bits, seed=0):
    """An ``int_matmul`` plan (the lowering's packing) and its float64 weights [N, K]."""
    import test_cpu_hostile_plans as hostile

    from opforge.backends.cpu.lowering.int_weights import IntWeight

    g = torch.Generator().manual_seed(seed)
    top = 7 if bits == 4 else 127
    q = torch.randint(-top - (bits == 4), top + 1, (n, k), generator=g, dtype=torch.int8)
    scales = torch.rand(n, -(-k // group), generator=g) * 0.05 + 0.001
    weight = IntWeight(q, scales, group, bits)
    packed, panel_scales = weight.packed()
    p = hostile.Plan()
    a = p.tensor(hostile.F32, [m, k], role="input")
    y = p.tensor(hostile.F32, [m, n], role="output")
    p.op("int_matmul", [a, p.const(packed.numpy()), p.const(panel_scales.numpy())], [y],
         ia=[bits, group])
    return p, weight.dequantized().double().numpy()


@pytest.mark.parametrize("kernel", list(KERNELS))
@pytest.mark.parametrize("m,k,n,group,bits", [
    (1, 100, 67, 32, 4), (3, 130, 17, 64, 8), (9, 257, 129, 128, 4), (4, 33, 20, 32, 4),
    (2, 33, 20, 32, 8), (5, 1, 3, 1, 8), (6, 200, 100, 64, 4)])
def test_partial_last_block_matches_float64(m, k, n, group, bits, kernel, monkeypatch):
    import test_cpu_hostile_plans as hostile

    _kernel(monkeypatch, kernel)
    p, w = _int_plan(m, k, n, group, bits)
    x = np.random.default_rng(m + k + n).standard_normal((m, k)).astype(np.float32)
    for threads in (1, 2):
        got = hostile.run(p.handle(threads=threads), x)[0]
        exact = x.astype(np.float64) @ w.T
        # one side (this kernel) against the exact sum of the same float32 weights
        gamma = k * U / (1 - k * U)
        assert (np.abs(got - exact) <= gamma * (np.abs(x) @ np.abs(w).T)).all()


# M from 24 on (a prompt) takes the wide path on AVX-512 and AVX2 (int_matmul.cpp: each chunk's
# weights dequantized once a call, 256 k at a time): M around that threshold and its
# 6-row blocks, K across the 256-k blocks (and odd for 4 bits), N across panels and chunks
@pytest.mark.parametrize("kernel", list(KERNELS))
@pytest.mark.parametrize("m,k,n,group,bits", [
    (8, 96, 67, 32, 4), (16, 130, 33, 64, 8), (23, 300, 100, 32, 4), (24, 257, 17, 257, 4),
    (25, 520, 65, 128, 8), (31, 768, 130, 64, 4), (64, 513, 48, 513, 8), (130, 600, 70, 32, 4),
    (128, 256, 129, 128, 8)])
def test_many_rows_match_float64_and_the_one_row_kernel(m, k, n, group, bits, kernel, monkeypatch):
    """Within the bound of the exact sum of the same float32 weights (lean's is within it
    the other way: the module docstring), and bit for bit what the same weights give one
    row at a time (the register path: the wide path dequantizes to the same float32
    products and sums them in the same order, int_matmul.cpp), at 1 and 2 threads."""
    import test_cpu_hostile_plans as hostile

    _kernel(monkeypatch, kernel)
    p, w = _int_plan(m, k, n, group, bits)
    one, _ = _int_plan(1, k, n, group, bits)
    x = np.random.default_rng(m + k + n).standard_normal((m, k)).astype(np.float32)
    rows = one.handle(threads=1)
    by_row = np.concatenate([hostile.run(rows, x[i:i + 1])[0] for i in range(m)])
    exact = x.astype(np.float64) @ w.T
    gamma = k * U / (1 - k * U)
    for threads in (1, 2):
        got = hostile.run(p.handle(threads=threads), x)[0]
        assert (np.abs(got - exact) <= gamma * (np.abs(x) @ np.abs(w).T)).all()
        assert np.array_equal(got.view(np.uint32), by_row.view(np.uint32)), threads


@pytest.mark.parametrize("change", ["bits", "group", "odd group", "w dims", "w dtype", "scales dims"])
def test_contract_refuses_malformed_int_matmul(change):
    import test_cpu_hostile_plans as hostile

    from opforge.errors import OpforgeError

    p, _ = _int_plan(2, 64, 20, 32, 4)
    op, tensors = p.ops[0], p.tensors
    if change == "bits":
        op["ia"][0] = 5
    elif change == "group":
        op["ia"][1] = 65
    elif change == "odd group":
        op["ia"][1] = 21
    elif change == "w dims":
        tensors[op["in"][1]]["dims"] = [4, 16, 16]  # the same bytes, other panels
        tensors[op["in"][1]]["strides"] = [256, 16, 1]
    elif change == "w dtype":
        tensors[op["in"][1]]["dtype"] = hostile.I8
    else:
        tensors[op["in"][2]]["dims"] = [4, 1, 16]
        tensors[op["in"][2]]["strides"] = [16, 16, 1]
    with pytest.raises(OpforgeError, match="int_matmul"):
        p.handle()


class IntEmbedding(torch.nn.Module):
    """An embedding of ``dequantize(q)``: per row (dequantize_per_channel, axis 0), or in
    blocks along each row (dequantize_affine)."""

    def __init__(self, bits: int, group: int | None, vocab: int = 37, dim: int = 70) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(bits + (group or 0))
        top = 7 if bits == 4 else 127
        self.bits, self.group = bits, group
        self.register_buffer("q", torch.randint(-top - (bits == 4), top + 1, (vocab, dim),
                                                generator=g, dtype=torch.int8))
        blocks = 1 if group is None else dim // group
        self.register_buffer("s", (torch.rand(vocab, blocks, generator=g) * 0.05 + 0.001).squeeze(1)
                             if group is None else torch.rand(vocab, blocks, generator=g) * 0.05)

    def forward(self, ids):
        lo, hi = (-8, 7) if self.bits == 4 else (-127, 127)
        if self.group is None:
            w = torch.ops.quantized_decomposed.dequantize_per_channel(
                self.q, self.s, torch.zeros(self.q.shape[0], dtype=torch.int64), 0, lo, hi, torch.int8)
        else:
            w = torch.ops.torchao.dequantize_affine(self.q, [1, self.group], self.s, None,
                                                    torch.int8, lo, hi)
        return torch.nn.functional.embedding(ids, w) * 2.0


@pytest.mark.parametrize("bits,group", [(8, None), (4, None), (4, 10), (8, 14)])
def test_int_embedding_rows_are_lean_rows(bits, group):
    """The rows are float32(q)·scale, the lean runtime's dequantized table's, bit for bit."""
    model = IntEmbedding(bits, group).eval()
    ids = torch.tensor([[0, 36, 5, 5], [17, 1, 2, 30]])
    program = export(model, (ids,), backends=["cpu"])
    assert ("int_embedding", [bits, group or 70, 70]) in _kinds(program), _kinds(program)
    want = load(export(model, (ids,))).method("forward")(ids.numpy())[0]
    got = load(program).method("forward")(ids.numpy())[0]
    assert np.array_equal(got, want)
    with pytest.raises(Exception, match="out of range"):
        load(program).method("forward")(np.array([[0, 37, 1, 1], [0, 0, 0, 0]]))
