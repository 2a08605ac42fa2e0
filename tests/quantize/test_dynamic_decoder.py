"""A quantized decoder with a dynamic sequence: ``quantize(..., dynamic_shapes=...)`` keeps
the prompt length symbolic in the captured graph, calibration samples may have other
lengths, and the converted model exports as a prefill (any length) and a one-token decode
method. On the lean runtime and fully delegated to the cpu backend (one delegate per
method: the activations' quantize/dequantize take symbolic sizes), greedy decoding gives
the converted model's own tokens."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

from opforge.backends import get_backend
from opforge.examples.decoder import TinyDecoder, greedy_decode
from opforge.export import delegation_report, export
from opforge.program import PACKING_INT4, ConstantStorage, TensorValue
from opforge.quantize import QuantizeError, quantize
from opforge.quantize.packing import pack_4bit_weights
from opforge.runtime import load

SEQ = torch.export.Dim("seq", min=1, max=32)
DYNAMIC = ({0: SEQ}, {0: SEQ})
PROMPT = [4, 8, 15, 16]


@pytest.fixture(scope="module")
def quantized():
    model = TinyDecoder(vocab=64, dim=64, heads=4, kv_heads=2, hidden=128, layers=2,
                        max_len=32, seed=0).eval()
    example = (torch.tensor([1, 2, 3, 4]), torch.arange(4))
    samples = [example, (torch.tensor([5, 6]), torch.arange(2)),
               (torch.tensor([9, 3, 7, 1, 2, 8]), torch.arange(6))]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return quantize(model, example, "16a4w_block", calibration=samples,
                        dynamic_shapes=DYNAMIC)


def _program(result, backends):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = export(None, methods={
            "prefill": (copy.deepcopy(result.model), result.example_inputs, DYNAMIC),
            "decode": (copy.deepcopy(result.model), (torch.tensor([0]), torch.tensor([0])))},
            kernels="portable", backends=backends)
    return pack_4bit_weights(program)


def _eager_tokens(result):
    model = copy.deepcopy(result.model)  # its caches are state: a fresh copy
    with torch.no_grad():
        return greedy_decode(lambda t, p: model(t, p), PROMPT, 10)


def _tokens(program):
    loaded = load(program)
    prefill, decode = loaded.method("prefill"), loaded.method("decode")
    return greedy_decode(lambda t, p: (decode if len(t) == 1 else prefill)(
        t.numpy(), p.numpy())[0], PROMPT, 10)


def test_the_lean_runtime_decodes_the_converted_model_s_tokens(quantized):
    program = _program(quantized, [])
    packed = [v for m in program.methods for v in m.values if type(v) is TensorValue
              and type(v.storage) is ConstantStorage and v.storage.packing == PACKING_INT4]
    assert packed, "the 4-bit weights are packed two per byte"
    assert _tokens(program) == _eager_tokens(quantized)


@pytest.mark.skipif(get_backend("cpu").unavailable() is not None,
                    reason="the cpu backend cannot run here")
def test_prefill_and_decode_are_one_cpu_delegate_each_and_decode_the_same_tokens(quantized):
    program = _program(quantized, ["cpu"])
    report = delegation_report(program)
    for method in ("prefill", "decode"):
        assert len(report[method]["delegates"]) == 1, report[method]
        assert report[method]["rejected"] == [], report[method]["rejected"][:3]
    assert _tokens(program) == _eager_tokens(quantized)


def test_a_calibration_sample_differing_in_a_static_dim_is_refused():
    model = torch.nn.Sequential(torch.nn.Linear(8, 4)).eval()
    rows = torch.export.Dim("rows", min=1, max=16)
    with pytest.raises(QuantizeError, match=r"valid: \(\*, 8\) torch.float32"):
        quantize(model, (torch.randn(3, 8),), "8a8w", dynamic_shapes=({0: rows},),
                 calibration=[(torch.randn(5, 8),), (torch.randn(5, 7),)])
    result = quantize(model, (torch.randn(3, 8),), "8a8w", dynamic_shapes=({0: rows},),
                      calibration=[(torch.randn(5, 8),), (torch.randn(2, 8),)])
    assert result.dynamic_shapes is not None
