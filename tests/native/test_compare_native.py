"""`opforge compare` names a planted native kernel (issue 27): the example library built
with mul3 off by 0.05 makes the lean run leave its tolerance exactly at the chain's mul3
node; the same chain with the correct library stays within. Needs a C++ compiler and torch.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from opforge.compare import compare
from opforge.examples.my_ops import manifest_path, register_examples
from opforge.native import build_library

pytestmark = pytest.mark.skipif(shutil.which("c++") is None and shutil.which("g++") is None,
                                reason="needs a C++ compiler")

KERNELS = manifest_path().parent / "kernels"
# both paths of scale_into (contiguous and strided): element * factor, plus 0.05 when planted
EXACT = ("src[i] * factor)", "src[opforge::offset_of(in, index)] * factor)")


class NativeChain(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = torch.nn.Linear(16, 16)
        self.fc2 = torch.nn.Linear(16, 16)

    def forward(self, x):
        y = torch.relu(self.fc1(x))
        y = torch.ops.my_ops.mul3(y) + 1.0  # the native kernel
        y = torch.tanh(torch.sigmoid(y) - 0.25)
        y = torch.abs(self.fc2(y)) * 2.0
        return torch.exp(-y)


def _library(cache, directory: Path, planted: bool) -> str:
    sources = []
    for path in sorted(KERNELS.glob("*.cpp")):
        if path.name == "mul.cpp":
            text = path.read_text()
            for exact in EXACT:
                assert exact in text, "mul.cpp changed: update the planted replacement"
                if planted:
                    text = text.replace(exact, exact[:-1] + " + static_cast<T>(0.05))")
            path = directory / "mul.cpp"
            path.write_text(text)
        sources.append(path)
    name = "libplanted_mul3.so" if planted else "libmy_ops.so"
    return str(build_library(manifest_path(), sources, directory / name, cache_root=cache).path)


@pytest.fixture(scope="module")
def inputs():
    register_examples()
    return (torch.randn(4, 16, generator=torch.Generator().manual_seed(1)),)


def test_the_correct_native_kernel_stays_within(inputs, cache, tmp_path):
    result = compare(NativeChain(), inputs, against=["eager", "lean"],
                     kernels=[_library(cache, tmp_path, planted=False)])
    assert result.first_divergence("lean") is None
    assert any(row.op == "my_ops::mul3" and row.errors["lean"].within for row in result.rows)


def test_a_planted_native_kernel_is_named_as_the_first_divergence(inputs, cache, tmp_path):
    result = compare(NativeChain(), inputs, against=["eager", "lean"],
                     kernels=[_library(cache, tmp_path, planted=True)])
    first = result.first_divergence("lean")
    assert first is not None and first.op == "my_ops::mul3" and first.name == "mul3"
    assert 0.049 < first.errors["lean"].max_abs < 0.051
    assert "torch.ops.my_ops.mul3(y)" in first.source
    assert all(row.errors["lean"].within for row in result.rows[:first.index])
    assert result.first_divergence("eager") is None
