"""The one-call API: capture → annotate → prepare → calibrate (or train) → convert → report.

>>> from opforge.examples.zoo import ZOO                          # doctest: +SKIP
>>> model, inputs = ZOO["mlp"]()                                  # doctest: +SKIP
>>> result = quantize(model, inputs, "16a8w", calibration=[inputs])  # doctest: +SKIP
>>> result.report.sqnr_db > 40                                    # doctest: +SKIP
True
>>> program = result.export()                                     # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import torch
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e, prepare_qat_pt2e

from opforge.export import freed_memory
from opforge.quantize.integer_ops import run_on_integers
from opforge.quantize.memory import (
    fold_weight_quantizes, forget_cached_modules, graph_copy, near_users,
)
from opforge.quantize.quantizer import Quantizer
from opforge.quantize.report import Accuracy, QuantReport, accuracy, build_report
from opforge.quantize.schemes import QuantConfig, QuantizeError
from opforge.quantize.state import InitialState, mutated_buffers

__all__ = ["quantize", "prepare", "prepare_qat", "convert", "QuantizedModel", "capture"]


def capture(model: torch.nn.Module, example_inputs: tuple,
            dynamic_shapes: Any = None) -> torch.fx.GraphModule:
    """``torch.export.export(model, inputs, dynamic_shapes=...).module()``: the graph PT2E
    annotates; with ``dynamic_shapes`` (as ``torch.export`` takes them) it keeps those
    sizes symbolic, so the converted model exports with them too (a decoder's prefill at
    any prompt length and its one-token decode step from one quantized graph)."""
    return torch.export.export(model, tuple(example_inputs), dynamic_shapes=dynamic_shapes).module()


def _dynamic_dims(model: torch.nn.Module, example_inputs: tuple,
                  dynamic_shapes: Any) -> list[set[int]]:
    """For each input, the dims ``dynamic_shapes`` makes symbolic (a sequence aligned with
    the inputs, or a dict keyed by ``forward``'s parameter names; each entry None, a dict
    ``{dim: Dim}`` or a per-dim sequence)."""
    if dynamic_shapes is None:
        return [set() for _ in example_inputs]
    if isinstance(dynamic_shapes, dict):
        import inspect

        names = list(inspect.signature(model.forward).parameters)[:len(example_inputs)]
        dynamic_shapes = [dynamic_shapes.get(n) for n in names]
    out = []
    for entry in list(dynamic_shapes)[:len(example_inputs)]:
        if isinstance(entry, dict):
            out.append({int(k) for k, v in entry.items() if v is not None})
        elif isinstance(entry, (list, tuple)):
            out.append({k for k, v in enumerate(entry) if v is not None})
        else:
            out.append(set())
    return out + [set()] * (len(example_inputs) - len(out))


def _check_sample(sample: Sequence, example_inputs: tuple, index: int,
                  what: str = "calibration", dynamic: list[set[int]] | None = None) -> tuple:
    sample = tuple(sample)
    if len(sample) != len(example_inputs):
        raise QuantizeError(
            f"`opforge.quantize.quantize({what}=...)`: sample {index} — {len(sample)} "
            f"inputs — valid: {len(example_inputs)}, like the example inputs — fix: give every "
            "sample all the model's inputs, in order")
    for i, (got, want) in enumerate(zip(sample, example_inputs)):
        if isinstance(want, torch.Tensor):
            if not isinstance(got, torch.Tensor):
                got = torch.as_tensor(got)
            free = dynamic[i] if dynamic else set()
            if got.dim() != want.dim() or got.dtype != want.dtype or any(
                    a != b for k, (a, b) in enumerate(zip(got.shape, want.shape)) if k not in free):
                dims = ["*" if k in free else str(n) for k, n in enumerate(want.shape)]
                shape = "(" + ", ".join(dims) + ("," if len(dims) == 1 else "") + ")"
                raise QuantizeError(
                    f"`opforge.quantize.quantize({what}=...)`: sample {index}, input {i} — "
                    f"shape {tuple(got.shape)} {got.dtype} — valid: {shape} {want.dtype} (the "
                    "example input's; * marks a dim dynamic_shapes makes symbolic, every other "
                    "is captured as it is) — fix: reshape or cast the calibration data, or "
                    "declare the dim in dynamic_shapes")
            if got.is_floating_point() and not bool(torch.isfinite(got).all()):
                bad = "NaN" if bool(torch.isnan(got).any()) else "an infinity"
                raise QuantizeError(
                    f"`opforge.quantize.quantize(calibration=...)`: sample {index}, input {i} — "
                    f"holds {bad} — valid: finite values (an observer's range cannot hold NaN "
                    "or inf) — fix: clean the calibration data (e.g. torch.nan_to_num), or "
                    "leave this sample out")
    return tuple(torch.as_tensor(x) if not isinstance(x, torch.Tensor) else x for x in sample)


def prepare(model: torch.nn.Module, example_inputs: tuple, quantizer: Quantizer,
            dynamic_shapes: Any = None) -> torch.fx.GraphModule:
    """Capture and insert observers (PTQ); run calibration data through the result."""
    return prepare_pt2e(capture(model, example_inputs, dynamic_shapes), quantizer)


def prepare_qat(model: torch.nn.Module, example_inputs: tuple, quantizer: Quantizer,
                dynamic_shapes: Any = None) -> torch.fx.GraphModule:
    """Capture and insert fake-quantize modules (QAT); train the result, then :func:`convert`.

    ``quantizer`` should have ``is_qat=True`` in its configs (fake quantize instead of plain
    observers); capture happens in train mode so batch norm is folded the QAT way.
    """
    model.train()
    return prepare_qat_pt2e(capture(model, example_inputs, dynamic_shapes), quantizer)


def _trained_float_outputs(prepared: torch.fx.GraphModule, samples: list,
                           state: InitialState) -> tuple[list, InitialState]:
    """After QAT the float reference is the trained graph without fake quantization; with
    the state the eval-mode graph writes (``state`` less what only training writes)."""
    from torchao.quantization.pt2e import (
        disable_fake_quant, disable_observer, enable_fake_quant, move_exported_model_to_eval,
    )

    move_exported_model_to_eval(prepared)
    # what the graph still writes in eval mode (a KV cache, a step counter) is a run's
    # state: back to its initial value; what only training wrote (batch norm's running
    # statistics) is what training learned, and stays
    state = state.restrict(mutated_buffers(prepared))
    state.restore(prepared)
    prepared.apply(disable_fake_quant)
    prepared.apply(disable_observer)
    with torch.no_grad(), state.pass_over(prepared):
        reference = [prepared(*s) for s in samples]
    prepared.apply(enable_fake_quant)
    return reference, state


def convert(prepared: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Observers → ``quantize`` / ``dequantize`` ops with constant qparams (Q/DQ form)."""
    try:
        from torchao.quantization.pt2e import move_exported_model_to_eval

        move_exported_model_to_eval(prepared)
    except Exception:  # noqa: BLE001 - a PTQ graph has nothing to switch
        pass
    _check_observed_ranges(prepared)
    # torchao's folding of the weights' quantizes, without its float copies (memory.py)
    converted = convert_pt2e(prepared, fold_quantize=False)
    fold_weight_quantizes(converted)
    forget_cached_modules()  # they held the prepared graph and its float weights (memory.py)
    _drop_zero_block_zero_points(converted)
    _drop_unused_tensors(converted)
    _narrow_zero_points(converted)
    # opforge.export.export calls .eval(): let it (the graph has no train/eval behavior left)
    from torchao.quantization.pt2e import allow_exported_model_train_eval

    allow_exported_model_train_eval(converted)
    # torchao's eval() rewrites dropout/batch norm but leaves ``training`` True, so a caller
    # restoring the mode after .eval() (opforge's capture does) would switch dropout back
    # to training: set the flag too
    converted.eval()
    for module in converted.modules():
        module.training = False
    return converted


def _check_observed_ranges(prepared: torch.fx.GraphModule) -> None:
    """``QuantizeError`` for an observer whose range is not finite (a NaN or inf reached it:
    from the data, or made by the model); torchao's own check is an ``assert``."""
    users = {str(n.target): n for n in prepared.graph.nodes if n.op == "call_module"}
    for name, module in prepared.named_modules():
        low, high = getattr(module, "min_val", None), getattr(module, "max_val", None)
        if not (isinstance(low, torch.Tensor) and isinstance(high, torch.Tensor)):
            continue
        if low.numel() == 0 or bool(torch.isfinite(low).all() and torch.isfinite(high).all()):
            continue
        node = users.get(name) or users.get(name.rsplit(".", 1)[0])
        observed = node.args[0] if node is not None and node.args else None
        where = f"the output of node {observed.name!r}" if hasattr(observed, "name") else name
        raise QuantizeError(
            f"`opforge.quantize.convert`: observer {name!r} on {where} — saw the range "
            f"[{float(low.min())}, {float(high.max())}] — valid: finite values on every "
            "calibration sample — fix: 1. clean the calibration data of NaN and inf; 2. if "
            "the model itself makes them (log of 0, 0/0), fix it there, or leave that op in "
            "floating point (Quantizer.add_discard_ops)")


def _drop_unused_tensors(gm: torch.fx.GraphModule) -> None:
    """Delete parameters and buffers no ``get_attr`` reads: convert leaves the float weights
    beside their int8 copies, and export would store both."""
    used = {n.target for n in gm.graph.nodes if n.op == "get_attr"}
    for name in [k for k, _ in gm.named_parameters()] + [k for k, _ in gm.named_buffers()]:
        if name not in used and not any(u.startswith(name + ".") for u in used):
            owner, _, leaf = name.rpartition(".")
            module = gm.get_submodule(owner) if owner else gm
            delattr(module, leaf)


def _drop_zero_block_zero_points(gm: torch.fx.GraphModule) -> None:
    """A block-wise weight's zero points (symmetric weights: all 0, int32 [N, K / g], as many
    bytes as its scales) → None, which ``dequantize_affine`` reads as 0: the same values,
    and a 4-bit weight in groups of 32 stores 5 bits per weight instead of 6."""
    for node in gm.graph.nodes:
        if node.op != "call_function" or "dequantize_affine" not in str(node.target):
            continue
        zp = node.args[3] if len(node.args) > 3 else None
        if isinstance(zp, torch.fx.Node) and zp.op == "get_attr":
            owner, _, leaf = zp.target.rpartition(".")
            value = getattr(gm.get_submodule(owner) if owner else gm, leaf)
            if isinstance(value, torch.Tensor) and not bool(value.any()):
                node.args = node.args[:3] + (None,) + node.args[4:]
                if not zp.users:
                    gm.graph.erase_node(zp)
    gm.recompile()


def _narrow_zero_points(gm: torch.fx.GraphModule) -> None:
    """int64 per-channel zero points → int32 (half the bytes in the program). The result is
    the same: ``int8 - int32`` and ``int8 - int64`` give the same integers."""
    per_channel = (torch.ops.quantized_decomposed.dequantize_per_channel.default,
                   torch.ops.quantized_decomposed.quantize_per_channel.default)
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in per_channel:
            zp = node.args[2]
            if isinstance(zp, torch.fx.Node) and zp.op == "get_attr":
                owner, _, leaf = zp.target.rpartition(".")
                module = gm.get_submodule(owner) if owner else gm
                value = getattr(module, leaf)
                if value.dtype == torch.int64 and value.numel() and int(value.abs().max()) < 2**31:
                    if leaf in module._buffers:
                        module._buffers[leaf] = value.to(torch.int32)
                    else:
                        setattr(module, leaf, value.to(torch.int32))


@dataclass
class QuantizedModel:
    """A converted model with its report; ``export()`` makes the opforge program."""

    model: torch.fx.GraphModule
    example_inputs: tuple
    report: QuantReport
    quantizer: Quantizer
    float_model: torch.nn.Module | None = None  # what evaluate() compares with
    dynamic_shapes: Any = None  # what the graph was captured with; export's default
    # the buffers a run writes (a KV cache), as they were before quantize (state.py):
    # every pass of evaluate() starts from them
    initial_state: InitialState | None = None

    def evaluate(self, samples: Iterable[Sequence]) -> Accuracy:
        """SQNR and max abs error against the float model on ``samples`` (inputs the
        calibration did not see); also stored as ``report.held_out``."""
        if self.float_model is None:
            raise QuantizeError("`QuantizedModel.evaluate()`: no float model kept — valid: "
                                "a QuantizedModel made by opforge.quantize.quantize with "
                                "keep_float_model=True (the default) — fix: quantize again "
                                "without keep_float_model=False")
        dynamic = _dynamic_dims(self.model, self.example_inputs, self.dynamic_shapes)
        samples = [_check_sample(s, self.example_inputs, i, what="evaluation", dynamic=dynamic)
                   for i, s in enumerate(samples)]
        if not samples:
            raise QuantizeError("`QuantizedModel.evaluate([])`: no samples — valid: at least "
                                "one — fix: pass held-out inputs")
        state = self.initial_state or InitialState({})
        # both passes from the state quantize started from; each model's buffers are left
        # as they were (state.py)
        with torch.no_grad():
            with state.pass_over(self.float_model):
                reference = [self.float_model(*s) for s in samples]
            with state.pass_over(self.model):
                model = near_users(self.model)  # one weight's float copy at a time (memory.py)
                outputs = [model(*s) for s in samples]
                del model
        self.report.held_out = accuracy(reference, outputs)
        return self.report.held_out

    def export(self, *, pack_4bit: bool = True, **kwargs: Any):
        """``opforge.export.export`` of the converted model (Q/DQ ops and integer constants
        kept), 4-bit weights packed two per byte unless ``pack_4bit=False``; with the
        ``dynamic_shapes`` it was captured with unless given others."""
        from opforge.export import export
        from opforge.quantize.packing import pack_4bit_weights

        # export switches the module's mode and back, which torchao implements by rewriting
        # the graph in place: export a copy, keep ``model`` exactly as converted
        model = graph_copy(self.model)
        if self.dynamic_shapes is not None:
            kwargs.setdefault("dynamic_shapes", self.dynamic_shapes)
        program = export(model, self.example_inputs, **kwargs)
        return pack_4bit_weights(program) if pack_4bit else program


def quantize(
    model: torch.nn.Module,
    example_inputs: tuple,
    scheme: str | QuantConfig = "8a8w",
    *,
    calibration: Iterable[Sequence] | None = None,
    quantizer: Quantizer | None = None,
    train: Callable[[torch.fx.GraphModule], Any] | None = None,
    on_step: Callable[[str], None] | None = None,
    dynamic_shapes: Any = None,
    keep_float_model: bool = True,
) -> QuantizedModel:
    """Quantize ``model`` with ``scheme`` (or a configured ``quantizer``) and report.

    PTQ: each ``calibration`` sample (a tuple of inputs shaped like ``example_inputs``) runs
    through the observed model; without calibration the example inputs calibrate, with a
    warning (one sample rarely covers the real ranges; weight-only and dynamic schemes need
    no calibration: the example inputs run once for the weights' observers). QAT: pass ``train`` (a function
    that trains the fake-quantized graph module in place) and a quantizer whose config has
    ``is_qat=True``. The report compares the converted model with the float model on the
    calibration samples (SQNR in dB, max abs error); ``QuantizedModel.evaluate`` measures
    held-out inputs. ``on_step(text)`` is told each stage (calibration sample i of n,
    conversion, measurement) for a progress display. ``dynamic_shapes`` (as ``torch.export``
    takes them) keeps those sizes symbolic in the captured graph: calibration samples may
    differ from the example inputs there, and the converted model exports with them (or,
    through ``export(None, methods=...)``, at several shapes: a decoder's prefill and its
    one-token decode step).

    Memory: ``model`` is not copied (the captured graph reads its weights) and the converted
    model holds integer weights and no float ones. The result keeps ``model`` for
    ``evaluate`` unless ``keep_float_model=False``: then, once the caller lets go of its
    own reference, the float weights are freed before export, and quantizing and exporting
    hold them once (a 1B decoder: 6 GB of float32 weights). Pass it when the float model is
    not needed again (``opforge quantize`` does, without ``--eval``).

    State: the buffers the model's graph writes in place (a decoder's KV cache, a step
    counter) are copied before any run; every pass (the float reference, calibration, the
    accuracy measurement, ``evaluate``) starts from that copy, ``model`` gets its buffers
    back bitwise, and the converted model holds buffers of its own with that state (what
    ``export()`` stores as the program's initial state), no calibration run's.
    """
    step = on_step or (lambda text: None)
    example_inputs = tuple(example_inputs)
    quantizer = quantizer or Quantizer(scheme)
    if calibration is None:
        if quantizer.needs_calibration:
            warnings.warn("opforge.quantize: no calibration data; the example inputs calibrate "
                          "(ranges seen on one sample may clip real data)", stacklevel=2)
        samples = [example_inputs]
    else:
        dynamic = _dynamic_dims(model, example_inputs, dynamic_shapes)
        samples = [_check_sample(s, example_inputs, i, dynamic=dynamic)
                   for i, s in enumerate(calibration)]
        if not samples:
            raise QuantizeError("`opforge.quantize.quantize(calibration=[])`: no samples — "
                                "valid: at least one — fix: pass samples or leave it out")
    # The buffers a run writes (a KV cache, a counter) are copied before any run, and every
    # pass below (reference, calibration, accuracy) starts from them and puts them back
    # (state.py): the model keeps its state, and the converted model starts from it.
    if train is not None:
        prepared = prepare_qat(model, example_inputs, quantizer, dynamic_shapes)
        state = InitialState.of(prepared, mutated_buffers(prepared))
        train(prepared)
        reference, state = _trained_float_outputs(prepared, samples, state)
        state.restore(model)  # the model shares the prepared graph's state (or had its own)
    else:
        model.eval()
        step("capturing and annotating the graph")
        captured = capture(model, example_inputs, dynamic_shapes)  # reads the model's buffers
        state = InitialState.of(model, mutated_buffers(captured))
        with torch.no_grad(), state.pass_over(model):
            reference = [model(*s) for s in samples]
        prepared = prepare_pt2e(captured, quantizer)
        del captured
        with torch.no_grad(), state.pass_over(prepared):
            for i, s in enumerate(samples):
                step(f"calibrating: sample {i + 1} of {len(samples)}")
                prepared(*s)
    step("converting to quantize/dequantize ops")
    converted = convert(prepared)
    del prepared  # its observers and its references to the float weights
    state.restore(model)  # (torchao's passes run graphs too; the graph shares the model's)
    state.give_own_copy(converted)  # running it must not write the float model's cache
    large = sum(t.nbytes for t in model.parameters()) >= freed_memory.LARGE_BYTES
    if large:
        freed_memory.release()  # the folding's temporaries (freed_memory.py)
    for name in run_on_integers(converted):
        decision = quantizer.decisions.get(name)
        if decision is not None:
            quantizer.decisions[name] = dataclasses.replace(
                decision, detail=decision.detail + "; its kernel runs on the integers")
    step("measuring against the float model")
    with torch.no_grad(), state.pass_over(converted):
        measured = near_users(converted)  # one weight's float copy at a time (memory.py)
        outputs = [measured(*s) for s in samples]
        del measured
    report = build_report(quantizer, converted, accuracy(reference, outputs),
                          calibrated=len(samples), scheme=quantizer.default.scheme)
    if large:
        freed_memory.release()
    return QuantizedModel(converted, example_inputs, report, quantizer,
                          float_model=model if train is None and keep_float_model else None,
                          dynamic_shapes=dynamic_shapes, initial_state=state)
