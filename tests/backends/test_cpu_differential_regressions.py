"""Minimal graphs fuzz/cpu_differential.py found wrong on the cpu backend, one test each.

Each runs the graph on the cpu backend in lean and ATen mode and holds it to the criterion
of test_cpu_models (8× eager float32's error against float64 + 2 ulp of the output scale);
integer and bool outputs must be equal.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn as nn

from opforge.backends import get_backend
from opforge.export import export
from opforge.runtime import load


def _run_on_cpu_backend(model, inputs):
    problem = get_backend("cpu").unavailable()
    assert problem is None, f"the cpu backend must be usable in this environment: {problem}"
    model = model.eval()
    with torch.no_grad():
        want32 = model(*inputs)
        want64 = copy.deepcopy(model).double()(*[t.double() if t.is_floating_point() else t for t in inputs])
    want32 = want32 if isinstance(want32, tuple) else (want32,)
    want64 = want64 if isinstance(want64, tuple) else (want64,)
    program = export(model, inputs, kernels="portable", backends=["cpu"])
    for mode in ("lean", "aten"):
        got = load(program, mode=mode).method("forward")(*[t.numpy() for t in inputs])
        for g, w32, w64 in zip(got, want32, want64):
            w32, w64 = w32.numpy(), w64.numpy()
            assert g.shape == w32.shape and g.dtype == w32.dtype, (mode, g.shape, g.dtype, w32.shape, w32.dtype)
            if not np.issubdtype(w32.dtype, np.floating):
                assert np.array_equal(g, w32), mode
                continue
            eager_err = float(np.max(np.abs(w32 - w64)))
            err = float(np.max(np.abs(g - w64)))
            tol = 8 * eager_err + 2 * np.finfo(np.float32).eps * float(np.max(np.abs(w64)))
            assert err <= tol, (mode, err, tol)


@pytest.mark.parametrize("dim", [1, 2, 3])
@pytest.mark.parametrize("k, stride, padding, output_padding, dilation",
                         [(2, 1, 0, 1, 2), (3, 2, 0, 2, 3), (2, 2, 0, 1, 1)])
def test_transposed_convolution_whose_output_padding_reaches_past_a_stride(dim, k, stride, padding,
                                                                           output_padding, dilation):
    # output_padding − padding ≥ stride (legal in torch when dilation > stride) made the
    # lowering hand oneDNN a right padding of −stride or less: its deconvolution refused at load
    conv = getattr(nn, f"ConvTranspose{dim}d")(2, 3, k, stride=stride, padding=padding,
                                               output_padding=output_padding, dilation=dilation)
    torch.manual_seed(0)
    _run_on_cpu_backend(conv, (torch.randn(1, 2, *([4] * dim)),))


class _ScaleShift(nn.Module):
    def __init__(self, shape):
        super().__init__()
        self.register_buffer("scale", torch.randn(shape))
        self.register_buffer("shift", torch.randn(shape))

    def forward(self, x):
        return x * self.scale + self.shift


def _spread_batch_norm(bn):
    with torch.no_grad():
        bn.running_mean.copy_(torch.randn(bn.running_mean.shape) * 2)
        bn.running_var.copy_(torch.rand(bn.running_var.shape) * 2 + 0.1)
    return bn


@pytest.mark.parametrize("model, shape", [
    (lambda: _spread_batch_norm(nn.BatchNorm1d(2, eps=0.1, affine=False)), (2, 2, 1)),
    (lambda: _spread_batch_norm(nn.BatchNorm2d(3)), (2, 3, 1, 1)),
    (lambda: _spread_batch_norm(nn.BatchNorm3d(3)), (3, 3, 1, 1, 1)),
    (lambda: _ScaleShift((1, 2, 1)), (2, 2, 1)),
    (lambda: _ScaleShift((1, 3, 1, 1)), (4, 3, 1, 1)),
])
def test_a_per_channel_post_op_over_a_batch_whose_other_dims_are_all_one(model, shape):
    # oneDNN reads a binary post-op operand of dims (1, C, 1, …) wrongly when the destination
    # is (N > 1, C, 1, …): BatchNorm1d over (2, 2, 1) was off by the size of its output
    torch.manual_seed(0)
    _run_on_cpu_backend(model(), (torch.randn(*shape),))
