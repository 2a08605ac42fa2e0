"""float16 normalisations, called directly and bound, against PyTorch in float64.

float16 statistics are computed in float32 (ATen's CPU opmath) and rounded once, so every
output lies within one float16 ulp of the exact result. The binders' fast paths run their
steps in the input's dtype, so they must leave float16 to the general kernel: statistics
summed in float16 are several ulps off.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from opforge.kernels.portable import portable_kernels

KERNELS = portable_kernels()


def run(key, args, outs, bind):
    fn, bound_args = KERNELS[key].bind((*args, *outs)) if bind else \
        (KERNELS[key], (*args, *outs))
    fn(*bound_args)


def assert_within_one_ulp(outs, expected):
    for out, want in zip(outs, expected):
        assert out.dtype == np.float16
        np.testing.assert_array_max_ulp(out, want.numpy().astype(np.float16), maxulp=1)


def sample(shape, seed):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape) * 3 + 1).astype(np.float16)


@pytest.mark.parametrize("bind", [False, True])
@pytest.mark.parametrize("affine", [False, True])
@pytest.mark.parametrize("shape, normalized", [((4, 8, 64), (64,)), ((6, 3, 40), (3, 40))],
                         ids=str)
def test_layer_norm(shape, normalized, affine, bind):
    x = sample(shape, 0)
    w, b = (sample(normalized, 1), sample(normalized, 2)) if affine else (None, None)
    t = lambda a: None if a is None else torch.from_numpy(a.astype(np.float64))  # noqa: E731
    expected = torch.native_layer_norm(t(x), list(normalized), t(w), t(b), 1e-5)
    keep = shape[:len(shape) - len(normalized)] + (1,) * len(normalized)
    outs = [np.empty(shape, np.float16), np.empty(keep, np.float16), np.empty(keep, np.float16)]
    run("aten::native_layer_norm.out", (x, list(normalized), w, b, 1e-5), outs, bind)
    assert_within_one_ulp(outs, expected)


@pytest.mark.parametrize("bind", [False, True])
@pytest.mark.parametrize("affine", [False, True])
@pytest.mark.parametrize("shape", [(2, 3, 8, 8), (1, 6, 50)], ids=str)
def test_batch_norm_with_batch_statistics(shape, affine, bind):
    x = sample(shape, 3)
    c = shape[1]
    w, b = (sample((c,), 4), sample((c,), 5)) if affine else (None, None)
    t = lambda a: None if a is None else torch.from_numpy(a.astype(np.float64))  # noqa: E731
    expected = torch.ops.aten._native_batch_norm_legit.no_stats(t(x), t(w), t(b), True, 0.1,
                                                                1e-5)
    outs = [np.empty(shape, np.float16), np.empty(c, np.float16), np.empty(c, np.float16)]
    run("aten::_native_batch_norm_legit.no_stats_out", (x, w, b, True, 0.1, 1e-5), outs, bind)
    assert_within_one_ulp(outs, expected)
