"""Shared by the cpu-backend model tests: parameters and buffers drawn away from their
defaults, and the float64 criterion.

The criterion (as in test_cpu_models.py): the backend's max error against eager float64
may be at most 8× eager float32's own error against float64, plus 2 ulp of the output's
scale. oneDNN sums in another order and uses other vectorised math than ATen (a few ulp
per op); a kernel 0.1% off is ~1000× eager's error and fails.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
import torch.nn as nn


def spread(model: nn.Module, seed: int = 1) -> nn.Module:
    """Every parameter and floating buffer away from its default (a default BatchNorm is the
    identity, a zero bias hides a dropped bias): running variances in [0.2, 3.2], running
    means and affine parameters ~N(0, 1), weights rescaled by 1/sqrt(fan-in) so activations
    stay O(1); non-default eps for normalisations. Eval mode."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=g))
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) * 3 + 0.2)
                m.eps = 1e-3
            elif isinstance(m, (nn.LayerNorm, nn.GroupNorm)):
                m.eps = 1e-4
            for name, p in m.named_parameters(recurse=False):
                if name == "weight" and p.dim() >= 2:
                    fan_in = p[0].numel()
                    p.copy_(torch.randn(p.shape, generator=g) / fan_in ** 0.5)
                else:
                    p.copy_(torch.randn(p.shape, generator=g))
    return model.eval()


def as_tuple(v):
    return tuple(v) if isinstance(v, (tuple, list)) else (v,)


def check_against_float64(model: nn.Module, inputs, got, ulps: int = 2) -> None:
    """``ulps``: the budget in ulp of the output's scale beyond 8× eager's error (oneDNN's
    vectorised log is accurate to ~16 ulp: log_softmax gets 64, as in test_cpu_ops.py)."""
    with torch.no_grad():
        want32 = as_tuple(model(*inputs))
        want64 = as_tuple(copy.deepcopy(model).double()(
            *[t.double() if t.is_floating_point() else t for t in inputs]))
    assert len(got) == len(want32)
    for g, w32, w64 in zip(got, want32, want64):
        g, w32, w64 = np.asarray(g), w32.numpy(), w64.numpy()
        assert g.shape == w32.shape and g.dtype == w32.dtype, (g.shape, w32.shape, g.dtype, w32.dtype)
        if not np.issubdtype(w32.dtype, np.floating):
            np.testing.assert_array_equal(g, w32)
            continue
        if not w32.size:
            continue
        eager_err = float(np.max(np.abs(w32 - w64)))
        scale = float(np.max(np.abs(w64)))
        err = float(np.max(np.abs(g - w64)))
        assert err <= 8 * eager_err + ulps * np.finfo(np.float32).eps * scale, (err, eager_err, scale)
