"""Weight-only schemes (``w8``, ``w8_block``, ``w4``): integer weights, float activations, no
calibration, on the bundled ``TinyDecoder`` and on every runtime.

What is checked and why:

* the weights are what the scheme says: ``q = clamp(round(w / s))`` with ``s`` = max |w| of
  the row (``w8``) or of each group of ``g`` along K (``w8_block``, ``w4``) over the
  scheme's largest integer (127 or 7): scales [N, K / g], every linear (the output
  projection too) and the embedding table (int8 per row, also under ``w4``) quantized,
  nothing else;
* the program computes the model with those weights: its logits against a float64 run of
  the float model whose parameters are the dequantized weights. Tolerance: the program runs
  float32 activations through a layer, ~100 ops of relative rounding 6e-8 each that this
  random model amplifies ~10 dB (docs/quantization.md, "Decoders"): ~2e-5 of the largest
  logit; measured 2-3e-6; 1e-4 leaves a margin, while the float weights instead of the
  dequantized ones miss by 1e-2 (w8) to 3e-1 (w4) of it (``test_the_reference_tells_the_weights_apart``);
* greedy tokens are the same on the lean runtime, ATen mode, the cpu backend (whose
  linears and embedding run on ``int_matmul`` / ``int_embedding``, reading the integers)
  and the native runtime: the same dequantized weights, sums in another order;
* 4-bit weights are packed two per byte in the file, with no zero points beside them.
"""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest
import torch

from opforge.examples.decoder import TinyDecoder
from opforge.quantize import QuantConfig, QuantizeError, quantize
from opforge.runtime import load
from opforge.runtime.generate import Generator

# every K (dim 128, hidden 256) divisible by 32, 64 and 128
CONFIG = dict(vocab=64, dim=128, heads=4, kv_heads=2, hidden=256, layers=1, max_len=32, seed=0)
PROMPTS = [[3, 14, 15, 9, 2, 6], [7, 1, 8, 2, 8, 1, 8, 2, 8, 4, 5, 9]]
LINEARS = 7 + 1  # q, k, v, o, gate, up, down, and the output projection
QMAX = {"w8": 127, "w8_block": 127, "w4": 7}

_dq_channel = torch.ops.quantized_decomposed.dequantize_per_channel.default


def _model() -> TinyDecoder:
    return TinyDecoder(**CONFIG).eval()


_CACHE: dict = {}


def weight_only(scheme: str, group_size: int | None = None):
    """The quantized model (dynamic sequence, no calibration) and its lean and cpu programs."""
    key = (scheme, group_size)
    if key not in _CACHE:
        seq = torch.export.Dim("seq", min=1, max=CONFIG["max_len"])
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no "no calibration data" warning
            result = quantize(_model(), (torch.tensor([1, 2, 3]), torch.arange(3)),
                              QuantConfig(scheme, group_size=group_size),
                              dynamic_shapes=({0: seq}, {0: seq}))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _CACHE[key] = (result, result.export())
    return _CACHE[key]


def _value(gm: torch.fx.GraphModule, node):
    """Evaluate a constant subgraph (a dequantize of constants) of ``gm``."""
    if not isinstance(node, torch.fx.Node):
        return node
    if node.op == "get_attr":
        value = gm
        for part in node.target.split("."):
            value = getattr(value, part)
        return value
    return node.target(*[_value(gm, a) for a in node.args])


def dequantized_weights(gm: torch.fx.GraphModule) -> dict[str, tuple]:
    """module path -> (dequantize node, dequantized float32 weight) for every quantized
    linear and embedding of the converted graph."""
    out = {}
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target not in (torch.ops.aten.linear.default,
                                                              torch.ops.aten.embedding.default):
            continue
        weight = node.args[1] if node.target == torch.ops.aten.linear.default else node.args[0]
        if weight.op == "call_function" and "dequantize" in str(weight.target):
            path = list(node.meta["nn_module_stack"].values())[-1][0]
            out[path] = (weight, _value(gm, weight))
    return out


def float64_reference(result, weights_from_program: bool = True) -> list[np.ndarray]:
    """Prefill logits of PROMPTS from the float model run in float64, its weights replaced by
    the program's dequantized ones (or kept float: the reference must tell them apart)."""
    model = copy.deepcopy(_model()).double()
    if weights_from_program:
        for path, (_, w) in dequantized_weights(result.model).items():
            model.get_submodule(path).weight.data = w.double()
    with torch.no_grad():
        return [model(torch.tensor(p), torch.arange(len(p))).numpy() for p in PROMPTS]


def _logits(loaded) -> list[np.ndarray]:
    out = []
    for p in PROMPTS:
        loaded.reset_state()
        out.append(np.asarray(loaded.method("forward")(np.array(p, np.int64),
                                                       np.arange(len(p), dtype=np.int64))[0]))
    return out


def _worst(got: list[np.ndarray], want: list[np.ndarray]) -> float:
    """Largest difference relative to the largest reference logit."""
    return max(float(np.abs(g - w).max() / np.abs(w).max()) for g, w in zip(got, want))


@pytest.mark.parametrize("scheme", ["w8", "w8_block", "w4"])
def test_weights_are_the_schemes_integers_and_nothing_else_is_quantized(scheme):
    result, _ = weight_only(scheme)
    report = result.report
    assert not any("quantize_per_tensor" in k for k in report.qdq_ops)  # activations float
    quantized = {d.node: d for d in report.decisions if d.scheme == scheme}
    assert sum(d.op == "aten::linear" for d in quantized.values()) == LINEARS
    assert [d.detail for d in quantized.values() if d.op == "aten::embedding"] == [
        "table per row (8-bit), table as weights (default config)"]
    assert set(d.op for d in quantized.values()) == {"aten::linear", "aten::embedding"}
    float_model = _model()
    weights = dequantized_weights(result.model)
    assert len(weights) == LINEARS + 1
    for path, (node, deq) in weights.items():
        w = float_model.get_submodule(path).weight.detach()
        qmax = 127 if path == "embed" else QMAX[scheme]
        group = w.shape[1] if path == "embed" or scheme == "w8" else 32
        amax = w.reshape(w.shape[0], -1, group).abs().amax(-1)
        scale = (amax / qmax).repeat_interleave(group, 1)
        q = torch.clamp(torch.round(w / scale), -qmax, qmax)
        # the dequantized weight is q * s: exact up to a last-bit rounding tie (<0.1%)
        assert torch.mean((deq != q * scale).float()) < 1e-3, path
        torch.testing.assert_close(deq, q * scale, rtol=0, atol=float(scale.max()) * 1.001)
        if group != w.shape[1]:
            assert "dequantize_affine" in str(node.target)
            assert tuple(node.args[1]) == (1, group)
        else:
            assert node.target == _dq_channel


@pytest.mark.parametrize("scheme", ["w8", "w8_block", "w4"])
def test_lean_program_matches_a_float64_run_of_the_dequantized_weights(scheme):
    result, program = weight_only(scheme)
    want = float64_reference(result)
    assert _worst(_logits(load(program)), want) < 1e-4  # module docstring: why 1e-4


def test_the_reference_tells_the_weights_apart():
    """The 1e-4 above fails with the float weights in the reference (the check can fail)."""
    for scheme in ("w8", "w4"):
        result, program = weight_only(scheme)
        assert _worst(_logits(load(program)), float64_reference(result, False)) > 5e-3


@pytest.mark.parametrize("scheme", ["w8", "w4"])
def test_greedy_tokens_are_the_same_on_every_runtime(scheme):
    from opforge.backends.cpu import blob, engine

    result, program = weight_only(scheme)
    runs = {"lean": load(program), "aten": load(program, mode="aten")}
    if not engine.missing():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cpu = result.export(backends=["cpu"])
        kinds: dict[str, list] = {}
        for d in cpu.delegates:
            plan, _ = blob.parse(cpu.segments[d.segment].data)
            for op in plan["ops"]:
                kinds.setdefault(op["kind"], []).append(op)
        # every linear on int_matmul (none folded to a float32 matmul: the 4 float matmuls
        # left are attention's), the table on int_embedding, with the scheme's bits
        bits = 4 if scheme == "w4" else 8
        assert [op["ia"][0] for op in kinds["int_matmul"]] == [bits] * LINEARS
        assert [op["ia"][0] for op in kinds["int_embedding"]] == [8]
        assert len(kinds["matmul"]) == 2 * CONFIG["layers"]
        runs["cpu"] = load(cpu)
    runs["native"] = load(program, executor="native")
    tokens = {name: list(Generator(loaded).generate(PROMPTS[0], 12).tokens)
              for name, loaded in runs.items()}
    assert all(t == tokens["lean"] for t in tokens.values()), tokens


def test_4bit_weights_are_packed_in_the_file():
    from opforge.program import PACKING_INT4, ConstantStorage, ScalarType, TensorValue, to_bytes

    _, w4 = weight_only("w4")
    _, w8 = weight_only("w8_block")
    method = w4.method("forward")
    packed = [v for v in method.values if isinstance(v, TensorValue)
              and isinstance(v.storage, ConstantStorage) and v.storage.packing == PACKING_INT4]
    assert len(packed) == LINEARS
    assert all(v.stored_nbytes == v.numel // 2 for v in packed)  # K·N/2 bytes per matrix
    int4_bytes = sum(v.numel for v in packed) // 2
    # the block-wise zero points (all 0) are left out: no int32 [N, K/g] beside the scales
    assert not any(isinstance(v, TensorValue) and isinstance(v.storage, ConstantStorage)
                   and v.dtype is ScalarType.INT32 and len(v.sizes) == 2 for v in method.values)
    # the same programs but for the matrices: 8-bit minus 4-bit is the 4 bits saved per weight
    assert len(to_bytes(w8)) - len(to_bytes(w4)) == pytest.approx(int4_bytes, rel=0.02)


@pytest.mark.parametrize("group", [32, 64, 128])
def test_group_sizes_give_their_scale_shapes(group):
    result, program = weight_only("w4", None if group == 32 else group)  # 32: the default
    scales = [_value(result.model, node.args[2]) for node, _ in dequantized_weights(result.model).values()
              if "dequantize_affine" in str(node.target)]
    shapes = {(s.shape[0], s.numel() // s.shape[0]) for s in scales}  # [N] when one group per row
    dim, hidden, vocab = CONFIG["dim"], CONFIG["hidden"], CONFIG["vocab"]
    kv = dim // CONFIG["heads"] * CONFIG["kv_heads"]
    assert shapes == {(dim, dim // group), (kv, dim // group), (hidden, dim // group),
                      (dim, hidden // group), (vocab, dim // group)}
    want = float64_reference(result)
    assert _worst(_logits(load(program)), want) < 1e-4


def test_bad_requests_are_refused_clearly():
    with pytest.raises(QuantizeError, match="scheme — unknown — valid: .*w8, w8_block, w4"):
        QuantConfig("w3")
    with pytest.raises(QuantizeError, match="group size — given for a per-channel scheme"):
        QuantConfig("w8", group_size=32)
    with pytest.raises(QuantizeError, match="group size — not a positive integer"):
        QuantConfig("w4", group_size=0)
    with pytest.raises(QuantizeError, match="group size — given with block_size"):
        QuantConfig("w4", group_size=32, block_size=(1, 32))
    with pytest.raises(QuantizeError, match=r"group size 48 does not divide the 128 input channels"):
        quantize(_model(), (torch.tensor([1, 2, 3]), torch.arange(3)),
                 QuantConfig("w4", group_size=48))


def test_cli_w4_with_a_group_size_needs_no_calibration(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from opforge.cli import cli
    from opforge.program import ConstantStorage, ScalarType, TensorValue
    from opforge.program import load as load_file

    from tests.quantize.quantize_support import decoder_factory

    decoder_factory(tmp_path, monkeypatch, "wo_decoder")
    out = tmp_path / "w4.opf"
    run = CliRunner().invoke(cli, ["quantize", "wo_decoder:make", "--scheme", "w4",
                                   "--group-size", "64", "-o", str(out), "--dim", "0:0:seq:1:16",
                                   "--dim", "1:0:seq:1:16"])
    assert run.exit_code == 0, run.output
    assert "warning" not in run.output  # no "no calibration data" warning: nothing to calibrate
    program = load_file(out)
    scales = {tuple(v.sizes) for v in program.method("forward").values
              if isinstance(v, TensorValue) and v.dtype is ScalarType.FLOAT32 and len(v.sizes) == 2
              and isinstance(v.storage, ConstantStorage)}
    # down's scales [64, 128/64]; groups of 32 would give [64, 4] and gate's / up's [128, 2]
    # (one group per row, K = 64, is stored [N])
    assert (64, 2) in scales and not {(64, 4), (128, 2)} & scales
    bad = CliRunner().invoke(cli, ["quantize", "wo_decoder:make", "--scheme", "w8",
                                   "--group-size", "64", "-o", str(tmp_path / "x.opf")])
    assert bad.exit_code != 0 and "group size — given for a per-channel scheme" in bad.output
