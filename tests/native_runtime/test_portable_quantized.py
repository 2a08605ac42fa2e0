"""The portable C++ quantize / dequantize and factory kernels against the NumPy kernels of the
same keys, bit for bit (the NumPy kernels reproduce torch's arithmetic order; so must these)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.native_runtime._portable_compare import compare, lib, refused  # noqa: F401

QD = "quantized_decomposed::"


def _data(shape, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    x = np.asarray(rng.standard_normal(shape) * 3)
    flat = x.reshape(-1)
    # exact ties of x * (1 / scale): the round-half-to-even cases
    flat[: min(8, flat.size)] = np.array([0.5, 1.5, 2.5, -0.5, -1.5, 1000, -1000, 0.25])[: min(8, flat.size)] * 0.05
    if flat.size > 40:  # NaN, inf and out-of-range values through the vector loops too
        flat[20:24] = [np.nan, np.inf, -np.inf, 1e10]
    with np.errstate(over="ignore"):
        return np.asarray(x).astype(dtype)


@pytest.mark.parametrize("in_dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("q_dtype,qmin,qmax", [(np.int8, -128, 127), (np.uint8, 0, 255),
                                               (np.int16, -32768, 32767), (np.int32, -100, 100)])
def test_per_tensor(lib, in_dtype, q_dtype, qmin, qmax):
    for shape, scale, zp in [((4, 33), 0.05, 3), ((2, 3, 5), 0.013, -7), ((1,), 0.1, 0), ((0, 3), 1.0, 0)]:
        x = _data(shape, dtype=in_dtype)
        q = compare(lib, QD + "quantize_per_tensor.out", x, scale, zp, qmin, qmax, q_dtype,
                    np.empty(shape, q_dtype))[0]
        for out_dtype in (np.float32, np.float16, np.float64):
            compare(lib, QD + "dequantize_per_tensor.out", q, scale, zp, qmin, qmax, q_dtype, None,
                    np.empty(shape, out_dtype))
    x = _data((6, 8))[:, ::2]  # strided
    compare(lib, QD + "quantize_per_tensor.out", x, 0.05, 1, -128, 127, np.int8, np.empty((6, 4), np.int8))


@pytest.mark.parametrize("q_dtype", [np.int8, np.uint8, np.int16, np.int32])
def test_per_tensor_bounds_and_wide_activations(lib, q_dtype):
    """The vectorized quantize loop's edges against the NumPy kernel: np.clip's order when
    quant_min > quant_max (hi wins), bounds at int32's ends (the scalar fallback), a large
    zero point (16a4w's 0..65535 activations in int32), dequantize of each integer dtype
    (uint16 too) to float32 — dense float32 (the vector paths), odd lengths (their tails)
    and a strided input (the generic path)."""
    x = _data((3, 37))
    for qmin, qmax, zp in [(10, 5, 0), (-3, 3, 2), (0, 65535, 30000), (-2**31, 2**31 - 1, 0)]:
        for data in (x, x[:, ::2]):
            q = compare(lib, QD + "quantize_per_tensor.out", data, 0.05, zp, qmin, qmax, q_dtype,
                        np.empty(data.shape, q_dtype))[0]
            compare(lib, QD + "dequantize_per_tensor.out", q, 0.05, zp, qmin, qmax, q_dtype, None,
                    np.empty(data.shape, np.float32))
    info = np.iinfo(np.uint16)
    q = np.random.default_rng(1).integers(info.min, info.max, 77).astype(np.uint16)
    compare(lib, QD + "dequantize_per_tensor.out", q, 0.013, 40000, 0, 65535, np.uint16, None,
            np.empty(77, np.float32))


@pytest.mark.parametrize("scale_dtype", [np.float32, np.float64, np.float16])
def test_per_channel(lib, scale_dtype):
    rng = np.random.default_rng(3)
    for shape, axis in [((8, 5), 0), ((3, 4, 6), 1), ((3, 4, 6), -1), ((4, 70), 0)]:
        channels = shape[axis]
        scales = (rng.random(channels) * 0.1 + 0.001).astype(scale_dtype)
        zps = rng.integers(-5, 5, channels).astype(np.int64)
        x = _data(shape)
        q = compare(lib, QD + "quantize_per_channel.out", x, scales, zps, axis, -128, 127, np.int8,
                    np.empty(shape, np.int8))[0]
        for out_dtype in (np.float32, np.float16):
            compare(lib, QD + "dequantize_per_channel.out", q, scales, zps, axis, -128, 127,
                    np.int8, None, np.empty(shape, out_dtype))
            compare(lib, QD + "dequantize_per_channel.out", q, scales, None, axis, -128, 127,
                    np.int8, None, np.empty(shape, out_dtype))


@pytest.mark.parametrize("scale_dtype,out_dtype", [(np.float32, np.float32), (np.float32, np.float16),
                                                   (np.float16, np.float32), (np.float64, np.float32)])
def test_affine(lib, scale_dtype, out_dtype):
    rng = np.random.default_rng(4)
    for shape, block in [((8, 32), (1, 8)), ((8, 32), (1, 32)), ((4, 6), (4, 6)), ((6, 4), (1, 1)),
                         ((2, 4, 8), (1, 2, 4))]:
        groups = [s // b if b != s and b > 1 else (s if b == 1 else 1) for s, b in zip(shape, block)]
        scale = (rng.random(groups) * 0.1 + 0.001).astype(scale_dtype)
        zp = rng.integers(-4, 4, groups).astype(np.int8)
        x = _data(shape)
        for lo, hi, q_dtype in [(-8, 7, np.int8), (None, None, np.int8), (0, 15, np.uint8)]:
            q = compare(lib, "torchao::quantize_affine.out", x, list(block), scale, zp, q_dtype,
                        lo, hi, np.empty(shape, q_dtype))[0]
            compare(lib, "torchao::dequantize_affine.out", q, list(block), scale, zp, q_dtype, lo, hi,
                    out_dtype, np.empty(shape, out_dtype))
            compare(lib, "torchao::dequantize_affine.out", q, list(block), scale, None, q_dtype, lo,
                    hi, out_dtype, np.empty(shape, out_dtype))
    refused(lib, "torchao::dequantize_affine.out", np.zeros((4, 6), np.int8), [1, 4],
            np.ones((4, 2), np.float32), None, np.int8, None, None, np.float32,
            np.empty((4, 6), np.float32), match="block 4 does not divide size 6")
    refused(lib, QD + "dequantize_per_tensor.out", np.zeros(3, np.int8), 0.1, 0, -128, 127,
            np.int8, None, np.empty(3, np.int32), match="valid: a float dtype")


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64, np.int32, np.uint8, np.bool_,
                                   np.float64, np.int8])
def test_factory(lib, dtype):
    for value in (0, 1, 2.7, -2.5, True):
        if np.dtype(dtype).kind == "u" and value == -2.5:
            continue
        compare(lib, "aten::full.out", [2, 3], value, np.empty((2, 3), dtype))
        compare(lib, "aten::full_like.out", np.zeros((4,), np.float32), value, None, np.empty((4,), dtype))
        compare(lib, "aten::scalar_tensor.out", value, np.empty((), dtype))
    for key in ("aten::zeros.out", "aten::ones.out"):
        compare(lib, key, [3, 1, 2], np.empty((3, 1, 2), dtype))
    for key in ("aten::zeros_like.out", "aten::ones_like.out"):
        compare(lib, key, np.zeros((2, 2), np.int8), None, np.empty((2, 2), dtype))


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64, np.int32, np.float16])
def test_arange(lib, dtype):
    import math
    for start, end, step in [(0, 10, 1), (2, 11, 3), (0.5, 3, 0.5), (10, 0, -3), (0.0, -8.000001, -4.0),
                             (-3, 3, 0.7), (0, 1, 0.1), (5, 5, 1)]:
        if np.dtype(dtype) == np.int64:
            si, ti = int(start), int(step)
            if ti == 0:
                continue
            span = int(end) - si + ti - ((ti > 0) - (ti < 0))
            count = abs(span) // abs(ti) * (1 if (span >= 0) == (ti > 0) else -1)
        else:
            count = math.ceil((end - start) / step)
        out = np.empty((max(count, 0),), dtype)
        compare(lib, "aten::arange.start_out", start, end, step, out)
    compare(lib, "aten::arange.out", 7, np.empty((7,), dtype))
    refused(lib, "aten::arange.start_out", 0, 10, -1, np.empty((10,), dtype), match="points away")
    refused(lib, "aten::arange.start_out", 0, 10, 1, np.empty((9,), dtype), match="has 9 elements, the range has 10")


def test_full_refuses_out_of_range(lib):
    refused(lib, "aten::full.out", [2], 300, np.empty((2,), np.int8), match=r"found 300 — valid: \[-128, 127\]")
    refused(lib, "aten::full.out", [3], 1, np.empty((2,), np.int8), match=r"out has shape \[2\]")
