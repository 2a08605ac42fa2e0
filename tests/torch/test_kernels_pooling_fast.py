"""Max pooling's bound fast paths (the 2x2 tournament, the NaN-free tap scan and their
exact rerun on NaN) and adaptive max pooling, against PyTorch eager: values, signs of zero
and int64 indices exactly, on odd sizes, non-contiguous inputs, ties, NaN and -inf.
"""

from __future__ import annotations


import numpy as np
import pytest
import torch

from opforge.kernels.portable import pooling, portable_kernels

KERNELS = portable_kernels()
MAX_POOL = "aten::max_pool2d_with_indices.out"
ADAPTIVE = "aten::adaptive_max_pool2d.out"
DTYPES = [np.float32, np.float64, np.float16, np.int32, np.int64]


def data(shape, dtype, kind="contiguous", seed=0, specials=True):
    """Small integers (many ties) with, for floats, NaN (one and several per window), -inf
    and both signs of zero; laid out as ``kind``."""
    rng = np.random.default_rng(seed)
    full = {"contiguous": shape, "transposed": shape[:-2] + shape[-2:][::-1],
            "strided": shape[:-1] + (2 * shape[-1],), "sliced": (shape[0] + 2,) + shape[1:]}
    x = rng.integers(-3, 4, full[kind]).astype(dtype)
    x = {"contiguous": x, "transposed": np.swapaxes(x, -1, -2), "strided": x[..., ::2],
         "sliced": x[2:]}[kind]
    assert x.shape == shape
    if specials and np.issubdtype(dtype, np.floating):
        flat = x.reshape(-1) if x.flags.c_contiguous else None
        if flat is None:  # write through the view's own indexing
            index = np.unravel_index(np.arange(x.size), x.shape)
            values = x[index]
        else:
            values = flat
        values[rng.random(x.size) < 0.04] = np.nan
        values[rng.random(x.size) < 0.04] = -np.inf
        values[values == 0] = rng.choice(np.array([0.0, -0.0], dtype), (values == 0).sum())
        if flat is None:
            x[index] = values
        x[(0,) * (x.ndim - 2) + (slice(0, 2), slice(0, 2))] = np.nan  # a window of NaN
    return x


def torch_max_pool(x, *pool):
    return [t.numpy() for t in torch.ops.aten.max_pool2d_with_indices(
        torch.from_numpy(np.ascontiguousarray(x)), *[list(p) for p in pool[:4]], pool[4])]


def assert_same(got, expected):
    values, indices = got
    np.testing.assert_array_equal(values, expected[0])
    np.testing.assert_array_equal(np.signbit(values), np.signbit(expected[0]))
    np.testing.assert_array_equal(indices, expected[1])


def run_bound(key, x, *params, shape, expected_fn):
    """Bind once; call twice (the second over garbage), then with new input values: with
    NaN (the fast paths rerun the exact scan), without (they stand alone), with again."""
    out = np.empty(shape, x.dtype)
    indices = np.empty(shape, np.int64)
    fn, args = KERNELS[key].bind((x, *params, out, indices))
    without_nan = np.where(np.isnan(x), x.dtype.type(1), -x)  # -x: each zero changes sign
    for values in (x.copy(), without_nan, x.copy()):
        x[...] = values
        expected = expected_fn(x)
        for _ in range(2):
            fn(*args)
            assert_same((out, indices), expected)
            out.fill(5)
            indices.fill(-1)
    return fn


SHAPES = [(1, 8, 32, 32), (2, 3, 7, 9), (3, 5, 6), (1, 1, 2, 2), (2, 4, 5, 3)]


@pytest.mark.parametrize("kind", ["contiguous", "transposed", "strided", "sliced"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES)
def test_2x2_stride_2_matches_torch(dtype, shape, kind):
    x = data(shape, dtype, kind, seed=sum(shape))
    pool = ((2, 2), (2, 2), (0, 0), (1, 1), False)
    expected = torch_max_pool(x, *pool)
    general = (np.empty(expected[0].shape, dtype), np.empty(expected[1].shape, np.int64))
    KERNELS[MAX_POOL](x, *pool, *general)
    assert_same(general, expected)
    run_bound(MAX_POOL, x, *pool, shape=expected[0].shape,
              expected_fn=lambda v: torch_max_pool(v, *pool))
    fn, args = KERNELS[MAX_POOL].bind((x, *pool, *general))
    fast = args[0]  # the steps: _run_checked's first argument, or _run's only one
    assert fn is pooling._run_checked or not np.issubdtype(dtype, np.floating)
    assert len(fast) == 7, "the 2x2 tournament, not a tap scan"


def test_2x2_without_nan_does_not_rerun_the_exact_scan(monkeypatch):
    x = data((1, 8, 32, 32), np.float32, specials=False)
    out, indices = np.empty((1, 8, 16, 16), np.float32), np.empty((1, 8, 16, 16), np.int64)
    fn, args = KERNELS[MAX_POOL].bind((x, (2, 2), (2, 2), (0, 0), (1, 1), False, out,
                                       indices))
    reruns = []
    exact = args[2]
    args = (args[0], args[1], (lambda *a: reruns.append(exact[0](*a)), exact[1]))
    fn(*args)
    assert reruns == []
    assert_same((out, indices), torch_max_pool(x, (2, 2), (2, 2), (0, 0), (1, 1), False))
    x[0, 3, 5, 5] = np.nan
    fn(*args)
    assert len(reruns) == 1
    assert_same((out, indices), torch_max_pool(x, (2, 2), (2, 2), (0, 0), (1, 1), False))


POOLS = [  # kernel, stride, padding, dilation, ceil_mode
    ((3, 3), (2, 2), (1, 1), (1, 1), False), ((3, 3), (2, 2), (1, 1), (1, 1), True),
    ((3, 2), (2, 1), (1, 0), (2, 1), False), ((2, 2), (2, 2), (0, 0), (1, 1), True),
    ((2, 2), (1, 1), (0, 0), (1, 1), False), ((3, 3), (3, 3), (0, 0), (1, 1), False),
    ((1, 2), (1, 2), (0, 1), (1, 1), False),
]


@pytest.mark.parametrize("kind", ["contiguous", "transposed"])
@pytest.mark.parametrize("pool", POOLS, ids=str)
@pytest.mark.parametrize("dtype", DTYPES)
def test_tap_scans_match_torch(dtype, pool, kind):
    x = data((2, 3, 9, 7), dtype, kind, seed=len(str(pool)))
    expected = torch_max_pool(x, *pool)
    general = (np.empty(expected[0].shape, dtype), np.empty(expected[1].shape, np.int64))
    KERNELS[MAX_POOL](x, *pool, *general)
    assert_same(general, expected)
    run_bound(MAX_POOL, x, *pool, shape=expected[0].shape,
              expected_fn=lambda v: torch_max_pool(v, *pool))


@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_windows_of_only_the_padding_fill_keep_their_first_input(dtype):
    fill = -np.inf if dtype == np.float32 else np.iinfo(dtype).min
    x = np.full((1, 2, 4, 5), fill, dtype)
    pool = ((3, 3), (2, 2), (1, 1), (1, 1), False)
    expected = torch_max_pool(x, *pool)
    assert expected[1].min() >= 0
    general = (np.empty(expected[0].shape, dtype), np.empty(expected[1].shape, np.int64))
    KERNELS[MAX_POOL](x, *pool, *general)
    assert_same(general, expected)
    run_bound(MAX_POOL, x, *pool, shape=expected[0].shape,
              expected_fn=lambda v: torch_max_pool(v, *pool))


def torch_adaptive(x, size):
    return [t.numpy() for t in torch.ops.aten.adaptive_max_pool2d(
        torch.from_numpy(np.ascontiguousarray(x)), list(size))]


@pytest.mark.parametrize("size", [(1, 1), (3, 4), (2, 3), (4, 4), (5, 5), (7, 2), (9, 11)],
                         ids=str)
@pytest.mark.parametrize("shape", [(2, 3, 8, 8), (3, 7, 9), (1, 2, 5, 4)], ids=str)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])  # torch: floats only
def test_adaptive_max_pool_matches_torch(dtype, shape, size):
    x = data(shape, dtype, "transposed" if shape[-1] == 9 else "contiguous", seed=7)
    expected = torch_adaptive(x, size)
    general = (np.empty(expected[0].shape, dtype), np.empty(expected[1].shape, np.int64))
    assert KERNELS[ADAPTIVE](x, size, *general) is None
    assert_same(general, expected)
    run_bound(ADAPTIVE, x, size, shape=expected[0].shape,
              expected_fn=lambda v: torch_adaptive(v, size))


def test_adaptive_max_pool_with_a_one_entry_size_and_empty_output():
    x = data((2, 6, 6), np.float32)
    expected = torch_adaptive(x, (4, 4))
    out, indices = np.empty((2, 4, 4), np.float32), np.empty((2, 4, 4), np.int64)
    KERNELS[ADAPTIVE](x, (4,), out, indices)
    assert_same((out, indices), expected)
    empty = np.empty((2, 0, 4), np.float32), np.empty((2, 0, 4), np.int64)
    KERNELS[ADAPTIVE](x, (0, 4), *empty)


@pytest.mark.parametrize("key, params, shape", [
    (MAX_POOL, ((2, 2), (2, 2), (0, 0), (1, 1), False), (1, 16, 16, 16)),
    (MAX_POOL, ((3, 3), (2, 2), (1, 1), (1, 1), False), (1, 16, 16, 16)),
    (ADAPTIVE, ((5, 5),), (1, 16, 5, 5)),
])
def test_bound_pooling_allocates_nothing(key, params, shape, allocations):
    x = np.random.default_rng(0).standard_normal((1, 16, 32, 32)).astype(np.float32)
    out, indices = np.empty(shape, np.float32), np.empty(shape, np.int64)
    fn, args = KERNELS[key].bind((x, *params, out, indices))
    peak, _ = allocations(lambda: fn(*args), repeats=10)
    assert peak < 16 * 1024  # tensors here are >= 16 KiB


def test_adaptive_max_pool_exports_and_runs_lean():
    from opforge.export import export
    from opforge.runtime import load

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.MaxPool2d(2),
                                torch.nn.AdaptiveMaxPool2d((3, 2))).eval()
    x = torch.randn(1, 3, 17, 15, generator=torch.Generator().manual_seed(0))
    forward = load(export(model, (x,), kernels="portable"), mode="lean").method("forward")
    with torch.no_grad():
        expected = model(x).numpy()
    np.testing.assert_allclose(forward(x.numpy())[0], expected, rtol=1e-5, atol=1e-6)
