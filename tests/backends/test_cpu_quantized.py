"""Quantized programs on the cpu backend: every scheme fully delegated on zoo models,
matching the lean runtime (the exact reference kernels), and 8a8w convolution/linear
lowered to oneDNN int8.

Lean runs quantize/dequantize as quantized_decomposed defines them; the backend's loops
use the same float32 operations, and its int8 convolution/matmul accumulate exactly in
int32 and round once: the two may differ by one quantization step where a value lies on a
rounding boundary. The test allows one step on at most 1% of the output elements.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from opforge.backends import get_backend
from opforge.examples.zoo import ZOO
from opforge.export import delegation_report
from opforge.runtime import load

pytest.importorskip("torchao")  # the quantize extra; installed by the README's setup


def _quantized(name, scheme):
    from opforge.quantize import quantize

    torch.manual_seed(0)
    model, inputs = ZOO[name]()
    model.eval()
    gen = torch.Generator().manual_seed(1)
    calibration = [tuple(torch.randn(t.shape, generator=gen) if t.is_floating_point() else t
                         for t in inputs) for _ in range(3)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return quantize(model, inputs, scheme, calibration=calibration), inputs


def _ops(program):
    from opforge.backends.cpu import blob

    kinds = []
    for d in program.delegates:
        plan, _ = blob.parse(program.segments[d.segment].data)
        kinds += [op["kind"] for op in plan["ops"]]
    return kinds


@pytest.mark.parametrize("scheme", ["8a8w", "16a8w", "16a4w", "16a4w_block", "8a4w", "16a16w"])
@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_quantized_programs_run_delegated_like_lean(name, scheme):
    assert get_backend("cpu").unavailable() is None
    qmodel, inputs = _quantized(name, scheme)
    program = qmodel.export(backends=["cpu"])
    report = delegation_report(program)["forward"]
    assert not report["rejected"], report["rejected"][:3]
    assert all(type(i).__name__ == "DelegateCall" for i in program.method("forward").instructions)
    kinds = _ops(program)
    if scheme == "8a8w":
        assert kinds.count("qconv") + kinds.count("qmatmul") == 3, kinds
    arrays = [t.numpy() for t in inputs]
    want = load(qmodel.export()).method("forward")(*arrays)[0]
    got = load(program).method("forward")(*arrays)[0]
    diff = np.abs(got - want)
    # one output quantization step: the largest gap between neighbouring values lean makes
    values = np.unique(want)
    step = float(np.min(np.diff(values))) if values.size > 1 else 0.0
    assert diff.max() <= step * 1.01 + 1e-7, (float(diff.max()), step)
    assert np.count_nonzero(diff) <= max(1, diff.size // 100), np.count_nonzero(diff)
