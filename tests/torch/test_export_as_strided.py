"""``as_strided`` from export to the lean runtime.

``nn.AdaptiveAvgPool2d(1)`` of a channels-last-strided input (the heads of ConvNeXt, Swin,
EdgeNeXt) decomposes into ``mean(x, (-1, -2), keepdim=True)`` and an ``as_strided`` that
restrides the fresh mean to channels-last: exported with ``kernels="portable"`` it must
run lean with eager's results. ATen's as_strided reads its input's *storage*; a program
gives each value its own buffer, so the exporter rebases an explicit offset onto the input
and refuses what would read storage outside the input (see
``opforge/export/passes/to_out_variant.py``).

Tolerances. The pooling model's only inexact step is the mean of H*W <= 16 float32 values
in [-1, 1]: recursive summation errs by at most u*sum|x| <= 16u and the division by at
most u (u = 2**-24), on each side, so ATen and NumPy differ by at most 2 * 17u = 2.0e-6
(atol; rtol 0). The as_strided restride copies, and the lean-vs-ATen-mode comparison of
the same program must be exact. The ConvNeXt/Swin-style heads run float32 through a
depthwise conv, layer norms and linears (dozens of accumulations): rtol 1e-4 / atol 1e-5,
as in test_runtime_portable_models. Models made of copies and ``* 2`` are exact.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import opforge
from opforge.errors import ExportError
from opforge.runtime import load

KEY = "aten::as_strided_copy.out"
POOL_ATOL = 2 * 17 * 2.0**-24


class ChannelsLastPool(nn.Module):
    def forward(self, x):
        return F.adaptive_avg_pool2d(x.permute(0, 3, 1, 2), 1)


def _run(model, inputs, *, mode="lean"):
    program = opforge.export(model, inputs, kernels="portable")
    forward = load(program, mode=mode).method("forward")
    arrays = [t.numpy() for t in inputs]
    first = forward(*arrays)
    second = forward(*arrays)  # over the first call's arena contents
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)
    return program, first


def _keys(program) -> set[str]:
    return {o.key for o in program.method("forward").operators}


@pytest.mark.parametrize("shape", [(1, 4, 4, 8), (3, 4, 4, 8), (2, 3, 5, 16), (1, 1, 1, 4)])
def test_adaptive_avg_pool_of_a_channels_last_input_runs_lean_like_eager(shape):
    x = torch.rand(*shape, generator=torch.Generator().manual_seed(sum(shape))) * 2 - 1
    model = ChannelsLastPool().eval()
    expected = model(x)
    program, (lean,) = _run(model, (x,))
    assert KEY in _keys(program), "the decomposition no longer restrides with as_strided"
    assert lean.shape == tuple(expected.shape) and lean.dtype == np.float32
    np.testing.assert_allclose(lean, expected.numpy(), rtol=0, atol=POOL_ATOL)
    _, (aten,) = _run(model, (x,), mode="aten")
    np.testing.assert_allclose(aten, expected.numpy(), rtol=0, atol=POOL_ATOL)


class ConvNeXtStyle(nn.Module):
    """torchvision's CNBlock (depthwise conv, channels-last layer norm and MLP, layer
    scale, residual) and its head: avgpool, LayerNorm2d, flatten, linear."""

    def __init__(self, dim: int = 8) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, dim, 2, stride=2)
        self.dwconv = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.gamma = nn.Parameter(torch.full((dim, 1, 1), 0.5))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.head_norm = nn.LayerNorm(dim, eps=1e-6)
        self.fc = nn.Linear(dim, 5)

    def forward(self, x):
        x = self.stem(x)
        y = self.mlp(self.norm(self.dwconv(x).permute(0, 2, 3, 1))).permute(0, 3, 1, 2)
        x = self.gamma * y + x  # channels-last, as torchvision's `result += input`
        x = self.avgpool(x)
        x = self.head_norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        return self.fc(x.flatten(1))


class SwinStyleHead(nn.Module):
    """torchvision's SwinTransformer head: norm over (B, H, W, C), permute, avgpool."""

    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(dim, 3)

    def forward(self, x):
        return self.fc(torch.flatten(self.avgpool(self.norm(x).permute(0, 3, 1, 2)), 1))


@pytest.mark.parametrize("factory, shape", [(ConvNeXtStyle, (2, 3, 12, 12)),
                                            (SwinStyleHead, (2, 7, 7, 16))])
def test_convnext_and_swin_style_heads_run_lean_like_eager(factory, shape):
    torch.manual_seed(0)
    model = factory().eval()
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model(x)
    program, (lean,) = _run(model, (x,))
    assert KEY in _keys(program)
    np.testing.assert_allclose(lean, expected.numpy(), rtol=1e-4, atol=1e-5)


class TransposedAsStrided(nn.Module):
    def forward(self, x):
        return (x * 2).t().as_strided((3, 2), (1, 3))


class BeforeItsSlice(nn.Module):
    def forward(self, x):
        return (x * 2)[1:].as_strided((2, 2), (1, 2), 0)  # storage offset 0 < the slice's 3


class PastItsSlice(nn.Module):
    def forward(self, x):
        return (x * 2)[:2].as_strided((2, 2), (1, 2), 4)  # reaches storage element 7 of 0..5


@pytest.mark.parametrize("factory, found", [
    (TransposedAsStrided, "strides (1, 3), not contiguous"),
    (BeforeItsSlice, "storage elements 0..3 around an input holding 3..11"),
    (PastItsSlice, "storage elements 4..7 around an input holding 0..5"),
])
def test_as_strided_reading_storage_outside_its_input_is_refused_at_export(factory, found):
    x = torch.arange(12.0).reshape(4, 3)
    factory()(x)  # valid in eager: ATen reads the storage the program does not have
    with pytest.raises(ExportError) as info:
        opforge.export(factory(), (x,), kernels="portable")
    message = str(info.value)
    assert "as_strided" in message and found in message and ".contiguous()" in message


class OffsetIntoItsSlice(nn.Module):
    def forward(self, x):
        y = (x * 2)[1:]  # storage offset 3
        return (y.as_strided((2, 2), (1, 2), 5),  # absolute: y's elements 2..5
                y.as_strided((2, 2), (1, 2)),  # the default: y's own offset
                y.as_strided((0, 2), (1, 1), 0))  # empty: reads nothing


@pytest.mark.parametrize("mode", ["lean", "aten"])
def test_an_explicit_offset_is_rebased_onto_its_input(mode):
    x = torch.arange(12.0).reshape(4, 3)
    expected = OffsetIntoItsSlice()(x)
    program, got = _run(OffsetIntoItsSlice(), (x,), mode=mode)
    assert KEY in _keys(program)
    for g, e in zip(got, expected, strict=True):
        assert g.shape == tuple(e.shape)
        np.testing.assert_array_equal(g, e.numpy())  # copies of exact products


@pytest.mark.parametrize("argument, value, found", [
    (2, (8, 2, 8, 8), "reach element 14 of an input of 8 elements"),  # the stride list
    (1, (1, 8, 1, -1), "non-negative"),  # the size list
    (2, (8, 1, 8), "one stride per size"),
])
def test_a_tampered_program_is_refused_when_its_method_is_bound(argument, value, found):
    """A program file is hostile: the kernel checks its int lists before any read."""
    import dataclasses

    from opforge.errors import KernelError
    from opforge.program import IntListValue, from_bytes, to_bytes

    x = torch.rand(1, 4, 4, 8)
    program = opforge.export(ChannelsLastPool(), (x,), kernels="portable")
    method = program.method("forward")
    op = next(i for i, o in enumerate(method.operators) if o.key == KEY)
    call = next(c for c in method.instructions if getattr(c, "op", None) == op)
    values = list(method.values)
    values[call.args[argument]] = IntListValue(value)
    tampered = dataclasses.replace(program, methods=(dataclasses.replace(
        method, values=tuple(values)),))
    loaded = load(from_bytes(to_bytes(tampered)))  # well-formed: the file format holds
    with pytest.raises(KernelError, match=found) as info:
        loaded.method("forward")
    assert KEY in str(info.value)
