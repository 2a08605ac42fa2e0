"""Two oneDNN reference-kernel cliffs that models written elsewhere reach (issue 47), as small
modules with the same patterns (timm and torchvision are not dependencies):

- CoaT's factorized attention takes a softmax over the tokens of ``k`` [B, heads, N, C/heads]
  (``dim=2``, a permuted view of the QKV projection): oneDNN has no jit softmax for an axis
  that is not innermost. The lowering copies the source once into the layout whose innermost
  dim is the axis and runs the softmax on rows there (``lowering/normalization.py``).
- Swin's window attention adds a relative-position bias [1, heads, 49, 49] and, in a shifted
  block, a mask [1, nW, 1, 49, 49] to scores viewed [B, nW, heads, 49, 49]: oneDNN's jit
  binary takes a few broadcast patterns only. The lowering merges dims and, where that is
  not enough, expands the smaller operand (``lowering/layouts.py``, ``jit_binary_broadcast``).

Each model must run no reference kernel (test_cpu_dense_operands.py checks that over these
with the zoo, with and without the engine's own kernels) and match eager float64 by the
criterion of ``cpu_reference.check_against_float64``: 8x eager float32's own error plus 2 ulp
of the output's scale (64 for log_softmax, as in test_cpu_ops.py: oneDNN's vectorised log).
The copy and the merged views move values, never round them, so the softmax and binary
results are those of the row kernel and jit binary on the same numbers.
"""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn as nn

from opforge.backends.cpu import engine as cpu_engine
from opforge.backends.cpu.lowering.layouts import (
    jit_binary_broadcast, jit_broadcast_expansion, merged_broadcast,
)
from opforge.export import export
from opforge.runtime import load

from cpu_reference import check_against_float64, spread
from test_cpu_hostile_plans import capability, cpu_flags  # noqa: F401 (a fixture: own kernels, then oneDNN's)


class CoatFactorAttention(nn.Module):
    """timm CoaT's ``FactorAttnConvRelPosEnc`` without its convolutional position encoding:
    softmax over the tokens of k, then (q @ (softmax(k)^T @ v))."""

    def __init__(self, dim: int = 64, heads: int = 8):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.scale = (dim // heads) ** -0.5

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        factor = k.softmax(dim=2).transpose(-1, -2) @ v
        y = self.scale * (q @ factor)
        return self.proj(y.transpose(1, 2).reshape(b, n, c))


class SwinWindowAttention(nn.Module):
    """torchvision's ``shifted_window_attention`` on windows already cut out: scores
    [B*nW, heads, 49, 49] plus a relative-position bias [1, heads, 49, 49], then, viewed
    [B, nW, heads, 49, 49], plus the shift mask [1, nW, 1, 49, 49] (0 or -100)."""

    def __init__(self, dim: int = 96, heads: int = 3, windows: int = 16, window: int = 7):
        super().__init__()
        self.heads, self.windows, self.tokens = heads, windows, window * window
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.bias = nn.Parameter(torch.randn(1, heads, self.tokens, self.tokens))
        mask = torch.zeros(windows, self.tokens, self.tokens)
        mask[windows // 2:, :, self.tokens // 2:] = -100.0
        mask[windows // 4:windows // 2, self.tokens // 3:, :] = -100.0
        self.register_buffer("mask", mask)

    def forward(self, x):
        bw, n, c = x.shape
        q, k, v = self.qkv(x).reshape(bw, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        attn = (q * (c // self.heads) ** -0.5) @ k.transpose(-2, -1)
        attn = attn + self.bias
        attn = attn.view(bw // self.windows, self.windows, self.heads, n, n)
        attn = (attn + self.mask.unsqueeze(1).unsqueeze(0)).view(-1, self.heads, n, n)
        y = attn.softmax(dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(bw, n, c))


class SoftmaxOverAxis(nn.Module):
    """A softmax (or log-softmax) over ``dim`` of a permuted view."""

    def __init__(self, dim: int, log: bool = False, perm=(0, 2, 1, 3)):
        super().__init__()
        self.dim, self.log, self.perm = dim, log, perm

    def forward(self, x):
        y = (x * 1.5).permute(*self.perm)
        return (y.log_softmax(self.dim) if self.log else y.softmax(self.dim)) * 2.0


class MaskAdd(nn.Module):
    """scores + a run-time mask that broadcasts in the middle ([1, nW, 1, n, n] over
    [1, nW, heads, n, n]) and + a mask broadcast per sample ([nW, 1, 1] over [nW, heads, m])."""

    def forward(self, scores, mask, per_window):
        s = scores * 2.0 + mask.unsqueeze(1).unsqueeze(0)
        return s.reshape(mask.shape[0], scores.shape[1], -1) + per_window


def pattern_models() -> dict:
    """name → (model, inputs): shared with test_cpu_dense_operands.py's reference-kernel check."""
    g = torch.Generator().manual_seed(47)
    return {
        "coat_factor_attention": (CoatFactorAttention(), (torch.randn(1, 197, 64, generator=g),)),
        "swin_window_attention": (SwinWindowAttention(), (torch.randn(32, 49, 96, generator=g),)),
    }


def _reference(impl: str) -> bool:
    name, _, isa = impl.partition(":")
    return bool(impl) and (name.startswith("ref") or isa == "any")


@pytest.mark.parametrize("name", ["coat_factor_attention", "swin_window_attention"])
def test_patterns_match_float64_without_reference_kernels(name, capability):
    model, inputs = pattern_models()[name]
    model = spread(model)
    program = export(model, inputs, backends=["cpu"])
    impls = cpu_engine.program_impls(program)
    assert any(op.startswith("softmax") for op, _ in impls), impls
    assert not [p for p in impls if _reference(p[1])], impls
    got = load(program).method("forward")(*[t.numpy() for t in inputs])
    check_against_float64(model, inputs, got)


@pytest.mark.parametrize("dim,log,perm", [
    (2, False, (0, 2, 1, 3)), (1, False, (0, 2, 1, 3)), (0, False, (0, 2, 1, 3)),
    (2, True, (0, 2, 1, 3)), (-1, False, (0, 3, 1, 2)), (3, False, (3, 2, 1, 0)),
])
def test_softmax_over_a_strided_axis_runs_on_rows(dim, log, perm, capability):
    model = SoftmaxOverAxis(dim, log, perm).eval()
    inputs = (torch.randn(2, 5, 37, 6, generator=torch.Generator().manual_seed(dim + 7)) * 3,)
    program = export(model, inputs, backends=["cpu"])
    impls = cpu_engine.program_impls(program)
    softmax = [p for p in impls if p[0].startswith(("softmax", "log_softmax"))]
    assert softmax and not [p for p in impls if _reference(p[1])], impls
    if capability == "native" and not log and "avx512f" in cpu_flags():
        # the engine's row kernel is AVX-512F only (softmax.cpp); elsewhere oneDNN's jit softmax
        # on the rows layout, which the reference check above already holds to
        assert all(op == "softmax (row kernel)" for op, _ in softmax), softmax
    got = load(program).method("forward")(*[t.numpy() for t in inputs])
    check_against_float64(model, inputs, got, ulps=64 if log else 2)


def test_softmax_over_a_strided_axis_with_symbolic_sizes_runs_on_rows(monkeypatch, capfd):
    # a dynamic dim: the rows layout takes the other dims in their logical order (strides
    # of symbolic sizes cannot be ranked); oneDNN's reference softmax took 8.5 ms here
    from torch.export import Dim

    monkeypatch.setenv("OPFORGE_CPU_PROFILE", "1")
    model = SoftmaxOverAxis(2).eval()
    x = torch.randn(2, 40, 8, 6, generator=torch.Generator().manual_seed(9)) * 3
    program = export(model, (x,), dynamic_shapes=({1: Dim("n", min=2, max=64)},), backends=["cpu"])
    loaded = load(program)
    for n in (40, 7):
        inputs = (x[:, :n].contiguous(),)
        check_against_float64(model, inputs, loaded.method("forward")(inputs[0].numpy()))
    loaded.delegates.close()
    err = capfd.readouterr().err
    assert "softmax" in err and "ref:" not in err, err


class MiddleMeans(nn.Module):
    """Means over dims that are not innermost: timm LeViT's over its tokens ([1, 16, 384],
    dim 1), two neighbouring dims, a permuted view's, the batch dim."""

    def forward(self, x, y):
        return (x.mean(1), (x * 2.0).mean(1, keepdim=True), y.mean((1, 2)),
                y.permute(0, 3, 1, 2).mean(2), y.mean(0))


def test_means_over_middle_dims_run_as_pooling(capability):
    # oneDNN's reduction over a dim that is not innermost is its reference kernel
    g = torch.Generator().manual_seed(16)
    inputs = (torch.randn(1, 16, 384, generator=g), torch.randn(2, 5, 6, 7, generator=g))
    model = MiddleMeans().eval()
    program = export(model, inputs, backends=["cpu"])
    impls = cpu_engine.program_impls(program)
    assert sum(op == "pooling" for op, _ in impls) == 5, impls
    assert not [p for p in impls if _reference(p[1])], impls
    check_against_float64(model, inputs, load(program).method("forward")(*[t.numpy() for t in inputs]))


class SelectiveKernelSums(nn.Module):
    """timm SKNet's selective kernel: its paths stacked [B, paths, C, H, W] and summed over
    the paths (dim 1), for the attention and for the output; two paths and three."""

    def forward(self, a, b, c):
        return torch.stack([a, b], dim=1).sum(1), (torch.stack([a, b, c], dim=1) * 2.0).sum(1, keepdim=True)


def test_sums_over_a_few_middle_slices_run_as_binary_adds(capability):
    # oneDNN's reduction over a dim that is not innermost is its reference kernel (timm
    # skresnet18 ran 2x slower than eager on it); the slices are added by a jit binary
    g = torch.Generator().manual_seed(17)
    inputs = tuple(torch.randn(1, 8, 5, 6, generator=g) for _ in range(3))
    model = SelectiveKernelSums().eval()
    program = export(model, inputs, backends=["cpu"])
    impls = cpu_engine.program_impls(program)
    assert not [p for p in impls if _reference(p[1]) or p[0] == "reduction"], impls
    check_against_float64(model, inputs, load(program).method("forward")(*[t.numpy() for t in inputs]))


@pytest.mark.parametrize("pool", ["avg", "max"])
def test_pooling_a_channel_slice_runs_on_the_jit_kernel(pool):
    # timm Res2Net pools a channel slice of a channels-last activation: a view with gaps,
    # which oneDNN pools on its reference kernel; the lowering pools a dense copy of it
    from test_cpu_external_regressions import _PoolOfChannelSlice

    torch.manual_seed(0)
    model, inputs = _PoolOfChannelSlice(pool, first=False).eval(), (torch.randn(1, 8, 6, 6),)
    program = export(model, inputs, backends=["cpu"])
    impls = cpu_engine.program_impls(program)
    assert [op for op, _ in impls].count("pooling") == 1 and not [p for p in impls if _reference(p[1])], impls
    check_against_float64(model, inputs, load(program).method("forward")(*[t.numpy() for t in inputs]))


class SymbolicMaskAdd(nn.Module):
    def forward(self, scores, mask):
        return scores * 2.0 + mask.unsqueeze(1).unsqueeze(0)


def test_a_reference_binary_left_on_symbolic_sizes_says_why():
    # Swin's shift-mask broadcast with a dynamic window count: no rewrite holds for every
    # size, so it stays on oneDNN's reference binary, and the plan's implementation row
    # (opforge inspect, --explain) and the op's name say why; at static sizes it is rewritten
    from torch.export import Dim

    from opforge.backends.cpu import blob

    g = torch.Generator().manual_seed(4)
    inputs = (torch.randn(1, 6, 3, 9, 9, generator=g), torch.randn(6, 9, 9, generator=g))
    windows = Dim("w", min=2, max=64)
    for dynamic in (True, False):
        program = export(SymbolicMaskAdd().eval(), inputs, backends=["cpu"], dynamic_shapes=(
            {1: windows}, {0: windows}) if dynamic else None)
        plan, _ = blob.parse(program.segments[program.delegates[0].segment].data)
        rows = [r["impl"] for r in plan["impls"] if r["op"] == "aten::add.Tensor"]
        names = [op["name"] for op in plan["ops"] if op["kind"] == "binary"]
        assert len(rows) == 1 and names, (rows, names)
        assert ("reference kernel: a broadcast" in rows[0]) == dynamic, rows
        assert any("(reference kernel:" in n for n in names) == dynamic, names
        got = load(program).method("forward")(*[t.numpy() for t in inputs])
        check_against_float64(SymbolicMaskAdd().eval(), inputs, got)


def test_runtime_masks_broadcast_in_the_middle(capability):
    g = torch.Generator().manual_seed(3)
    model = MaskAdd().eval()
    inputs = (torch.randn(4, 3, 9, 9, generator=g), torch.randn(4, 9, 9, generator=g),
              torch.randn(4, 1, 1, generator=g))
    program = export(model, inputs, backends=["cpu"])
    impls = cpu_engine.program_impls(program)
    assert [p for p in impls if p[0].startswith("binary")], impls
    assert not [p for p in impls if _reference(p[1])], impls
    got = load(program).method("forward")(*[t.numpy() for t in inputs])
    check_against_float64(model, inputs, got)


# --- the broadcast patterns, pure ------------------------------------------------------------

def test_jit_binary_broadcast_table():
    """The measured table (layouts.py): ranks 3 and 4, every keep mask."""
    runs = {
        (1, 1, 1), (1, 1, 0), (1, 0, 1), (0, 1, 1), (0, 1, 0), (0, 0, 1), (0, 0, 0),
        (1, 1, 1, 1), (1, 1, 0, 0), (1, 0, 1, 1), (1, 0, 0, 1), (0, 1, 1, 1), (0, 1, 0, 0),
        (0, 0, 1, 1), (0, 0, 0, 1), (0, 0, 0, 0),
    }
    for rank in (3, 4):
        for kept in itertools.product((0, 1), repeat=rank):
            assert jit_binary_broadcast(kept) == (kept in runs), kept
    assert jit_binary_broadcast((0, 1)) and jit_binary_broadcast((1,))


def test_merged_broadcast_and_expansion():
    # Swin's shift mask: (1, nW, 1, 49, 49) over (1, nW, heads, 49, 49)
    assert merged_broadcast((1, 64, 3, 49, 49), (0, 1, 0, 1, 1)) == ((64, 3, 2401), (True, False, True))
    assert merged_broadcast((1, 1), (0, 0)) == ((1,), (True,))
    # (1, C, 1, W): no merge runs it; broadcasting over the batch is the cheaper expansion
    dims, kept = merged_broadcast((4, 30, 7, 3), (0, 1, 0, 1))
    assert jit_broadcast_expansion(dims, kept) == (True, True, False, True)
    assert jit_broadcast_expansion((5, 6, 7), (True, False, True)) == (True, False, True)
