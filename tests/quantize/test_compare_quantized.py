"""`opforge compare --against quantized` shows the node where SQNR drops (issue 27).

An outlier (1000 in one channel) added before a node widens that tensor's 8-bit range
until its other values all round to a few steps; the next node masks the outlier out, and
what is left is quantization noise: SQNR falls from ~40 dB to about 0 there. compare must
name that node (the mask multiply) as the first one below --min-sqnr, show its integer
tensor beside the dequantized value, and keep the float runs within tolerance. Needs
torch and torchao.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from opforge.compare import compare

pytestmark = pytest.mark.filterwarnings("ignore")


class Outlier(torch.nn.Module):
    def __init__(self, spike: float) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = torch.nn.Linear(16, 16)
        self.fc2 = torch.nn.Linear(16, 16)
        self.register_buffer("spike", torch.zeros(16).index_fill_(0, torch.tensor([3]), spike))
        self.register_buffer("mask", torch.ones(16).index_fill_(0, torch.tensor([3]), 0.0))

    def forward(self, x):
        y = torch.relu(self.fc1(x))
        y = y + self.spike
        y = y * self.mask  # where the outlier's quantization noise is all that is left
        return torch.tanh(self.fc2(y))


@pytest.fixture(scope="module")
def inputs():
    return (torch.randn(8, 16, generator=torch.Generator().manual_seed(1)),)


def test_sqnr_drops_at_the_node_that_removes_the_outlier(inputs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = compare(Outlier(1000.0), inputs, against=["lean", "quantized"], min_sqnr=20.0)
    assert result.first_divergence("lean") is None
    first = result.first_divergence("quantized")
    assert first is not None and first.name == "mul" and first.op == "aten::mul.Tensor"
    assert "y * self.mask" in first.source
    assert first.errors["quantized"].sqnr < 10.0
    before = result.rows[:first.index]
    assert [row.name for row in before] == ["permute", "addmm", "relu", "add"]
    assert all(row.errors["quantized"].sqnr >= 20.0 for row in before)
    run = result.runs[1]
    assert run.where[("mul", 0)] == "quantized"  # compared as its dequantized integers
    assert run.integers[("mul", 0)].startswith(("uint8", "int8"))
    assert "scale" in run.integers[("add", 0)]


def test_without_the_outlier_every_node_keeps_its_sqnr(inputs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = compare(Outlier(0.0), inputs, against=["quantized"], min_sqnr=20.0)
    assert result.first_divergence("quantized") is None
    assert all(row.errors["quantized"] is not None for row in result.rows)
