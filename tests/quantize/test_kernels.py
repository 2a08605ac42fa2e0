"""The portable quantize/dequantize kernels against torch's own ops: bit-exact, on ties
(round half to even), clamping, every per-channel axis, blocks, and each integer dtype."""

import numpy as np
import pytest
import torch

import opforge.torch_bridge.quantized_ops  # noqa: F401  (the torchao ops are defined on import)
from opforge.kernels.portable import portable_kernels

K = portable_kernels()
qd = torch.ops.quantized_decomposed
RANGES = {torch.uint8: (0, 255), torch.int8: (-128, 127), torch.int16: (-32768, 32767),
          torch.int32: (0, 65535)}


def _inputs(shape, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=gen) * 3
    x.view(-1)[: x.numel() // 4] = torch.arange(x.numel() // 4) * 0.5 - 4  # exact .5 ties at scale 0.5 / 0.25
    return x


@pytest.mark.parametrize("dtype", list(RANGES))
@pytest.mark.parametrize("scale,zp", [(0.5, 3), (0.25, 0), (0.0137, 7), (1e-3, 100)])
def test_per_tensor(dtype, scale, zp):
    qmin, qmax = RANGES[dtype]
    zp = min(max(zp, qmin), qmax)
    x = _inputs((5, 7))
    want = qd.quantize_per_tensor(x, scale, zp, qmin, qmax, dtype)
    got = np.empty(x.shape, want.numpy().dtype)
    K["quantized_decomposed::quantize_per_tensor.out"](x.numpy(), scale, zp, qmin, qmax, None, got)
    np.testing.assert_array_equal(got, want.numpy())
    back = qd.dequantize_per_tensor(want, scale, zp, qmin, qmax, dtype)
    out = np.empty(x.shape, np.float32)
    K["quantized_decomposed::dequantize_per_tensor.out"](want.numpy(), scale, zp, qmin, qmax, None, None, out)
    np.testing.assert_array_equal(out, back.numpy())


@pytest.mark.parametrize("axis", [0, 1, 2, -1])
@pytest.mark.parametrize("dtype", [torch.int8, torch.int16])
def test_per_channel(axis, dtype):
    qmin, qmax = (-127, 127) if dtype == torch.int8 else (-32767, 32767)
    x = _inputs((4, 6, 3))
    channels = x.shape[axis]
    scales = torch.rand(channels, generator=torch.Generator().manual_seed(1)) * 0.05 + 0.01
    zps = torch.arange(channels, dtype=torch.int64) - 1
    want = qd.quantize_per_channel(x, scales, zps, axis % 3, qmin, qmax, dtype)
    got = np.empty(x.shape, want.numpy().dtype)
    K["quantized_decomposed::quantize_per_channel.out"](x.numpy(), scales.numpy(), zps.numpy(),
                                                         axis % 3, qmin, qmax, None, got)
    np.testing.assert_array_equal(got, want.numpy())
    for zero_points in (zps, zps.to(torch.int32), None):
        back = qd.dequantize_per_channel(want, scales, zero_points, axis % 3, qmin, qmax, dtype)
        out = np.empty(x.shape, np.float32)
        K["quantized_decomposed::dequantize_per_channel.out"](
            want.numpy(), scales.numpy(), None if zero_points is None else zero_points.numpy(),
            axis % 3, qmin, qmax, None, None, out)
        np.testing.assert_array_equal(out, back.numpy())


@pytest.mark.parametrize("shape,block", [((8, 64), (1, 32)), ((16, 8, 3, 3), (1, 4, 1, 1)),
                                          ((6, 12), (6, 12)), ((6, 12), (2, 3))])
def test_per_block(shape, block):
    from torchao.quantization.quant_primitives import choose_qparams_affine, MappingType

    x = _inputs(shape)
    scale, zp = choose_qparams_affine(x, MappingType.SYMMETRIC, block, torch.int8, -7, 7)
    q = torch.ops.torchao.quantize_affine(x, block, scale, zp, torch.int8, -7, 7)
    got_q = np.empty(shape, np.int8)
    K["torchao::quantize_affine.out"](x.numpy(), block, scale.numpy(), zp.numpy(), None, -7, 7, got_q)
    np.testing.assert_array_equal(got_q, q.numpy())
    want = torch.ops.torchao.dequantize_affine(q, block, scale, zp, torch.int8, -7, 7)
    out = np.empty(shape, np.float32)
    K["torchao::dequantize_affine.out"](q.numpy(), block, scale.numpy(), zp.numpy(), None, -7, 7,
                                        None, out)
    np.testing.assert_array_equal(out, want.numpy())


def test_out_overloads_compute_the_functional_ops():
    x = _inputs((3, 4))
    out = torch.empty(3, 4, dtype=torch.uint8)
    qd.quantize_per_tensor.out(x, 0.1, 128, 0, 255, torch.uint8, out=out)
    torch.testing.assert_close(out, qd.quantize_per_tensor(x, 0.1, 128, 0, 255, torch.uint8))
