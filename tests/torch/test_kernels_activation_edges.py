"""Activations at the points where their formula switches branch, and with every scalar
argument away from its default, against PyTorch in float64.

Random inputs almost never land exactly on a branch point (softplus's ``beta * x ==
threshold``), and a parameter left at 1 (elu's ``scale`` and ``input_scale``) cannot tell
``x * s`` from ``x / s``: both slipped through the suite as mutants.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from opforge.kernels.portable import portable_kernels

KERNELS = portable_kernels()
TOL = {np.float32: 2e-6, np.float64: 1e-13}


def check(key, x, want, *args):
    for bind in (False, True):
        out = np.full(x.shape, 7, x.dtype)
        fn, bound = KERNELS[key].bind((x, *args, out)) if bind and \
            hasattr(KERNELS[key], "bind") else (KERNELS[key], (x, *args, out))
        fn(*bound)
        t = TOL[x.dtype.type]
        np.testing.assert_allclose(out, want.numpy(), rtol=t, atol=t)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("beta, threshold", [(1.0, 1.0), (2.0, 1.0), (0.5, 3.0), (1.0, 20.0)])
def test_softplus_at_its_threshold(beta, threshold, dtype):
    # x * beta == threshold takes the log1p branch (ATen switches on x * beta > threshold);
    # just below and above it too.
    edge = threshold / beta
    x = np.array([edge, np.nextafter(edge, -np.inf), np.nextafter(edge, np.inf), 0.0, -edge,
                  edge * 2], dtype)
    want = torch.nn.functional.softplus(torch.from_numpy(x.astype(np.float64)), beta, threshold)
    check("aten::softplus.out", x, want, beta, threshold)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("alpha, scale, input_scale", [(0.7, 1.0, 2.0), (1.0, 1.5, 0.5),
                                                       (1.6733, 1.0507, 1.0)])
def test_elu_with_every_parameter(alpha, scale, input_scale, dtype):
    x = np.linspace(-4, 4, 33).astype(dtype)
    t = torch.from_numpy(x.astype(np.float64))
    want = torch.ops.aten.elu(t, alpha, scale, input_scale)
    check("aten::elu.out", x, want, alpha, scale, input_scale)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_leaky_relu_and_elu_at_zero_keep_the_sign(dtype):
    x = np.array([0.0, -0.0, 1e-30, -1e-30], dtype)
    t = torch.from_numpy(x.astype(np.float64))
    for key, want, args in (
            ("aten::leaky_relu.out", torch.nn.functional.leaky_relu(t, 0.1), (0.1,)),
            ("aten::elu.out", torch.ops.aten.elu(t, 0.7, 1.0, 1.0), (0.7, 1.0, 1.0))):
        check(key, x, want, *args)
        out = np.empty_like(x)
        KERNELS[key](x, *args, out)
        np.testing.assert_array_equal(np.signbit(out), np.signbit(want.numpy()))


@pytest.mark.parametrize("key", ["aten::clamp.out", "aten::clamp.Tensor_out"])
def test_clamp_without_bounds_is_refused_when_bound_too(key):
    from opforge.errors import KernelError

    x, out = np.ones(4, np.float32), np.empty(4, np.float32)
    with pytest.raises(KernelError, match="at least one bound"):
        KERNELS[key](x, None, None, out)
    fn, args = KERNELS[key].bind((x, None, None, out))
    with pytest.raises(KernelError, match="at least one bound"):
        fn(*args)


@pytest.mark.parametrize("key, bounds", [("aten::clamp.out", (-1.0, 1.0)),
                                         ("aten::clamp.out", (None, 1.0)),
                                         ("aten::clamp.out", (-1.0, None)),
                                         ("aten::clamp_min.out", (-1.0,)),
                                         ("aten::clamp_max.out", (1.0,)),
                                         ("aten::hardtanh.out", (-1.0, 1.0))])
def test_scalar_clamps_bind_to_ufuncs(key, bounds):
    # Scalar bounds fold into one or two ufunc steps: not the general kernel.
    x, out = np.linspace(-3, 3, 13).astype(np.float32), np.empty(13, np.float32)
    fn, args = KERNELS[key].bind((x, *bounds, out))
    assert fn is not KERNELS[key]
    fn(*args)
    low, high = (bounds + (None,))[:2] if key != "aten::clamp_max.out" else (None, bounds[0])
    np.testing.assert_array_equal(out, np.clip(x, low, high))


@pytest.mark.parametrize("approximate", ["tanh", "none"])
def test_float16_gelu_rounds_once_from_float32(approximate):
    # float16 GELU evaluates in float32 and rounds once: within one float16 ulp of exact
    # (from -3: below it the general tanh form loses digits to 1 + tanh(z) ~ 0 in float32).
    x = np.linspace(-3, 6, 2001).astype(np.float16)
    want = torch.nn.functional.gelu(torch.from_numpy(x.astype(np.float64)),
                                    approximate=approximate).numpy().astype(np.float16)
    for bind in (False, True):
        out = np.empty_like(x)
        fn, args = KERNELS["aten::gelu.out"].bind((x, approximate, out)) if bind else \
            (KERNELS["aten::gelu.out"], (x, approximate, out))
        fn(*args)
        np.testing.assert_array_max_ulp(out, want, maxulp=1)
