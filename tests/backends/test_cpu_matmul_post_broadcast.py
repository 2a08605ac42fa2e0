"""A binary op after a matmul (or after another binary) becomes its post-op only in the
broadcasts oneDNN's brgemm matmul (jit binary) runs (issue 47).

torchvision's Swin, exported with the portable kernel set (``matmul`` kept, not decomposed
to ``bmm``), computes its window attention's scores as a 4-d matmul [nW, heads, 49, 49] and
adds the relative-position bias [1, heads, 49, 49]. Fused as a post-op, that bias sent
oneDNN to its reference matmul (``ref:any``): 80-330 ms per block instead of about 0.5 ms.
``layouts.matmul_post_broadcast`` holds the keep masks the brgemm kernel was measured to
take; any other operand stays a binary op of its own. Swin V2 multiplies its scores by a
per-head logit scale and adds a (1, heads, 64, 64) bias: fused onto that multiply, the bias
sent oneDNN's binary to its reference kernel (``layouts.binary_post_broadcast``).

Each case must run no reference kernel (nor oneDNN's plain ``gemm`` where brgemm runs) and match eager
float64 by ``cpu_reference.check_against_float64`` (8x eager float32's own error plus 2 ulp
of the output's scale: fused or not, the result is one float32 rounding of the product's
sum plus one of the add, as eager's).
"""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn as nn

from opforge.backends.cpu import engine as cpu_engine
from opforge.backends.cpu.lowering.layouts import binary_post_broadcast, matmul_post_broadcast
from opforge.export import export
from opforge.runtime import load

from cpu_reference import check_against_float64
from test_cpu_hostile_plans import cpu_flags
from test_cpu_reference_cliffs import SwinWindowAttention, spread


class MatmulAdds(nn.Module):
    """a @ b + c_i for one constant c_i per keep mask: one output each."""

    def __init__(self, biases: list[torch.Tensor]):
        super().__init__()
        for i, bias in enumerate(biases):
            self.register_buffer(f"bias{i}", bias)
        self.count = len(biases)

    def forward(self, a, b):
        return tuple(a @ b + getattr(self, f"bias{i}") for i in range(self.count))


def _slow(impl: str) -> bool:
    # oneDNN's plain gemm is its fallback where brgemm runs f32 matmuls (AVX-512); on AVX2
    # (an AMD Zen 3) every f32 matmul, fused or not, is its jit gemm (``gemm:jit:f32``),
    # which ran Swin's window attention at eager's speed there (2.0 ms against 1.9)
    name, _, isa = impl.partition(":")
    return name.startswith("ref") or isa == "any" or (name == "gemm" and "avx512f" in cpu_flags())


def _run(model, inputs, kernels="portable"):
    program = export(model, inputs, backends=["cpu"], kernels=kernels)
    impls = cpu_engine.program_impls(program)
    assert any(op.startswith("matmul") for op, _ in impls), impls
    assert not [p for p in impls if _slow(p[1])], impls
    return impls, load(program).method("forward")(*[t.numpy() for t in inputs])


@pytest.mark.parametrize("kernels", [None, "portable"])
def test_swin_scores_with_their_bias_run_no_reference_matmul(kernels):
    # 16 windows of 7x7 tokens, 3 heads: the relative-position bias and the shift mask
    g = torch.Generator().manual_seed(5)
    model = spread(SwinWindowAttention(48, 3, 16, 7))
    inputs = (torch.randn(32, 49, 48, generator=g),)
    _, got = _run(model, inputs, kernels)
    check_against_float64(model, inputs, got)


@pytest.mark.parametrize("rank", [2, 3, 4])
def test_matmul_with_an_added_operand_of_each_broadcast(rank):
    # every keep mask of the rank (4: torchvision's scores) in one program, one output each;
    # fused or kept apart, none may reach a reference kernel
    dims = (4, 3, 5, 7)[-rank:]
    g = torch.Generator().manual_seed(rank)
    masks = list(itertools.product((0, 1), repeat=rank))
    biases = [torch.randn(tuple(d if k else 1 for d, k in zip(dims, m)), generator=g) for m in masks]
    inputs = (torch.randn(*dims[:-1], 8, generator=g), torch.randn(*dims[:-2], 8, dims[-1], generator=g))
    model = MatmulAdds(biases).eval()
    impls, got = _run(model, inputs)
    apart = sum(not matmul_post_broadcast(dims, b.shape) for b in biases)
    assert sum(op.startswith("binary") for op, _ in impls) == apart, impls
    check_against_float64(model, inputs, got)


def test_the_measured_table():
    # Swin's bias over its scores: not taken; per column, per batch and column: taken
    assert not matmul_post_broadcast((64, 3, 49, 49), (1, 3, 49, 49))
    assert matmul_post_broadcast((64, 3, 49, 49), (49,))
    assert matmul_post_broadcast((64, 3, 49, 49), (64, 1, 1, 49))
    assert not matmul_post_broadcast((5, 7), (5, 1))              # per row of a 2-d product
    assert matmul_post_broadcast((2, 3, 4, 5, 6), (2, 3, 4, 5, 6))  # rank 5: none or all only
    assert not matmul_post_broadcast((2, 3, 4, 5, 6), (6,))
    assert not matmul_post_broadcast((2, 3), (1, 2, 3))           # an operand of higher rank


class ScaleAdds(nn.Module):
    """a * c (per channel) + d_i for one constant d_i per keep mask, one output each."""

    def __init__(self, scale: torch.Tensor, biases: list[torch.Tensor]):
        super().__init__()
        self.register_buffer("scale", scale)
        for i, bias in enumerate(biases):
            self.register_buffer(f"bias{i}", bias)
        self.count = len(biases)

    def forward(self, a):
        return tuple(a * self.scale + getattr(self, f"bias{i}") for i in range(self.count))


@pytest.mark.parametrize("rank", [3, 4])
def test_binary_with_an_added_operand_of_each_broadcast(rank):
    dims = (4, 3, 5, 7)[-rank:]
    g = torch.Generator().manual_seed(10 + rank)
    masks = list(itertools.product((0, 1), repeat=rank))
    biases = [torch.randn(tuple(d if k else 1 for d, k in zip(dims, m)), generator=g) for m in masks]
    scale = torch.randn((1, dims[1]) + (1,) * (rank - 2), generator=g)
    model = ScaleAdds(scale, biases).eval()
    inputs = (torch.randn(dims, generator=g),)
    program = export(model, inputs, backends=["cpu"], kernels="portable")
    impls = cpu_engine.program_impls(program)
    assert not [p for p in impls if _slow(p[1])], impls
    apart = sum(not binary_post_broadcast(dims, b.shape) for b in biases)
    assert sum(op.startswith("binary") for op, _ in impls) == len(masks) + apart, impls
    check_against_float64(model, inputs, load(program).method("forward")(*[t.numpy() for t in inputs]))
