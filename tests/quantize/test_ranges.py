"""Each scheme's integer ranges and axes, checked directly (not through output error): every
quantize/dequantize of the converted graph and of the exported program carries the
scheme's documented quant_min/quant_max and dtype (opforge/quantize/schemes.py's table),
per-channel weights are quantized along the output-channel axis with zero points 0, and
the stored integer weights lie inside the range and reach its symmetric bound.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from opforge.examples.zoo import ZOO
from opforge.program import IntValue, KernelCall

pytest.importorskip("torchao")

# scheme → ((activation dtype, qmin, qmax), (weight dtype, qmin, qmax)), from the docs' table
RANGES = {
    "8a8w": ((torch.uint8, 0, 255), (torch.int8, -127, 127)),
    "16a16w": ((torch.int32, 0, 65535), (torch.int16, -32767, 32767)),
    "16a8w": ((torch.int32, 0, 65535), (torch.int8, -127, 127)),
    "16a4w": ((torch.int32, 0, 65535), (torch.int8, -7, 7)),
    "16a4w_block": ((torch.int32, 0, 65535), (torch.int8, -7, 7)),
    "8a4w": ((torch.uint8, 0, 255), (torch.int8, -7, 7)),
}


def _quantized(name, scheme, **options):
    from opforge.quantize import Quantizer, quantize

    torch.manual_seed(0)
    model, inputs = ZOO[name]()
    gen = torch.Generator().manual_seed(1)
    calibration = [tuple(torch.randn(t.shape, generator=gen) for t in inputs) for _ in range(3)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return quantize(model.eval(), inputs, scheme, calibration=calibration,
                        quantizer=Quantizer(scheme, **options) if options else None)


def _attr(gm, node):
    owner, _, leaf = node.target.rpartition(".")
    return getattr(gm.get_submodule(owner) if owner else gm, leaf)


@pytest.mark.parametrize("scheme", sorted(RANGES))
@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_ranges_and_axes_per_scheme(name, scheme):
    qmodel = _quantized(name, scheme)
    gm = qmodel.model
    (adt, amin, amax), (wdt, wmin, wmax) = RANGES[scheme]
    per_tensor = per_channel = block = 0
    for node in gm.graph.nodes:
        target = str(node.target)
        if node.op != "call_function" or "quant" not in target:
            continue
        if target.endswith("quantize_per_tensor.default"):  # quantize and dequantize
            assert tuple(node.args[3:6]) == (amin, amax, adt), (node.name, node.args)
            per_tensor += 1
        elif "dequantize_per_channel" in target:
            weights, scales, zero_points, axis, qmin, qmax, dtype = node.args[:7]
            assert (qmin, qmax, dtype) == (wmin, wmax, wdt), (node.name, node.args)
            w = _attr(gm, weights)
            consumer = next(iter(node.users))
            transposed = "conv_transpose" in str(consumer.target)
            assert axis == (1 if transposed else 0), (node.name, axis)  # output channels
            assert _attr(gm, scales).numel() == w.shape[axis]
            assert int(_attr(gm, zero_points).abs().max()) == 0  # symmetric
            assert w.dtype == wdt and int(w.min()) >= wmin and int(w.max()) <= wmax
            assert int(w.abs().max()) == wmax  # each channel's absmax maps to the bound
            per_channel += 1
        elif target.endswith("dequantize_affine"):
            weights, block_size, scales, zero_points, dtype, qmin, qmax = node.args[:7]
            assert (qmin, qmax, dtype) == (wmin, wmax, wdt), (node.name, node.args)
            w = _attr(gm, weights)
            assert int(w.min()) >= wmin and int(w.max()) <= wmax
            assert block_size[0] == 1 and w.shape[1] % block_size[1] == 0
            block += 1
    assert per_tensor >= 4 and per_channel + block >= 2, (per_tensor, per_channel, block)
    if scheme == "16a4w_block":
        assert block >= 1
    # the exported program keeps the same ranges in its quantize/dequantize instructions
    program = qmodel.export()
    method = program.method("forward")
    seen = 0
    for instruction in method.instructions:
        if type(instruction) is not KernelCall:
            continue
        key = method.operators[instruction.op].key
        if "quantize_per_tensor" in key:
            qmin, qmax = (method.values[instruction.args[i]] for i in (3, 4))
            assert isinstance(qmin, IntValue) and (qmin.value, qmax.value) == (amin, amax), key
            seen += 1
    assert seen >= 2


# act_symmetric: signed storage with zero point 0 (docs/quantization.md's table)
SYMMETRIC = {"8a8w": (torch.int8, -128, 127), "16a16w": (torch.int32, -32768, 32767),
             "16a4w": (torch.int32, -32768, 32767)}


@pytest.mark.parametrize("scheme", sorted(SYMMETRIC))
@pytest.mark.parametrize("name", ["mlp"])
def test_symmetric_activation_ranges(name, scheme):
    gm = _quantized(name, scheme, act_symmetric=True).model
    dtype, qmin, qmax = SYMMETRIC[scheme]
    seen = 0
    for node in gm.graph.nodes:
        if node.op == "call_function" and str(node.target).endswith("quantize_per_tensor.default"):
            zero_point = node.args[2]
            assert zero_point == 0 and tuple(node.args[3:6]) == (qmin, qmax, dtype), \
                (node.name, node.args)
            seen += 1
    assert seen >= 4
