"""The int8 lowering's scale folding (``lowering.quantized.fold_scales``): a joined
activation's requantization chain (× 1/s, round, clip, × s, relu/relu6/hardtanh) becomes
round and clip with the scales and the bias adjusted. Checked on the chain itself, in
float64: the folded chain gives the unfolded one's integers on every value not within
1e-9 of a rounding boundary (the identity holds in real numbers; float32 may move a
boundary value one step, which the model tests in test_cpu_quantized.py allow)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from opforge.backends.cpu.lowering.core import B_ADD, CLIP, LINEAR, RELU, ROUND
from opforge.backends.cpu.lowering.quantized import _requantize, fold_scales


def _apply(post, f):
    """The eltwise chain on float64 values (binary post-ops: not here)."""
    for kind, code, a, b, _ in post:
        assert kind == 0
        if code == LINEAR:
            f = a * f + b
        elif code == ROUND:
            f = np.round(f)  # half to even, as oneDNN's round
        elif code == CLIP:
            f = np.clip(f, a, b)
        elif code == RELU:
            f = np.maximum(f, 0.0)
        else:
            raise AssertionError(code)
    return f


def _quantized(post, x_scale, y_scale, bias, acc, w_scale, zp_y):
    pre = acc * x_scale * w_scale + (0.0 if bias is None else bias.double().numpy())
    v = _apply(post, pre) / y_scale
    return v, np.clip(np.round(v) + zp_y, 0, 255)


ACTIVATIONS = {"relu": [[0, RELU, 0.0, 0.0, -1]], "relu6": [[0, CLIP, 0.0, 6.0, -1]],
               "hardtanh": [[0, CLIP, -1.0, 1.0, -1]], "none": []}


@pytest.mark.parametrize("activation", list(ACTIVATIONS))
@pytest.mark.parametrize("mid", [(0.157, 131), (0.021, 0), (0.06, 200)])
def test_a_requantized_activation_folds_to_round_and_clip(activation, mid):
    s_mid, zp_mid = mid
    post = _requantize(s_mid, zp_mid) + ACTIVATIONS[activation]
    gen = torch.Generator().manual_seed(7)
    channels = 24
    bias = torch.randn(channels, generator=gen) * 3
    w_scale = (torch.rand(channels, generator=gen).double().numpy() + 0.5) * 0.01
    x_scale, y_scale, zp_y = 0.037, 0.0235, 11
    folded, fx, fy, fb = fold_scales(post, x_scale, y_scale, bias)
    assert [p[1] for p in folded] == [ROUND, CLIP]
    assert math.isclose(fx, x_scale / s_mid, rel_tol=1e-6)
    assert math.isclose(fy, y_scale / s_mid, rel_tol=1e-12)
    acc = torch.randint(-40000, 40000, (4096, channels), generator=gen).double().numpy()
    v0, q0 = _quantized(post, x_scale, y_scale, bias, acc, w_scale, zp_y)
    v1, q1 = _quantized(folded, fx, fy, fb, acc, w_scale, zp_y)
    # where the unfolded chain's own rounding (inside it, then at the end) is clear of a
    # boundary, the integers are the same; the boundary values are the rounding freedom
    inner = _apply(post[:1], acc * x_scale * w_scale + bias.double().numpy())
    clear = (np.abs(inner - np.floor(inner) - 0.5) > 1e-6) & (np.abs(v0 - np.floor(v0) - 0.5) > 1e-6)
    assert clear.mean() > 0.99
    np.testing.assert_array_equal(q0[clear], q1[clear])
    assert len(np.unique(q0)) > 5  # the values span a range, not one clipped end


def test_a_residual_add_keeps_its_operand_and_folds_around_it():
    post = _requantize(0.2, 100) + [[0, LINEAR, 5.0, -7.0, -1], [1, B_ADD, 0.0, 0.0, 42],
                                    [0, LINEAR, 0.3, 0.0, -1], [0, RELU, 0.0, 0.0, -1]]
    folded, fx, fy, fb = fold_scales(post, 0.5, 0.1, None)
    assert fb is None and math.isclose(fx, 0.5 / 0.2) and math.isclose(fy, 0.1 / 0.3)
    assert folded == [[0, ROUND, 0.0, 0.0, -1], [0, CLIP, -100.0, 155.0, -1],
                      [0, LINEAR, 0.2, 0.0, -1], [0, LINEAR, 5.0, -7.0, -1],
                      [1, B_ADD, 0.0, 0.0, 42], [0, CLIP, 0.0, 3.0e38, -1]]


@pytest.mark.parametrize("post", [
    [[0, LINEAR, -2.0, 0.0, -1], [0, ROUND, 0.0, 0.0, -1]],  # a negative factor
    [[0, LINEAR, 2.0, 1.0, -1], [0, ROUND, 0.0, 0.0, -1]],   # an offset
    [[0, RELU, 0.1, 0.0, -1], [0, LINEAR, 2.0, 0.0, -1], [0, ROUND, 0.0, 0.0, -1]],  # leaky
    [[0, ROUND, 0.0, 0.0, -1], [0, CLIP, 0.0, 1.0, -1], [0, CLIP, 2.0, 3.0, -1]],  # apart
])
def test_what_is_no_identity_stays(post):
    assert fold_scales(post, 0.5, 0.25, None) == (post, 0.5, 0.25, None)
