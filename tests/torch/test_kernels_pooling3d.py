"""3-d pooling kernels (max with indices, average, adaptive average, adaptive max) against
PyTorch eager, on batched (N, C, D, H, W) and unbatched (C, D, H, W) inputs, contiguous and
transposed (every axis reversed, so no axis is contiguous), and end to end through export.

Tolerances:
- max pooling and adaptive max pooling select an input: values and int64 indices must match
  exactly (NaN matching NaN), and so must the signs of zero (checked separately).
- average pooling sums a window of n <= 27 values (kernels up to 3x3x3) in another order
  than ATen (NumPy's pairwise sum vs ATen's loop) and divides once: the error is below
  n * eps * max|x| * count / divisor. Inputs are standard normal (|x| < 5 for these
  seeds) and divisor_override, where given, is at least half the count (volume - 1), so
  float32 allows 27 * 1.2e-7 * 5 * 2 ~= 3.2e-5 (rtol = atol = 4e-5), float64
  27 * 2.2e-16 * 5 * 2 ~= 6e-14 (1e-13). int64 divides in integers, truncating as C
  does: exact.
- adaptive average pooling sums bins of at most 7x6x5 = 210 values one axis at a time
  (ATen: one loop over the box) and divides once; by the same bound float32 allows
  210 * 1.2e-7 * 5 ~= 1.3e-4 (rtol = atol = 1.5e-4), float64 210 * 2.2e-16 * 5 ~= 2.3e-13
  (3e-13).
  (These are worst-case bounds; measured on these cases, both differ from ATen by at most
  1 ulp of the result's magnitude: 1.2e-7 / 2.2e-16.)
- end to end, Conv3d and BatchNorm3d accumulate 54-term dot products and a Linear 16
  more, in float32: rtol 1e-4, atol 1e-5, as tests/torch/test_runtime_portable_models.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from kernel_check import KERNELS, check_kernel, make_array
from torch import nn

from opforge.errors import KernelError
from opforge.export import export
from opforge.runtime import load

A = torch.ops.aten
MAX_POOL = "aten::max_pool3d_with_indices.out"
AVG_POOL = "aten::avg_pool3d.out"
ADAPTIVE_AVG = "aten::_adaptive_avg_pool3d.out"
ADAPTIVE_MAX = "aten::adaptive_max_pool3d.out"
AVG_TOLS = {np.float32: 4e-5, np.float64: 1e-13}
ADAPTIVE_TOLS = {np.float32: 1.5e-4, np.float64: 3e-13}
SHAPES = [(2, 3, 6, 7, 5), (3, 5, 8, 4), (1, 1, 4, 4, 4)]
LAYOUTS = ["contiguous", "transposed"]

# (kernel_size, stride, padding, dilation): non-cubic kernels, default stride ([]),
# padding up to half the kernel, dilation on one axis.
MAX_PARAMS = [
    ((2, 2, 2), (), (0, 0, 0), (1, 1, 1)),
    ((3, 2, 1), (1, 2, 1), (1, 1, 0), (1, 1, 1)),
    ((2, 3, 3), (2, 1, 2), (1, 1, 1), (1, 2, 1)),
    ((3,), (2,), (1,), (1,)),  # one value for every spatial dim, as ATen broadcasts it
]
AVG_PARAMS = [
    ((2, 2, 2), (), (0, 0, 0)),
    ((3, 2, 1), (1, 2, 1), (1, 1, 0)),
    ((3, 3, 3), (2, 3, 2), (1, 1, 1)),
]


def with_nan(x: np.ndarray, seed: int = 0) -> tuple[np.ndarray, torch.Tensor]:
    """``x`` (written through, whatever its layout) with NaN at a few random places and a
    window's worth at its first corner: one NaN and several per window."""
    rng = np.random.default_rng(seed)
    x[rng.random(x.shape) < 0.05] = np.nan
    x[..., :2, :2, :2] = np.nan
    return x, torch.from_numpy(np.ascontiguousarray(x))


@pytest.mark.parametrize("ceil_mode", [False, True])
@pytest.mark.parametrize("params", MAX_PARAMS)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int64])
def test_max_pool3d_matches_aten(dtype, shape, layout, params, ceil_mode):
    if dtype == np.int64:
        x, t = make_array(shape, dtype, layout)  # small integers: many ties
    else:
        x, _ = make_array(shape, dtype, layout, floats=(-3, 3))
        x[...] = np.round(x)  # ties between equal values, and both signs of zero
        x, t = with_nan(x)
    expected = A.max_pool3d_with_indices(t, *[list(p) for p in params], ceil_mode)
    check_kernel(MAX_POOL, expected, x, *params, ceil_mode, tols={})


def test_max_pool3d_keeps_the_first_maximum_and_its_sign_of_zero():
    x = np.zeros((2, 4, 4, 4), np.float32)
    x[0, 1::2] = -0.0  # windows of +0 then -0 (and -0 then +0 below): the first one wins
    x[1, ::2] = -0.0
    x[1, :, 3, 3] = -np.inf  # a window of -inf beside the padding keeps its first input
    params = ((2, 2, 2), (2, 2, 2), (1, 1, 1), (1, 1, 1))
    values, indices = A.max_pool3d_with_indices(torch.from_numpy(x),
                                                *[list(p) for p in params], False)
    out, got = np.empty(values.shape, np.float32), np.empty(indices.shape, np.int64)
    KERNELS[MAX_POOL](x, *params, False, out, got)
    np.testing.assert_array_equal(np.signbit(out), np.signbit(values.numpy()))
    np.testing.assert_array_equal(got, indices.numpy())


# divisor_override as a function of the kernel's volume: none, below it (larger results),
# negative (ATen takes any non-zero divisor; integers truncate towards zero).
DIVISORS = {"none": lambda volume: None, "volume - 1": lambda volume: volume - 1,
            "-(volume + 1)": lambda volume: -(volume + 1)}


@pytest.mark.parametrize("divisor", sorted(DIVISORS))
@pytest.mark.parametrize("count_include_pad", [True, False])
@pytest.mark.parametrize("ceil_mode", [False, True])
@pytest.mark.parametrize("params", AVG_PARAMS)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
def test_avg_pool3d_matches_aten(dtype, shape, layout, params, ceil_mode, count_include_pad,
                                 divisor):
    x, t = make_array(shape, dtype, layout, seed=3, ints=(-20, 20))
    k, s, p = params
    divisor_override = DIVISORS[divisor](int(np.prod(k)))
    expected = A.avg_pool3d(t, list(k), list(s), list(p), ceil_mode, count_include_pad,
                            divisor_override)
    check_kernel(AVG_POOL, expected, x, k, s, p, ceil_mode, count_include_pad,
                 divisor_override, tols=AVG_TOLS)


OUTPUT_SIZES = [(1, 1, 1), (3, 2, 5), (2, 2, 2), (4, 5, 3), (6, 7, 5)]


@pytest.mark.parametrize("output_size", OUTPUT_SIZES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_adaptive_avg_pool3d_matches_aten(dtype, shape, layout, output_size):
    x, t = make_array(shape, dtype, layout, seed=4)
    check_kernel(ADAPTIVE_AVG, A._adaptive_avg_pool3d(t, list(output_size)), x, output_size,
                 tols=ADAPTIVE_TOLS)


@pytest.mark.parametrize("key,spatial", [(ADAPTIVE_AVG, 3),
                                         ("aten::_adaptive_avg_pool2d.out", 2)])
def test_adaptive_avg_pool_inf_reaches_only_its_bins(key, spatial):
    x = np.random.default_rng(5).standard_normal((2, 3) + (7,) * spatial)
    x[0, 1, (2,) * spatial] = np.inf
    x[1, 2, (5,) * spatial] = -np.inf
    output_size = (3,) * spatial  # overlapping bins: 7 is not a multiple of 3
    op = A._adaptive_avg_pool3d if spatial == 3 else A._adaptive_avg_pool2d
    expected = op(torch.from_numpy(x), list(output_size))
    check_kernel(key, expected, x, output_size, tols={np.float64: 1e-13})


@pytest.mark.parametrize("output_size", OUTPUT_SIZES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_adaptive_max_pool3d_matches_aten(dtype, shape, layout, output_size):
    x, _ = make_array(shape, dtype, layout, floats=(-3, 3), seed=6)
    x[...] = np.round(x)
    x, t = with_nan(x, seed=6)
    expected = A.adaptive_max_pool3d(t, list(output_size))
    check_kernel(ADAPTIVE_MAX, expected, x, output_size, tols={})


def test_a_wrong_number_of_spatial_params_is_refused():
    x = np.zeros((1, 1, 4, 4, 4), np.float32)
    out, indices = np.empty((1, 1, 2, 2, 2), np.float32), np.empty((1, 1, 2, 2, 2), np.int64)
    with pytest.raises(KernelError, match="kernel_size"):
        KERNELS[MAX_POOL](x, (2, 2), (), (0,), (1,), False, out, indices)


class Volumes(nn.Module):
    """Conv3d → BatchNorm3d → ReLU → MaxPool3d → AvgPool3d → AdaptiveAvgPool3d → Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv3d(2, 4, 3, padding=1)
        self.norm = nn.BatchNorm3d(4)
        self.pool = nn.AdaptiveAvgPool3d((1, 2, 2))
        self.head = nn.Linear(16, 5)
        with torch.no_grad():  # running statistics that are not the identity
            self.norm.running_mean.uniform_(-0.5, 0.5)
            self.norm.running_var.uniform_(0.5, 2.0)

    def forward(self, x):
        y = torch.relu(self.norm(self.conv(x)))
        y = F.max_pool3d(y, (2, 3, 2), stride=(2, 2, 1), padding=(1, 1, 0), ceil_mode=True)
        y = F.avg_pool3d(y, 2, stride=1, padding=1, count_include_pad=False)
        return self.head(self.pool(y).flatten(1))


def test_conv3d_pooling_model_runs_on_portable_kernels_like_eager():
    torch.manual_seed(0)
    model = Volumes().eval()
    x = torch.randn(2, 2, 7, 9, 8)
    program = export(model, (x,), kernels="portable")
    keys = {o.key for o in program.method("forward").operators}
    assert {MAX_POOL, AVG_POOL, ADAPTIVE_AVG} <= keys, sorted(keys)
    with torch.no_grad():
        expected = model(x).numpy()
    forward = load(program).method("forward")
    for _ in range(2):  # a second call on the same arena gives the same answer
        (got,) = forward(x.numpy())
        assert got.shape == expected.shape and got.dtype == expected.dtype
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
