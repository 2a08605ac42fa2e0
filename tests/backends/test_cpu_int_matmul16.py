"""``int_matmul``'s int16 mode (native/int_matmul16.cpp): 4-bit weights against activations
on a 16-bit grid (fa [s]), each block's products summed exactly in int32 by AVX512-VNNI or,
on a CPU without it, by AVX2's vpmaddwd (native/int_matmul16_avx2.cpp: the same sums, the same
bits), and the lowering that passes the grid of a 16-bit scheme's linear input
(lowering/int_weights.py).

Plans written by hand (the lowering's packing): rows M = 1..9 (the kernel's blocks of 2 and
the chunk's 4 panels) and from 24 (the prompt's dequantize-once path, reading this mode's
layout), K odd and even with a last partial block, N around the 16-column panels and the
64-column chunks, groups 32 / 64 / 128 / K, with and without a bias, at 1 and 2 threads.

Tolerances (int_matmul16.cpp's arithmetic): the integer sums are exact, then per output G
conversions and fused multiply-adds and one final fma: within γ(G+5)·(Σ_k |a·w| + |bias|)
of the exact sum of the float32 operands (a = fl(i·s), w = fl(q·scale)), G = ceil(K/group),
u = 2^-24, γ(n) = n·u / (1 - n·u); the float path (a row past int16, or M >= 24) is the
float kernel's arithmetic, γ(K) of it, and bit for bit what the same op computes with the
int16 mode off (it dequantizes the same products and sums them in the same order).
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

pytestmark = pytest.mark.skipif(get_backend("cpu").unavailable() is not None,
                                reason="the cpu backend's oneDNN is not installed")

U = 2.0 ** -24
GRID = 3.0 / 32767  # the activations' grid: fl(i·GRID), |i| <= 32767 for |a| <= 3


def _gamma(n: int) -> float:
    return n * U / (1 - n * U)


def _plan(m, k, n, group, bias=False, grid=GRID, seed=0):
    """An ``int_matmul`` plan with fa [grid] (the lowering's packing), its float64 weights
    [N, K] and bias (zeros when none)."""
    import test_cpu_hostile_plans as hostile

    from opforge.backends.cpu.lowering.int_weights import IntWeight

    g = torch.Generator().manual_seed(seed)
    q = torch.randint(-8, 8, (n, k), generator=g, dtype=torch.int8)
    scales = torch.rand(n, -(-k // group), generator=g) * 0.05 + 0.001
    weight = IntWeight(q, scales, group, 4)
    packed, panel_scales = weight.packed()
    p = hostile.Plan()
    a = p.tensor(hostile.F32, [m, k], role="input")
    y = p.tensor(hostile.F32, [m, n], role="output")
    ins = [a, p.const(packed.numpy()), p.const(panel_scales.numpy())]
    b = torch.randn(n, generator=g) if bias else torch.zeros(n)
    if bias:
        ins.append(p.const(b.numpy()))
    p.op("int_matmul", ins, [y], ia=[4, group], fa=[grid] if grid else [])
    return p, weight.dequantized().double().numpy(), b.double().numpy()


def _on_grid(m, k, seed):
    """Activations fl(i·GRID), |i| <= 32767: standard normal clipped to [-3, 3] (unclipped, a
    row spanning more than 65535 steps would take the float path), rounded to the grid."""
    x = np.clip(np.random.default_rng(seed).standard_normal((m, k)), -3, 3)
    return np.round(x / GRID).astype(np.float32) * np.float32(GRID)


def _handle(p, threads=1):
    handle = p.handle(threads=threads)
    return handle, " ".join(str(line) for line in handle.describe())


def _int16_or_skip(described: str) -> None:
    if "int16 activations" not in described:
        pytest.skip("no AVX2 here: the op takes int_matmul's float path")


def _excess(got, x, w, b, n_roundings) -> float:
    """max(|got - exact| - γ(n)·(Σ|a·w| + |bias|)) over the outputs (<= 0: within)."""
    exact = x.astype(np.float64) @ w.T + b
    bound = _gamma(n_roundings) * (np.abs(x.astype(np.float64)) @ np.abs(w).T + np.abs(b))
    return float((np.abs(got.astype(np.float64) - exact) - bound).max())


SHAPES = [(1, 96, 67, 32, False), (2, 192, 17, 64, True), (3, 33, 1, 33, False),
          (4, 256, 129, 128, True), (5, 64, 31, 32, False), (6, 130, 50, 64, True),
          (7, 97, 65, 32, False), (8, 2048, 80, 32, True), (9, 45, 33, 45, True),
          (1, 768, 200, 768, False), (1, 4096, 16, 4096, True)]


@pytest.mark.parametrize("m,k,n,group,bias", SHAPES)
def test_int16_mode_within_its_bound(m, k, n, group, bias):
    """Within γ(G+5) of the exact sum at 1 and 2 threads (a wrong nibble, a scale of another
    block or column, a lost correction for the stored + 8 are off by orders more)."""
    import test_cpu_hostile_plans as hostile

    p, w, b = _plan(m, k, n, group, bias)
    x = _on_grid(m, k, m + k + n)
    for threads in (1, 2):
        handle, described = _handle(p, threads)
        _int16_or_skip(described)
        got = hostile.run(handle, x)[0]
        assert _excess(got, x, w, b, -(-k // group) + 5) <= 0, (threads, described)


@pytest.mark.parametrize("m,k,n,group,bias", [(1, 96, 67, 32, False), (3, 130, 17, 64, True),
                                               (2, 768, 70, 768, True), (5, 33, 16, 33, False)])
def test_rows_past_int16_are_shifted_within_the_bound(m, k, n, group, bias):
    """Rows of an asymmetric grid (integers in [-2000, 63000], a SwiGLU product's on a
    16-bit grid) are summed as i - shift: the same bound (a lost shift term is off by
    ~shift·Σ|w|); the last row symmetric, unshifted, in the same call."""
    import test_cpu_hostile_plans as hostile

    p, w, b = _plan(m, k, n, group, bias)
    handle, described = _handle(p)
    _int16_or_skip(described)
    x = _shifted_rows(m, k, k)
    x[-1] = _on_grid(1, k, 3)[0] if m > 1 else x[-1]
    got = hostile.run(handle, x)[0]
    assert _excess(got, x, w, b, -(-k // group) + 5) <= 0


@pytest.mark.parametrize("m,k,n,group", [(24, 257, 67, 32), (30, 300, 129, 64), (40, 96, 17, 96)])
def test_many_rows_are_the_float_path_bit_for_bit(m, k, n, group, monkeypatch):
    """From 24 rows the op dequantizes each chunk once a call from this mode's layout: the
    same products, summed in the same order, as the op with the int16 mode off."""
    import test_cpu_hostile_plans as hostile

    p, w, b = _plan(m, k, n, group, True)
    x = _on_grid(m, k, m + k)
    handle, described = _handle(p)
    _int16_or_skip(described)
    got = hostile.run(handle, x)[0]
    monkeypatch.setenv("OPFORGE_CPU_INT_MATMUL_INT16", "0")  # read when the op is built
    off, described_off = _handle(p)
    assert "int16" not in described_off
    want = hostile.run(off, x)[0]
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert _excess(got, x, w, b, k + 1) <= 0


def test_a_row_off_the_grid_takes_the_float_path(monkeypatch):
    """A row whose integers span more than 65535 steps (up to 40000 here, down to about
    -30000): the call takes the float path, bit for bit the op with the mode off; a NaN
    gives its row NaN."""
    import test_cpu_hostile_plans as hostile

    m, k, n, group = 3, 160, 40, 32
    p, w, b = _plan(m, k, n, group)
    handle, described = _handle(p)
    _int16_or_skip(described)
    x = _on_grid(m, k, 5)
    x[1, 7], x[1, 8] = np.float32(40000) * np.float32(GRID), np.float32(-30000) * np.float32(GRID)
    got = hostile.run(handle, x)[0]
    assert _excess(got, x, w, b, k + 1) <= 0
    monkeypatch.setenv("OPFORGE_CPU_INT_MATMUL_INT16", "0")
    want = hostile.run(_handle(p)[0], x)[0]
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    x[0, 3] = np.nan
    got = hostile.run(handle, x)[0]
    assert np.isnan(got[0]).all() and np.isfinite(got[1:]).all()


@pytest.mark.parametrize("m,k,n,group,shifted", [(1, 768, 200, 128, False), (2, 130, 67, 64, True),
                                                   (3, 97, 33, 32, False), (5, 256, 129, 32, True)])
def test_the_avx2_kernel_gives_the_vnni_kernels_bits(m, k, n, group, shifted, monkeypatch):
    """Where the CPU has AVX512-VNNI, OPFORGE_CPU_INT_MATMUL_VNNI=0 runs the AVX2 kernel: the
    same int32 sums and the same float steps, so the same bits (a sum of another pair, a lost
    shift or a store of another column would differ in many outputs)."""
    import test_cpu_hostile_plans as hostile

    p, _, _ = _plan(m, k, n, group, True)
    vnni, described = _handle(p)
    if "AVX512-VNNI" not in described:
        pytest.skip("no AVX512-VNNI here: the AVX2 kernel is the only one (the tests above check it)")
    x = _shifted_rows(m, k) if shifted else _on_grid(m, k, 11)
    monkeypatch.setenv("OPFORGE_CPU_INT_MATMUL_VNNI", "0")  # read when the op is built
    avx2, described_avx2 = _handle(p)
    assert "vpmaddwd" in described_avx2, described_avx2
    got, want = hostile.run(avx2, x)[0], hostile.run(vnni, x)[0]
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_describe_gives_one_name_per_op():
    """An op's name may hold commas ("matmul on int4 weights (own kernel, int16 activations,
    vpmaddwd, AVX2)"): describe() still gives one entry per op, as many as impls() (which
    program_impls pairs with them)."""
    import test_cpu_hostile_plans as hostile

    p, _, _ = _plan(1, 64, 20, 32)
    p.op("eltwise", [p.ops[0]["out"][0]], [p.tensor(hostile.F32, [1, 20], role="output")],
         [hostile.RELU], [0.0, 0.0])
    handle = p.handle()
    names, impls = handle.describe(), handle.impls()
    assert len(names) == len(impls) == 2, names
    if {"avx2", "fma"} <= hostile.cpu_flags():
        assert "int16 activations" in names[0] and "," in names[0], names


def _shifted_rows(m, k, seed=0):
    """Rows on an asymmetric grid (integers in [-2000, 63000]: the int16 mode shifts them)."""
    i = np.random.default_rng(seed).integers(-2000, 63001, (m, k))
    i[:, 0], i[:, 1] = -2000, 63000
    return i.astype(np.float32) * np.float32(GRID)


@pytest.mark.parametrize("change", ["bits 8", "zero scale", "nan scale", "group past 4096"])
def test_contract_refuses_a_malformed_int16_mode(change):
    from opforge.errors import OpforgeError

    k = 8192 if change == "group past 4096" else 64
    p, _, _ = _plan(2, k, 20, k if change == "group past 4096" else 32)
    op = p.ops[0]
    if change == "bits 8":
        op["ia"][0] = 8  # (refused for the fa before the weights' layout is looked at)
    elif change != "group past 4096":
        op["fa"] = [0.0 if change == "zero scale" else float("nan")]
    with pytest.raises(OpforgeError, match="int_matmul.*activation scale"):
        p.handle()


PARAMS = (6.0 / 65535, 32768, 0, 65535, torch.int32)  # 16a4w_block's storage, symmetric


class _Linear16(torch.nn.Module):
    """A 16-bit quantized activation (quantize-dequantize per tensor, int32 storage in
    [0, 65535] as 16a4w_block writes it) into a linear on int4 block weights."""

    def __init__(self, k=96, n=40, group=32) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(7)
        self.group = group
        self.register_buffer("q", torch.randint(-8, 8, (n, k), generator=g, dtype=torch.int8))
        self.register_buffer("s", torch.rand(n, k // group, generator=g) * 0.05 + 0.001)

    @staticmethod
    def activation(x):
        import torch.ao.quantization.fx._decomposed  # noqa: F401  (quantized_decomposed)

        qd = torch.ops.quantized_decomposed
        return qd.dequantize_per_tensor(qd.quantize_per_tensor(x, *PARAMS), *PARAMS)

    def weight(self):
        return torch.ops.torchao.dequantize_affine(self.q, [1, self.group], self.s, None, torch.int8, -8, 7)

    def forward(self, x):
        return torch.nn.functional.linear(self.activation(x), self.weight())


def _int_matmuls(program) -> list:
    out = []
    for d in program.delegates:
        plan, _ = blob.parse(program.segments[d.segment].data)
        out += [op for op in plan["ops"] if op["kind"] == "int_matmul"]
    return out


def test_lowering_passes_the_grid_and_matches_lean(monkeypatch):
    """The linear's input is on the quantize-dequantize's grid: int_matmul gets fa [scale],
    and the outputs are lean's within both sides' bounds (lean: γ(K) of the exact sum, this
    one γ(G+5)); with OPFORGE_CPU_INT16_ACTIVATIONS=0 at export it gets none."""
    pytest.importorskip("torchao")
    model = _Linear16().eval()
    x = (torch.randn(3, 96, generator=torch.Generator().manual_seed(5)) * 2,)
    program = export(model, x, backends=["cpu"])
    ops = _int_matmuls(program)
    assert len(ops) == 1 and ops[0]["fa"] == [pytest.approx(PARAMS[0], rel=1e-7)], ops
    want = load(export(model, x)).method("forward")(x[0].numpy())[0]
    got = load(program).method("forward")(x[0].numpy())[0]
    with torch.no_grad():
        a, w = model.activation(x[0]).double().numpy(), model.weight().double().numpy()
    total = np.abs(a) @ np.abs(w).T
    assert (np.abs(got.astype(np.float64) - want) <= (_gamma(96) + _gamma(3 + 5)) * total).all()
    monkeypatch.setenv("OPFORGE_CPU_INT16_ACTIVATIONS", "0")
    assert _int_matmuls(export(model, x, backends=["cpu"]))[0]["fa"] == []


# --- cases for the sanitized run (test_cpu_sanitized.py): the mode's kernel on this CPU (its
# VNNI one, else AVX2), one row, row pairs, shifted rows, partial panels, a prompt's rows
def _case(m, k, n, group, shifted):
    def run():
        import test_cpu_hostile_plans as hostile

        p, w, b = _plan(m, k, n, group, True)
        handle, described = _handle(p)
        if "int16 activations" not in described:
            return "ran ok"  # (no AVX2 CPU: nothing of this mode to check)
        x = _shifted_rows(m, k) if shifted else _on_grid(m, k, 2)
        got = hostile.run(handle, x)[0]
        roundings = k + 1 if m >= 24 else -(-k // group) + 5  # (24 rows: the float path)
        return "ran ok" if _excess(got, x, w, b, roundings) <= 0 else f"past the bound: {described}"
    return run


import test_cpu_hostile_plans as _hostile  # noqa: E402  (sys.path above)

_SHAPES = [(1, 96, 67, 32, False), (2, 192, 17, 64, True), (3, 33, 1, 33, False),
           (7, 130, 129, 64, True), (30, 257, 70, 32, False)]
CASES, EXPECT = _hostile.ran_ok_cases({
    f"int16_{m}x{k}x{n}_g{g}{'_shifted' if s else ''}": _case(m, k, n, g, s) for m, k, n, g, s in _SHAPES})
test_the_case_file_runs = _hostile.case_file_test(__file__, CASES, EXPECT)


if __name__ == "__main__":
    _hostile.report_cases(CASES, sys.argv[1:])
