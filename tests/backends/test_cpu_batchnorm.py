"""BatchNorm on the cpu backend in every position that changes its lowering: alone, after a
concatenation, after a convolution with a second reader (not folded), RepVGG's three
branches, BatchNorm1d over tokens, a DenseNet block, 1-d/2-d/3-d, with and without affine
parameters, and folded into a convolution only when that convolution has no other reader.

Running statistics and affine parameters are drawn away from their defaults (a default
BatchNorm is the identity and hides a wrong broadcast). The reference is eager float64; the
criterion is the one of test_cpu_models (8× eager float32's own error + 2 ulp of the scale).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn

from opforge.backends.cpu import blob
from opforge.export import delegation_report, export
from opforge.runtime import load

from cpu_reference import check_against_float64, spread


class Lone(nn.Module):
    def __init__(self, dim=2, affine=True):
        super().__init__()
        self.bn = {1: nn.BatchNorm1d, 2: nn.BatchNorm2d, 3: nn.BatchNorm3d}[dim](4, affine=affine)

    def forward(self, x):
        return self.bn(x)


class AfterCat(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(8)

    def forward(self, x):
        return self.bn(torch.cat([x, self.conv(x)], 1))


class TwoReaders(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4)

    def forward(self, x):
        y = self.conv(x)
        return self.bn(y) + y


class ConvOutputAlsoReturned(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4)

    def forward(self, x):
        y = self.conv(x)
        return self.bn(y), y


class Folded(nn.Module):
    def __init__(self, groups=1):
        super().__init__()
        self.conv = nn.Conv2d(4, 8, 3, padding=1, groups=groups)
        self.bn = nn.BatchNorm2d(8)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


class SharedConv(nn.Module):
    """One convolution applied twice, only one application followed by a BatchNorm: folding
    must not change the other's weights."""

    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4)

    def forward(self, x):
        return self.bn(self.conv(x)) + self.conv(x * 0.5)


class AfterTransposedConv(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1), nn.BatchNorm2d(6)

    def forward(self, x):
        return self.bn(self.conv(x))


class AfterRelu(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4)

    def forward(self, x):
        return self.bn(torch.relu(self.conv(x)))


class RepVGG(nn.Module):
    def __init__(self):
        super().__init__()
        self.c3 = nn.Conv2d(4, 4, 3, padding=1, bias=False)
        self.c1 = nn.Conv2d(4, 4, 1, bias=False)
        self.b3, self.b1, self.bi = nn.BatchNorm2d(4), nn.BatchNorm2d(4), nn.BatchNorm2d(4)

    def forward(self, x):
        return torch.relu(self.b3(self.c3(x)) + self.b1(self.c1(x)) + self.bi(x))


class Tokens(nn.Module):
    """LeViT: BatchNorm1d over flattened tokens after a Linear."""

    def __init__(self):
        super().__init__()
        self.linear, self.bn = nn.Linear(8, 16, bias=False), nn.BatchNorm1d(16)

    def forward(self, x):
        y = self.linear(x)
        return self.bn(y.flatten(0, 1)).reshape_as(y)


class DenseBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(
            nn.Sequential(nn.BatchNorm2d(4 + 2 * i), nn.ReLU(), nn.Conv2d(4 + 2 * i, 2, 3, padding=1))
            for i in range(3))

    def forward(self, x):
        for layer in self.layers:
            x = torch.cat([x, layer(x)], 1)
        return x


class AfterPermute(nn.Module):
    """A channels-last view read by BatchNorm (the strided-input path)."""

    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x):
        return self.bn(x.permute(0, 3, 1, 2))


CASES = {
    "lone_1d_ncl": (lambda: Lone(1), (2, 4, 7)),
    "lone_1d_nc": (lambda: Lone(1), (5, 4)),
    # (N > 1, C, 1, ...): oneDNN misreads a (1, C, 1, ...) post-op operand there, so the
    # shift is a second binary op (core._post_operand_misread)
    "lone_1d_length_1": (lambda: Lone(1), (2, 4, 1)),
    "lone_2d_1x1": (lambda: Lone(2), (3, 4, 1, 1)),
    "lone_2d": (lambda: Lone(2), (2, 4, 5, 5)),
    "lone_3d": (lambda: Lone(3), (2, 4, 3, 4, 5)),
    "lone_2d_no_affine": (lambda: Lone(2, affine=False), (2, 4, 5, 5)),
    "after_cat": (AfterCat, (2, 4, 5, 5)),
    "two_readers": (TwoReaders, (2, 4, 5, 5)),
    "conv_output_also_returned": (ConvOutputAlsoReturned, (2, 4, 5, 5)),
    "folded": (Folded, (2, 4, 6, 6)),
    "folded_grouped": (lambda: Folded(groups=2), (2, 4, 6, 6)),
    "repvgg": (RepVGG, (2, 4, 6, 6)),
    "shared_conv": (SharedConv, (2, 4, 5, 5)),
    "after_transposed_conv": (AfterTransposedConv, (2, 4, 5, 5)),
    "after_relu": (AfterRelu, (2, 4, 5, 5)),
    "tokens": (Tokens, (2, 7, 8)),
    "dense_block": (DenseBlock, (2, 4, 5, 5)),
    "after_permute": (AfterPermute, (2, 5, 6, 4)),
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("mode", ["lean", "aten"])
def test_batch_norm_matches_float64_in_every_position(name, mode):
    factory, shape = CASES[name]
    torch.manual_seed(0)
    model = spread(factory())
    x = torch.randn(shape)
    program = export(model, (x,), kernels="portable", backends=["cpu"])
    assert not delegation_report(program)["forward"]["rejected"]
    got = load(program, mode=mode).method("forward")(x.numpy())
    check_against_float64(model, (x,), got)


def _op_names(program):
    names = []
    for d in program.delegates:
        plan, _ = blob.parse(program.segments[d.segment].data)
        names += [op["name"] for op in plan["ops"]]
    return names


@pytest.mark.parametrize("name, folded", [("folded", True), ("folded_grouped", True),
                                          ("two_readers", False), ("conv_output_also_returned", False),
                                          ("after_cat", False), ("after_relu", False),
                                          ("after_transposed_conv", False), ("shared_conv", True)])
def test_batch_norm_is_folded_only_into_a_convolution_it_alone_reads(name, folded):
    factory, shape = CASES[name]
    torch.manual_seed(0)
    program = export(spread(factory()), (torch.randn(shape),), kernels="portable", backends=["cpu"])
    names = _op_names(program)
    assert any("convolution" in n for n in names), names
    assert any("batch_norm" in n for n in names) is not folded, names


def test_batch_norm_on_float64_stays_on_the_kernels_in_float64():
    # the backend runs batch norm in float32 only: a float64 one is refused with its reason
    # and computed by the portable kernels, to float64 precision
    torch.manual_seed(0)
    model = spread(Lone(2)).double()
    x = torch.randn(2, 4, 5, 5, dtype=torch.float64)
    program = export(model, (x,), kernels="portable", backends=["cpu"])
    report = delegation_report(program)["forward"]
    assert not report["delegates"]
    assert [(r["kind"], r["node"]) for r in report["rejected"]] == [
        ("dtype", "_native_batch_norm_legit_no_training")], report["rejected"]
    (got,) = load(program).method("forward")(x.numpy())
    with torch.no_grad():
        want = model(x).numpy()
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


class SavedStatistics(nn.Module):
    """Returns one of the saved statistics of an inference batch norm (empty in ATen)."""

    def __init__(self, which):
        super().__init__()
        self.bn, self.which = nn.BatchNorm2d(4), which

    def forward(self, x):
        bn = self.bn
        outs = torch.ops.aten._native_batch_norm_legit_no_training(
            x, bn.weight, bn.bias, bn.running_mean, bn.running_var, 0.1, bn.eps)
        return outs[0], outs[self.which]


class RunTimeStatistics(nn.Module):
    def forward(self, x, mean, var):
        return torch.nn.functional.batch_norm(x, mean, var, training=False, eps=1e-3)


def _rejected(program):
    return [(r["kind"], r["reason"]) for r in delegation_report(program)["forward"]["rejected"]]


@pytest.mark.parametrize("which", [1, 2])
def test_batch_norm_whose_saved_statistics_are_used_stays_on_the_kernels(which):
    torch.manual_seed(0)
    model, x = spread(SavedStatistics(which)), torch.randn(2, 4, 5, 5)
    program = export(model, (x,), kernels="portable", backends=["cpu"])
    assert _rejected(program) == [("op", "batch norm whose saved statistics are used")]
    check_against_float64(model, (x,), load(program).method("forward")(x.numpy()))


def test_batch_norm_with_run_time_statistics_stays_on_the_kernels():
    torch.manual_seed(0)
    inputs = (torch.randn(2, 4, 5, 5), torch.randn(4), torch.rand(4) * 3 + 0.2)
    program = export(RunTimeStatistics(), inputs, kernels="portable", backends=["cpu"])
    assert _rejected(program) == [("layout", "batch norm with run-time statistics")]
    got = load(program).method("forward")(*(t.numpy() for t in inputs))
    check_against_float64(RunTimeStatistics(), inputs, got)
