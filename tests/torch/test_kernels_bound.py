"""Bound kernels (``kernel.bind(args)``, see opforge/kernels/portable/_binding.py) against
their general kernels: fast paths the per-family ``check`` helpers do not reach (constant
statistics, pooling edge cases, the threaded split, the GELU table), workspace reuse, and
that a bound call — and a whole method call — allocates nothing.

The per-family kernel tests (test_kernels_*.py) already run every key both ways.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from opforge.kernels.portable import _binding, portable_kernels

KERNELS = portable_kernels()


def bound(key, *args):
    fn, bound_args = KERNELS[key].bind(args)
    return lambda: fn(*bound_args)


def frozen(a: np.ndarray) -> np.ndarray:
    """A read-only copy: what a program constant looks like to a kernel."""
    a = np.array(a)
    a.flags.writeable = False
    return a


def test_a_bound_add_is_the_bare_ufunc():
    a, b, out = (np.ones((1, 4), np.float32) for _ in range(3))
    assert KERNELS["aten::add.out"].bind((a, b, 1, out)) == (np.add, (a, b, out))


@pytest.mark.parametrize("affine", [True, False])
def test_batch_norm_folds_constant_statistics(affine):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 5, 4, 3)).astype(np.float32)
    mean, var = frozen(rng.uniform(-1, 1, 5).astype(np.float32)), \
        frozen(rng.uniform(0.5, 2, 5).astype(np.float32))
    weight = frozen(rng.uniform(0.5, 1.5, 5).astype(np.float32)) if affine else None
    bias = frozen(rng.uniform(-1, 1, 5).astype(np.float32)) if affine else None
    empty = np.empty((0,), np.float32)
    key = "aten::_native_batch_norm_legit_no_training.out"
    expected = np.empty_like(x)
    KERNELS[key](x, weight, bias, mean, var, 0.1, 1e-5, expected, empty, empty)
    out = np.empty_like(x)
    call = bound(key, x, weight, bias, mean, var, 0.1, 1e-5, out, empty, empty)
    assert getattr(KERNELS[key].bind((x, weight, bias, mean, var, 0.1, 1e-5, out, empty,
                                      empty))[0], "__name__", "") != key  # not the fallback
    for _ in range(2):
        call()
        np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-6)
        out.fill(np.nan)
    t = torch.nn.functional.batch_norm(
        torch.from_numpy(x), torch.from_numpy(mean.copy()), torch.from_numpy(var.copy()),
        None if weight is None else torch.from_numpy(weight.copy()),
        None if bias is None else torch.from_numpy(bias.copy()), False, 0.1, 1e-5)
    call()
    np.testing.assert_allclose(out, t.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kernel, stride, padding, dilation, ceil_mode", [
    ((2, 2), (2, 2), (0, 0), (1, 1), False), ((3, 3), (2, 2), (1, 1), (1, 1), False),
    ((3, 2), (2, 1), (1, 0), (2, 1), True), ((2, 2), (2, 2), (0, 0), (1, 1), True),
])
@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_max_pool_tap_scan_matches_torch(kernel, stride, padding, dilation, ceil_mode, dtype):
    rng = np.random.default_rng(1)
    x = rng.integers(-3, 4, (2, 3, 9, 7)).astype(dtype)  # many ties
    if dtype == np.float32:
        x[0, 0, 1, 1] = x[0, 1, 4, 4] = x[0, 1, 4, 5] = np.nan  # NaN wins, first NaN
        x[1, 2, 0, :] = -np.inf
    out = indices = call = None
    # with NaNs, without, with again: the same bound buffers follow the input
    for values in (x.copy(), np.nan_to_num(x, nan=1.0), x.copy()):
        tv, ti = torch.ops.aten.max_pool2d_with_indices(
            torch.from_numpy(values), kernel, stride, padding, dilation, ceil_mode)
        if call is None:
            out, indices = np.empty(tv.shape, dtype), np.empty(ti.shape, np.int64)
            call = bound("aten::max_pool2d_with_indices.out", x, kernel, stride, padding,
                         dilation, ceil_mode, out, indices)
        x[...] = values
        for _ in range(2):
            call()
            np.testing.assert_array_equal(out, tv.numpy())
            np.testing.assert_array_equal(indices, ti.numpy())
            out.fill(0)
            indices.fill(-1)


@pytest.mark.parametrize("groups, kernel, stride, padding, dilation", [
    (16, 3, 1, 1, 1), (16, 3, 2, 1, 1), (16, 5, 1, 2, 2),   # depthwise
    (1, 1, 1, 0, 1), (1, 1, 2, 0, 1),                      # 1×1 (matmul), strided 1×1
    (4, 3, 1, 1, 1), (1, 3, 2, 0, 1), (2, (3, 1), 1, (1, 0), (2, 1)),
])
def test_convolution_fast_paths_match_torch(groups, kernel, stride, padding, dilation):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 16, 9, 8)).astype(np.float32)
    kh, kw = (kernel, kernel) if isinstance(kernel, int) else kernel
    w = rng.standard_normal((16, 16 // groups, kh, kw)).astype(np.float32)
    b = rng.standard_normal(16).astype(np.float32)
    pair = lambda v: (v, v) if isinstance(v, int) else v
    t = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w),
                                   torch.from_numpy(b), pair(stride), pair(padding),
                                   pair(dilation), groups)
    out = np.empty(t.shape, np.float32)
    call = bound("aten::convolution.out", x, w, b, pair(stride), pair(padding),
                 pair(dilation), False, (0, 0), groups, out)
    for _ in range(2):
        call()
        np.testing.assert_allclose(out, t.numpy(), rtol=1e-5, atol=1e-5)
        out.fill(np.nan)
    x[...] = rng.standard_normal(x.shape)  # new input values: the bound views follow
    call()
    t = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w),
                                   torch.from_numpy(b), pair(stride), pair(padding),
                                   pair(dilation), groups)
    np.testing.assert_allclose(out, t.numpy(), rtol=1e-5, atol=1e-5)


def test_gelu_float32_table_is_within_2e_7_of_erf():
    x = np.concatenate([np.linspace(-9, 9, 400_001), [0.0, -0.0, 1e-30, 5.9999, 6.0]])
    x = x.astype(np.float32)
    out = np.empty_like(x)
    bound("aten::gelu.out", x, "none", out)()
    xd = x.astype(np.float64)
    exact = np.array([0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in xd.tolist()])
    # |y - x Phi(x)| <= |x| * (erf error) / 2 + one float32 rounding of y
    bound_err = np.abs(out - exact) - np.abs(xd) * 1e-7 - np.abs(exact) * 2 ** -23
    assert bound_err.max() <= 1e-12
    specials = np.array([np.nan, np.inf, -np.inf], np.float32)
    got, want = np.empty_like(specials), np.empty_like(specials)
    with np.errstate(all="ignore"):
        bound("aten::gelu.out", specials, "none", got)()
        KERNELS["aten::gelu.out"](specials, "none", want)
    np.testing.assert_array_equal(got, want)


@pytest.fixture
def threads(monkeypatch):
    monkeypatch.setattr(_binding, "NUM_THREADS", 3)
    monkeypatch.setattr(_binding, "PARALLEL_MIN", 1000)


@pytest.mark.parametrize("size", [1000, 4097, 12_345, 3 * 4096])
def test_threaded_chunks_cover_every_element(threads, size):
    rng = np.random.default_rng(size)
    a = rng.standard_normal(size).astype(np.float32)
    b = rng.standard_normal(size).astype(np.float32)
    cases = [("aten::add.out", (a, b, 1)), ("aten::add.out", (a, b, 2.5)),
             ("aten::sub.out", (a, 0.5, 3)), ("aten::sigmoid.out", (a,)),
             ("aten::tanh.out", (a,)), ("aten::clamp.out", (a, -0.5, 0.5)),
             ("aten::gelu.out", (a, "tanh"))]
    for key, args in cases:
        expected = np.empty_like(a)
        KERNELS[key](*args, expected)
        out = np.empty_like(a)
        fn, bound_args = KERNELS[key].bind((*args, out))
        if key != "aten::gelu.out" or size >= 1000:
            assert "chunks" in repr(fn), key  # really the threaded path
        for _ in range(3):
            out.fill(np.nan)
            fn(*bound_args)
            np.testing.assert_allclose(out, expected, rtol=2e-6, atol=2e-6, err_msg=key)


def test_small_or_broadcast_outputs_are_not_split(threads):
    a = np.ones((64, 64), np.float32)
    row = np.ones(64, np.float32)
    out = np.empty_like(a)
    assert KERNELS["aten::add.out"].bind((a, row, 1, out))[0] is np.add
    small = np.ones(999, np.float32)
    assert KERNELS["aten::add.out"].bind((small, small, 1, small.copy()))[0] is np.add


# NumPy's ufunc iterator may take transient cast/stride buffers of up to ``bufsize``
# elements per operand (8192 by default; the `allocations` fixture sets 1024) and frees them on return;
# tracemalloc's own bookkeeping and Python's free lists move a few KiB either way. Nothing
# else may be allocated: the tensors in these tests are >= 64 KiB, so a tensor-sized
# temporary would show.
TRANSIENT = 24 * 1024
RETAINED = 4 * 1024


def _bound_cases():
    rng = np.random.default_rng(3)
    f = lambda *shape: rng.standard_normal(shape).astype(np.float32)
    e = lambda *shape: np.empty(shape, np.float32)
    x, w, b = f(128, 64), frozen(f(128, 64)), frozen(f(128))
    img = f(1, 16, 32, 32)
    return [
        ("aten::add.out", (f(128, 128), f(128, 128), 1, e(128, 128))),
        ("aten::add.out", (f(128, 128), f(128), 2.0, e(128, 128))),
        ("aten::mul.Scalar_out", (f(128, 128), 0.125, e(128, 128))),
        ("aten::sigmoid.out", (f(128, 128), e(128, 128))),
        ("aten::linear.out", (x, w, b, e(128, 128))),
        ("aten::gelu.out", (f(128, 128), "none", e(128, 128))),
        ("aten::gelu.out", (f(128, 128), "tanh", e(128, 128))),
        ("aten::_softmax.out", (f(4, 64, 64), -1, False, e(4, 64, 64))),
        ("aten::native_layer_norm.out", (f(256, 64), (64,), frozen(f(64)), frozen(f(64)),
                                         1e-5, e(256, 64), e(256, 1), e(256, 1))),
        ("aten::convolution.out", (img, frozen(f(16, 16, 3, 3)), frozen(f(16)), (1, 1),
                                   (1, 1), (1, 1), False, (0, 0), 1, e(1, 16, 32, 32))),
        ("aten::convolution.out", (img, frozen(f(16, 1, 3, 3)), None, (1, 1), (1, 1),
                                   (1, 1), False, (0, 0), 16, e(1, 16, 32, 32))),
        ("aten::convolution.out", (img, frozen(f(32, 16, 1, 1)), None, (1, 1), (0, 0),
                                   (1, 1), False, (0, 0), 1, e(1, 32, 32, 32))),
        ("aten::max_pool2d_with_indices.out", (img, (2, 2), (2, 2), (0, 0), (1, 1), False,
                                               e(1, 16, 16, 16),
                                               np.empty((1, 16, 16, 16), np.int64))),
        ("aten::mean.out", (img, (-1, -2), True, None, e(1, 16, 1, 1))),
        ("aten::permute_copy.out", (img, (0, 2, 3, 1), e(1, 32, 32, 16))),
    ]


@pytest.mark.parametrize("key, args", _bound_cases(), ids=lambda v: v if isinstance(v, str)
                         else "")
def test_a_bound_call_allocates_nothing(key, args, allocations):
    fn, bound_args = KERNELS[key].bind(args)
    peak, retained = allocations(lambda: fn(*bound_args))
    assert retained < RETAINED and peak < TRANSIENT, f"{key}: peak {peak}, retained {retained}"


@pytest.mark.parametrize("name", ["mlp", "cnn", "transformer_layer", "gpt_decoder",
                                  "depthwise_separable", "resnet_block"])
def test_a_zoo_method_call_allocates_nothing(name, allocations):
    from opforge.examples.zoo import ZOO
    from opforge.export import export
    from opforge.runtime import load

    model, inputs = ZOO[name]()
    forward = load(export(model, inputs, kernels="portable"), mode="lean").method("forward")
    arrays = [np.ascontiguousarray(t.numpy()) for t in inputs]
    with torch.no_grad():
        expected = model(*inputs).numpy()
    np.testing.assert_allclose(forward(*arrays)[0], expected, rtol=1e-4, atol=1e-5)
    peak, retained = allocations(lambda: forward(*arrays, views=True))
    assert retained < RETAINED and peak < TRANSIENT, f"{name}: peak {peak}, retained {retained}"
    np.testing.assert_allclose(forward(*arrays)[0], expected, rtol=1e-4, atol=1e-5)


def test_constant_operands_are_shared_read_only_and_exact():
    zeros = _binding.constant_operand(0, np.dtype(np.float32), (3, 4))
    again = _binding.constant_operand(0.0, np.dtype(np.float32), (2, 2))
    assert zeros.shape == (3, 4) and not zeros.any() and not zeros.flags.writeable
    assert np.shares_memory(zeros, again)  # one buffer per (dtype, value)
    negative_zero = _binding.constant_operand(-0.0, np.dtype(np.float32), (5,))
    assert np.signbit(negative_zero).all()  # -0.0 is not the zero buffer
    sixes = _binding.constant_operand(6.5, np.dtype(np.int32), (1000, 3))
    assert sixes.dtype == np.int32 and (sixes == 6).all()
    bigger = _binding.constant_operand(6.5, np.dtype(np.int32), (4000,))  # grows
    assert (bigger == 6).all() and (sixes == 6).all()  # older views keep their buffer
    with pytest.raises(ValueError):
        zeros[0, 0] = 1.0
