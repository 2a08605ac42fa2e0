"""Quantizing leaves no run's state behind (issue 46).

``quantize`` runs the float model (the reference), the observed graph (calibration) and the
converted graph (accuracy) on every sample, ``evaluate`` runs both again, QAT's ``train``
runs the prepared graph. A model with state (a decoder's KV cache written by
``index_copy_``, a counter and a running sum written by ``add_``) must come back with its
buffers bitwise as they were, the quantized model must hold that same state as buffers of
its own, and the saved program must store it as its initial state.

Models: ``TinyDecoder`` (1 layer, 16 cache slots; its caches start at zeros) calibrated on a
prompt and then its next decoding step, and ``Counted`` (a linear plus a running sum of its
inputs that the output reads, and a call counter; they start at non-zero values, so "the
initial state" cannot be mistaken for zeros).

"First step": one call from the initial state whose output reads that state: a decode
step at position 3 without a prefill attends to cache slots 0..2 (zeros at first; a
calibration prompt's keys if the program kept them), ``Counted`` adds its running sum.
The program, saved to a file and loaded by the lean runtime, must give the logits of the
converted graph run from the model's initial state, set here by the test itself. Lean
and eager run the same quantize/dequantize ops; the float ops between them may differ by
an ulp, which moves a value across a rounding boundary by one quantization step
(tests/quantize/test_programs.py), hence a tolerance of 4 output steps; a program that
started from another state differs by far more (the planted-bug check in the report).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from torch import nn

from opforge.examples.decoder import TinyDecoder
from opforge.quantize import Quantizer, quantize
from opforge.quantize.dynamic import quantize_dynamic
from opforge.quantize.memory import graph_copy
from opforge.quantize.state import mutated_buffers
from opforge.runtime import load

from tests.quantize.quantize_support import output_scale

SMALL = dict(vocab=64, dim=32, heads=4, kv_heads=2, hidden=64, layers=1, max_len=16, seed=0)
SEQ = torch.export.Dim("seq", min=1, max=16)
DYNAMIC = ({0: SEQ}, {0: SEQ})
PROMPT = (torch.tensor([3, 9, 4, 1]), torch.arange(4))
NEXT = (torch.tensor([7]), torch.tensor([4]))  # the prompt's next decoding step
FIRST_STEP = (torch.tensor([11]), torch.tensor([3]))  # reads slots 0..2 of the initial cache
CACHES = ["blocks.0.attn.k_cache", "blocks.0.attn.v_cache"]


class Counted(nn.Module):
    """``linear(x) + total`` where ``total`` sums every input so far; ``calls`` counts."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(8, 8)
        self.register_buffer("calls", torch.tensor(5, dtype=torch.int64))
        self.register_buffer("total", torch.linspace(-1.0, 1.0, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.add_(1)
        self.total.add_(x.sum(0))
        return self.linear(x) + self.total


def _counted_samples(count: int, seed: int) -> list[tuple]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(4, 8, generator=g),) for _ in range(count)]


def _buffers(module: nn.Module) -> dict[str, torch.Tensor]:
    return {name: b.detach().clone() for name, b in module.named_buffers()}


def _assert_buffers(module: nn.Module, want: dict[str, torch.Tensor]) -> None:
    got = dict(module.named_buffers())
    for name, value in want.items():
        assert got[name].dtype == value.dtype and torch.equal(got[name], value), name


def _quietly(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kwargs)


def _program_from_file(model_or_result, tmp_path, **kwargs):
    from opforge.export import export
    from opforge.program import save

    if hasattr(model_or_result, "export"):
        program = _quietly(model_or_result.export)
    else:
        program = _quietly(export, model_or_result, PROMPT, dynamic_shapes=DYNAMIC, **kwargs)
    path = tmp_path / "model.opf"
    save(program, path)
    return load(str(path))


def _first_step_from(graph: nn.Module, state: dict[str, torch.Tensor], inputs: tuple):
    """``graph``'s output on ``inputs`` from ``state``, run on a copy (``graph`` unchanged)."""
    import copy

    fresh = graph_copy(graph) if isinstance(graph, torch.fx.GraphModule) else copy.deepcopy(graph)
    with torch.no_grad():
        for name, value in state.items():
            fresh.get_buffer(name).copy_(value)
        return fresh(*inputs).numpy()


def _check_program(loaded, initial: dict, names: list[str], expected: np.ndarray,
                   inputs: tuple, atol: float) -> None:
    assert sorted(loaded.state_names) == sorted(names)
    for name in names:
        np.testing.assert_array_equal(loaded.read_state(name), initial[name].numpy())
    (got,) = loaded.method("forward")(*[x.numpy() for x in inputs])
    np.testing.assert_allclose(got, expected, rtol=0, atol=atol)


def test_mutated_buffers_are_the_buffers_the_graph_writes():
    decoder = torch.export.export(TinyDecoder(**SMALL).eval(), PROMPT).module()
    assert mutated_buffers(decoder) == CACHES  # not the rotary tables nor the slots
    counted = torch.export.export(Counted().eval(), _counted_samples(1, 0)[0]).module()
    assert mutated_buffers(counted) == ["calls", "total"]


@pytest.mark.parametrize("scheme", ["16a8w", "w8"])
def test_ptq_leaves_the_decoder_s_cache_as_it_was(scheme, tmp_path):
    model = TinyDecoder(**SMALL).eval()
    initial = _buffers(model)
    result = _quietly(quantize, model, PROMPT, scheme, calibration=[PROMPT, NEXT],
                      dynamic_shapes=DYNAMIC)
    _assert_buffers(model, initial)  # every buffer, bitwise
    _assert_buffers(result.model, {n: initial[n] for n in CACHES})
    for name in CACHES:  # its own state: running it writes no cache of the float model
        assert result.model.get_buffer(name).data_ptr() != model.get_buffer(name).data_ptr()
    with torch.no_grad():
        graph_copy(result.model, share_state=True)(*PROMPT)  # writes result.model's caches
        result.model.get_buffer(CACHES[0]).zero_()
        result.model.get_buffer(CACHES[1]).zero_()
    _assert_buffers(model, initial)
    result.evaluate([(torch.tensor([5, 2, 8]), torch.arange(3)), (torch.tensor([6]),
                                                                   torch.tensor([3]))])
    _assert_buffers(model, initial)
    _assert_buffers(result.model, {n: initial[n] for n in CACHES})
    expected = _first_step_from(result.model, {n: initial[n] for n in CACHES}, FIRST_STEP)
    loaded = _program_from_file(result, tmp_path)
    _check_program(loaded, initial, CACHES, expected, FIRST_STEP,
                   atol=4 * output_scale(result.model) if scheme != "w8" else 1e-4)


def test_every_pass_starts_from_the_model_s_state(tmp_path):
    model = Counted().eval()
    initial = _buffers(model)
    calibration = _counted_samples(3, 1)
    result = _quietly(quantize, model, calibration[0], "8a8w", calibration=calibration)
    _assert_buffers(model, initial)
    _assert_buffers(result.model, initial)
    # the reference and the quantized model ran from the same state: their sums agree
    assert result.report.sqnr_db > 30
    # evaluate's passes start from that state too: on the same samples, the same numbers
    assert result.evaluate(calibration) == result.report.accuracy
    _assert_buffers(model, initial)
    _assert_buffers(result.model, initial)
    first = _counted_samples(1, 2)[0]
    expected = _first_step_from(result.model, initial, first)
    loaded = _program_from_file(result, tmp_path)
    _check_program(loaded, initial, ["calls", "total"], expected, first,
                   atol=4 * output_scale(result.model))


def test_graph_copy_gives_a_written_integer_buffer_its_own_copy():
    model = Counted().eval()
    graph = torch.export.export(model, _counted_samples(1, 0)[0]).module()
    copy = graph_copy(graph)
    with torch.no_grad():
        copy(*_counted_samples(1, 0)[0])
    assert int(graph.calls) == 5 and int(copy.calls) == 6
    assert copy.linear.weight is graph.linear.weight  # the weights are still shared


def test_qat_leaves_the_run_state_as_it_was(tmp_path):
    model = Counted()
    initial = _buffers(model)
    samples = _counted_samples(3, 1)

    def train(prepared):
        optimizer = torch.optim.SGD(prepared.parameters(), lr=1e-3)
        for (x,) in samples:
            loss = prepared(x).square().mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

    result = _quietly(quantize, model, samples[0], quantizer=Quantizer("8a8w", is_qat=True),
                      calibration=samples, train=train)
    _assert_buffers(model, initial)
    _assert_buffers(result.model, initial)
    expected = _first_step_from(result.model, initial, samples[0])
    loaded = _program_from_file(result, tmp_path)
    _check_program(loaded, initial, ["calls", "total"], expected, samples[0],
                   atol=4 * output_scale(result.model))


@pytest.mark.parametrize("inplace", [False, True])
def test_dynamic_schemes_keep_the_model_s_cache(inplace, tmp_path):
    model = TinyDecoder(**SMALL).eval()
    initial = _buffers(model)
    swapped = quantize_dynamic(model, "8da4w", inplace=inplace)
    if not inplace:
        _assert_buffers(model, initial)
    _assert_buffers(swapped, {n: initial[n] for n in CACHES})
    with torch.no_grad():
        expected = _first_step_from(swapped, {n: initial[n] for n in CACHES}, FIRST_STEP)
    loaded = _program_from_file(swapped, tmp_path)
    _assert_buffers(swapped, {n: initial[n] for n in CACHES})  # export ran nothing
    # dynamic activations: an ulp in a block's max moves its scale, not just one value
    _check_program(loaded, initial, CACHES, expected, FIRST_STEP,
                   atol=0.02 * float(np.abs(expected).max()))


@pytest.mark.slow  # the CLI's two-layer decoder: quantize, evaluate, export (~10 s)
def test_the_command_line_program_starts_from_zeros(tmp_path):
    from opforge.cli import cli

    for name, (tokens, positions) in {"p": PROMPT, "s": NEXT}.items():
        np.save(tmp_path / f"{name}_t.npy", tokens.numpy())
        np.save(tmp_path / f"{name}_p.npy", positions.numpy())
    listing = tmp_path / "samples.txt"
    listing.write_text("p_t.npy p_p.npy\ns_t.npy s_p.npy\n")
    out = tmp_path / "decoder.opf"
    result = CliRunner().invoke(cli, [
        "quantize", "opforge.examples.decoder:tiny_decoder", "--scheme", "16a8w",
        "--calibration", str(listing), "--eval", str(listing), "-o", str(out), "-q",
        "--dim", "0:0:seq:1:48", "--dim", "1:0:seq:1:48"])
    assert result.exit_code == 0, result.output
    loaded = load(str(out))
    assert loaded.state_names
    for name in loaded.state_names:
        assert not loaded.read_state(name).any(), name


def test_convert_runs_no_in_place_op_of_the_graph():
    # torchao's constant folder evaluates every node that reads constants only: a counter's
    # ``add_(1)`` is one, and running it at convert time wrote the model's state
    from opforge.quantize import convert, prepare

    model = Counted().eval()
    initial = _buffers(model)
    (x,) = _counted_samples(1, 0)[0]
    prepared = prepare(model, (x,), Quantizer("8a8w"))
    with torch.no_grad():
        prepared(x)  # calibrated (one call: calls 6)
    written = _buffers(model)
    assert int(written["calls"]) == int(initial["calls"]) + 1
    convert(prepared)
    _assert_buffers(model, written)
