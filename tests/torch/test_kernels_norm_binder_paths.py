"""When the normalisation binders take their fast path and when they leave the op to the
general kernel, and what the fast path must not fold.

A binder guard that wrongly sends an op to the general kernel computes the right values
slowly; one that wrongly takes the fast path (float16, outputs aliasing inputs, statistics
that are program inputs, ``training=False``) computes wrong ones or skips an error. Both
directions are pinned here; the values on each path are checked against PyTorch in
``test_kernels_norm_small.py``, ``test_kernels_norm_float16.py`` and below.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from opforge.errors import KernelError
from opforge.kernels.portable import portable_kernels

KERNELS = portable_kernels()
LAYER_NORM = "aten::native_layer_norm.out"
BATCH_STATS = "aten::_native_batch_norm_legit.no_stats_out"
BATCH_NORM = "aten::_native_batch_norm_legit_no_training.out"


def fast(key, *args) -> bool:
    return KERNELS[key].bind(args)[0] is not KERNELS[key]


def frozen(a):
    a = np.array(a)
    a.flags.writeable = False
    return a


def layer_norm_args(shape, k, dtype=np.float32, out0=None):
    x = np.ones(shape, dtype)
    keep = shape[:len(shape) - k] + (1,) * k
    return (x, list(shape[len(shape) - k:]), None, None, 1e-5,
            x if out0 == "self" else np.empty(shape, dtype), np.empty(keep, dtype),
            np.empty(keep, dtype))


@pytest.mark.parametrize("shape, k", [((4, 8, 64), 1), ((2, 3, 8), 2), ((1, 1), 1), ((7,), 1)],
                         ids=str)
def test_layer_norm_fast_path(shape, k):
    assert fast(LAYER_NORM, *layer_norm_args(shape, k))
    assert fast(LAYER_NORM, *layer_norm_args(shape, k, np.float64))


def test_layer_norm_general_kernel():
    assert not fast(LAYER_NORM, *layer_norm_args((4, 8), 1, np.float16))
    assert not fast(LAYER_NORM, *layer_norm_args((4, 8), 1, out0="self"))
    assert not fast(LAYER_NORM, *layer_norm_args((0, 8), 1))


def batch_stats_args(shape, dtype=np.float32, training=True, out=None):
    x = np.ones(shape, dtype)
    c = shape[1]
    return (x, None, None, training, 0.1, 1e-5, x if out == "self" else np.empty(shape, dtype),
            np.empty(c, dtype), np.empty(c, dtype))


@pytest.mark.parametrize("shape", [(4, 3), (2, 3, 5), (2, 3, 4, 4), (1, 1, 6)], ids=str)
def test_batch_stats_fast_path(shape):
    assert fast(BATCH_STATS, *batch_stats_args(shape))


def test_batch_stats_general_kernel():
    assert not fast(BATCH_STATS, *batch_stats_args((2, 3, 4), np.float16))
    assert not fast(BATCH_STATS, *batch_stats_args((2, 3, 4), out="self"))
    assert not fast(BATCH_STATS, *batch_stats_args((0, 3, 4)))
    assert not fast(BATCH_STATS, *batch_stats_args((2, 3, 4), training=False))


def test_batch_stats_without_training_is_refused_when_bound_too():
    fn, args = KERNELS[BATCH_STATS].bind(batch_stats_args((2, 3, 4), training=False))
    with pytest.raises(KernelError, match="training=False"):
        fn(*args)


@pytest.mark.parametrize("shape", [(4, 1, 5), (1, 1, 7), (3, 1)], ids=str)
def test_batch_stats_of_a_single_channel(shape):
    # InstanceNorm over N * C = 1 channels: the count is every element of the batch.
    x = (np.random.default_rng(0).standard_normal(shape) * 3 + 1).astype(np.float32)
    outs = [np.empty(shape, np.float32), np.empty(1, np.float32), np.empty(1, np.float32)]
    fn, args = KERNELS[BATCH_STATS].bind((x, None, None, True, 0.1, 1e-5, *outs))
    assert fn is not KERNELS[BATCH_STATS]
    fn(*args)
    t = torch.from_numpy(x.astype(np.float64))
    for out, want in zip(outs, torch.ops.aten._native_batch_norm_legit.no_stats(
            t, None, None, True, 0.1, 1e-5)):
        np.testing.assert_allclose(out, want.numpy(), rtol=1e-5, atol=1e-5)


def batch_norm_args(shape, dtype=np.float32, make=frozen, out=None):
    rng = np.random.default_rng(1)
    c = shape[1]
    x = rng.standard_normal(shape).astype(dtype)
    stats = [make(rng.uniform(0.5, 2, c).astype(dtype)) for _ in range(4)]
    empty = np.empty((0,), dtype)
    return (x, *stats, 0.1, 1e-5, x if out == "self" else np.empty(shape, dtype), empty, empty)


@pytest.mark.parametrize("shape", [(4, 3), (2, 3, 5), (2, 3, 4, 4)], ids=str)
def test_batch_norm_fast_path_with_constant_statistics(shape):
    assert fast(BATCH_NORM, *batch_norm_args(shape))
    assert fast(BATCH_NORM, *batch_norm_args(shape, np.float64))


def test_batch_norm_general_kernel():
    assert not fast(BATCH_NORM, *batch_norm_args((2, 3, 4), np.float16))
    assert not fast(BATCH_NORM, *batch_norm_args((2, 3, 4), out="self"))
    assert not fast(BATCH_NORM, *batch_norm_args((2, 3, 4), make=np.array))  # not constants


def test_batch_norm_statistics_that_are_inputs_are_read_per_call():
    # Writable statistics are program inputs: a binder that folded them at bind would
    # keep computing with the first call's values.
    args = batch_norm_args((2, 3, 4), make=np.array)
    x, weight, bias, mean, var = args[:5]
    fn, bound = KERNELS[BATCH_NORM].bind(args)
    fn(*bound)
    var *= 4.0
    mean += 1.0
    fn(*bound)
    want = torch.nn.functional.batch_norm(
        *(torch.from_numpy(a.astype(np.float64)) for a in (x, mean, var, weight, bias)),
        training=False, momentum=0.1, eps=1e-5)
    np.testing.assert_allclose(args[7], want.numpy(), rtol=1e-5, atol=1e-5)
