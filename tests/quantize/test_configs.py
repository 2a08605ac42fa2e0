"""Quantizer configuration: per-module configs, discards, block sizes, QAT, and bad inputs."""

import warnings

import pytest
import torch
from torch import nn

from opforge.examples.zoo import ZOO
from opforge.quantize import QuantConfig, Quantizer, QuantizeError, module_name, module_type, quantize

from tests.quantize.quantize_support import calibration_samples

DQ_CHANNEL = torch.ops.quantized_decomposed.dequantize_per_channel.default
DQ_AFFINE = (torch.ops.torchao.dequantize_affine.default, torch.ops.torchao.dequantize_affine)


def _run(name, quantizer, **kw):
    model, inputs = ZOO[name]()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return quantize(model, inputs, quantizer=quantizer,
                        calibration=calibration_samples(inputs, 2), **kw)


def _weight_dequantize(gm, op_name):
    node = next(n for n in gm.graph.nodes if n.name == op_name)
    return node.args[1]


def test_submodule_config_by_type_and_by_name():
    quantizer = Quantizer("8a8w")
    quantizer.set_submodule_qconfig_list([
        (module_name("4"), QuantConfig("16a16w")),     # the last linear, by name
        (module_type(nn.GELU), QuantConfig("16a8w")),  # by type
    ])
    result = _run("mlp", quantizer)
    decisions = {d.node: d for d in result.report.decisions}
    assert decisions["linear"].scheme == "8a8w" and "default config" in decisions["linear"].detail
    assert decisions["linear_2"].scheme == "16a16w" and "module_name('4')" in decisions["linear_2"].detail
    assert decisions["gelu"].scheme == "16a8w" and "module_type(GELU)" in decisions["gelu"].detail
    w = _weight_dequantize(result.model, "linear_2")
    assert w.target == DQ_CHANNEL and w.args[-1] == torch.int16  # 16-bit weights


def test_per_tensor_weights_when_per_channel_is_off():
    result = _run("mlp", Quantizer("8a8w", per_channel_linear=False))
    w = _weight_dequantize(result.model, "linear")
    assert w.target == torch.ops.quantized_decomposed.dequantize_per_tensor.default
    assert "weights per tensor" in result.report.decision("linear").detail


def test_symmetric_activations_and_observers():
    result = _run("mlp", Quantizer("8a8w", act_symmetric=True, act_observer="histogram"))
    qs = [n for n in result.model.graph.nodes
          if n.target == torch.ops.quantized_decomposed.quantize_per_tensor.default]
    assert qs and all(n.args[2] == 0 and n.args[-1] == torch.int8 for n in qs)


def test_discarded_nodes_and_ops_stay_float():
    quantizer = Quantizer("8a8w")
    quantizer.add_discard_nodes(["linear_1"])
    quantizer.add_discard_ops([torch.ops.aten.gelu.default, "aten::relu"])
    result = _run("mlp", quantizer)
    for node in ("linear_1", "gelu", "relu"):
        decision = result.report.decision(node)
        assert decision.scheme == "float" and "discarded" in decision.detail
    w = _weight_dequantize(result.model, "linear_1")
    assert w.op == "get_attr" and w.meta.get("val", torch.empty(0)).dtype != torch.int8
    assert result.report.decision("linear").scheme == "8a8w"
    assert result.report.sqnr_db > 25


def test_block_size_map_and_default_blocks():
    quantizer = Quantizer("16a4w_block")
    quantizer.set_block_size_map({"linear_1": (1, 16)})
    result = _run("mlp", quantizer)
    w = _weight_dequantize(result.model, "linear_1")
    assert w.target in DQ_AFFINE and list(w.args[1]) == [1, 16]
    assert "block-size map" in result.report.decision("linear_1").detail
    w0 = _weight_dequantize(result.model, "linear")
    assert w0.target in DQ_AFFINE and list(w0.args[1]) == [1, 32]  # 64 inputs: blocks of 32


def test_block_size_map_on_a_conv_of_another_scheme():
    # priority: the block-size map wins over the node's (per-channel) config
    quantizer = Quantizer("16a8w")
    quantizer.set_block_size_map({"conv2d_1": (1, 4, 1, 1)})
    result = _run("cnn", quantizer)
    w = _weight_dequantize(result.model, "conv2d_1")
    assert w.target in DQ_AFFINE and list(w.args[1]) == [1, 4, 1, 1]
    assert result.report.decision("conv2d").scheme == "16a8w"


def test_block_size_that_does_not_divide_the_channels():
    quantizer = Quantizer("16a4w_block")
    quantizer.set_block_size_map({"conv2d_1": (1, 3, 1, 1)})
    with pytest.raises(QuantizeError, match=r"node 'conv2d_1' — block size \(1, 3, 1, 1\) does not "
                                            r"divide its weight of shape \(16, 8, 3, 3\)"):
        _run("cnn", quantizer)


def test_block_size_map_naming_a_missing_node():
    quantizer = Quantizer("16a4w_block")
    quantizer.set_block_size_map({"conv9": (1, 4, 1, 1)})
    with pytest.raises(QuantizeError, match=r"node 'conv9' — not in the graph — valid: .*\(conv2d, conv2d_1, linear\)"):
        _run("cnn", quantizer)


def test_unknown_scheme_and_observer():
    with pytest.raises(QuantizeError, match="scheme — unknown — valid: 8a8w, 16a16w, 16a8w, 16a4w, "
                                            "16a4w_block, 8a4w"):
        Quantizer("4a4w")
    with pytest.raises(QuantizeError, match="observer — unknown"):
        QuantConfig("8a8w", act_observer="percentile")


def test_calibration_data_of_the_wrong_shape():
    model, inputs = ZOO["mlp"]()
    with pytest.raises(QuantizeError, match=r"sample 1, input 0 — shape \(4, 32\) torch.float32 — "
                                            r"valid: \(4, 64\) torch.float32"):
        quantize(model, inputs, "8a8w", calibration=[inputs, (torch.randn(4, 32),)])
    with pytest.raises(QuantizeError, match="sample 0 — 2 inputs — valid: 1"):
        quantize(model, inputs, "8a8w", calibration=[(inputs[0], inputs[0])])


class _LogLinear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(torch.log(x))


@pytest.mark.parametrize("value, found", [(float("nan"), "NaN"), (float("inf"), "an infinity")])
def test_a_non_finite_calibration_sample_is_a_quantize_error(value, found):
    inputs = (torch.rand(2, 4) + 0.5,)
    bad = inputs[0].clone()
    bad[1, 2] = value
    with pytest.raises(QuantizeError, match=rf"sample 1, input 0 — holds {found} — valid: finite "
                                            r"values .* — fix: clean the calibration data"):
        quantize(_LogLinear(), inputs, "8a8w", calibration=[inputs, (bad,)])


def test_a_nan_the_model_makes_names_the_observed_node():
    inputs = (torch.rand(2, 4) + 0.5,)
    with pytest.raises(QuantizeError, match=r"observer '.*' on the output of node 'log' — saw the "
                                            r"range \[nan, nan\] — valid: finite values"):
        quantize(_LogLinear(), inputs, "8a8w", calibration=[(-torch.ones(2, 4),)])


def test_no_calibration_warns_and_uses_the_example_inputs():
    model, inputs = ZOO["mlp"]()
    with pytest.warns(UserWarning, match="no calibration data; the example inputs calibrate"):
        result = quantize(model, inputs, "8a8w")
    assert result.report.calibration_samples == 1


def _small_conv_model(batch_norm=True):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1),
                          nn.BatchNorm2d(8) if batch_norm else nn.Identity(), nn.ReLU(),
                          nn.Flatten(), nn.Linear(8 * 8 * 8, 4))
    data = [torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(i)) for i in range(4)]
    teacher = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 4)).requires_grad_(False)
    return model, data, teacher


def _train(data, teacher, epochs=3):
    def train(prepared):
        optimizer = torch.optim.SGD(prepared.parameters(), lr=0.01)
        losses = []
        for _ in range(epochs):
            for x in data:
                optimizer.zero_grad()
                loss = torch.nn.functional.mse_loss(prepared(x), teacher(x))
                loss.backward()
                optimizer.step()
                losses.append(float(loss))
        train.losses = losses
    return train


@pytest.mark.slow  # torchao folds conv + batch norm by exporting ~100 patterns: ~15 s
def test_qat_prepare_train_convert():
    from torchao.quantization.pt2e import disable_observer, move_exported_model_to_eval

    from opforge.quantize import convert, prepare_qat

    model, data, teacher = _small_conv_model()
    prepared = prepare_qat(model, (data[0],), Quantizer("8a8w", is_qat=True))
    train = _train(data, teacher)
    train(prepared)
    assert train.losses[-1] < train.losses[0]
    move_exported_model_to_eval(prepared)
    prepared.apply(disable_observer)  # freeze the learned ranges
    with torch.no_grad():
        simulated = [prepared(x) for x in data]  # fake quantization, as trained
    converted = convert(prepared)
    # the converted Q/DQ graph computes exactly what training simulated
    with torch.no_grad():
        for x, want in zip(data, simulated):
            torch.testing.assert_close(converted(x), want, rtol=0, atol=0)
    targets = {n.target for n in converted.graph.nodes}
    assert torch.ops.quantized_decomposed.quantize_per_tensor.default in targets
    assert not any("batch_norm" in str(t) for t in targets)  # folded into the conv


def test_qat_through_quantize_reports_against_the_trained_float_model():
    # without batch norm: torchao's conv-bn QAT pattern matching costs ~10 s per model
    model, data, teacher = _small_conv_model(batch_norm=False)
    result = quantize(model, (data[0],), quantizer=Quantizer("8a8w", is_qat=True),
                      calibration=[(x,) for x in data], train=_train(data, teacher))
    assert result.report.calibration_samples == 4
    # reference: the trained graph with fake quantization off. Three epochs leave the
    # moving-average ranges close to the first batches' (they clip the others), which
    # costs accuracy that longer training would recover: measured ~20 dB
    assert result.report.sqnr_db > 10
    program = result.export()
    assert "quantized_decomposed::quantize_per_tensor.out" in {
        o.key for o in program.method("forward").operators}
