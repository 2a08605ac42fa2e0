"""Capture: one named method of a model → ``torch.export.ExportedProgram`` → MethodGraph.

``torch.export`` failures are turned into ``ExportError`` naming the method, the model
source line torch points at, and the fix for the common cases (data-dependent control
flow → ``torch.cond``, unsupported Python → non-strict mode).
"""

from __future__ import annotations

import contextlib
import logging
import warnings

from dataclasses import dataclass
from typing import Any, Mapping

import torch
from torch import nn

from opforge.errors import ExportError
from opforge.export.diagnostics import user_frame_of_exception
from opforge.export.fake_check import check_fakes
from opforge.export.method_graph import InputKind, MethodGraph

__all__ = ["MethodSpec", "method_specs", "capture", "method_graph_from_exported"]


@dataclass(frozen=True)
class MethodSpec:
    """One method to export: a module (whose ``forward`` is the method), example inputs,
    and optional ``torch.export`` dynamic shapes."""

    name: str
    module: nn.Module | None
    example_inputs: tuple
    dynamic_shapes: Any = None
    exported: Any = None  # a torch.export.ExportedProgram given instead of a module


class _BoundMethod(nn.Module):
    """Exports ``owner.<method>`` as a module's forward (e.g. ``model.encode``)."""

    def __init__(self, owner: nn.Module, method_name: str) -> None:
        super().__init__()
        self.owner = owner
        self.method_name = method_name

    def forward(self, *args: Any) -> Any:
        return getattr(self.owner, self.method_name)(*args)


def _as_module(name: str, target: Any) -> nn.Module:
    if isinstance(target, nn.Module):
        return target
    owner = getattr(target, "__self__", None)
    if isinstance(owner, nn.Module) and callable(target):
        return _BoundMethod(owner, target.__name__)
    raise ExportError(
        f"`opforge.export.export(methods=...)`: method {name!r} — found {type(target).__name__} — "
        "valid: an nn.Module or a bound method of one (model.encode) — "
        f"fix: pass methods={{{name!r}: (module_or_bound_method, example_inputs)}}"
    )


def _as_inputs(name: str, inputs: Any) -> tuple:
    if isinstance(inputs, torch.Tensor):
        return (inputs,)
    if isinstance(inputs, (tuple, list)):
        return tuple(inputs)
    raise ExportError(
        f"`opforge.export.export()`: example inputs of method {name!r} — found {type(inputs).__name__} — "
        "valid: a tuple of tensors (and other positional arguments) — fix: wrap them in a tuple, e.g. (x,)"
    )


def method_specs(
    model: Any,
    example_inputs: Any,
    methods: Mapping[str, Any] | None,
    dynamic_shapes: Any,
) -> list[MethodSpec]:
    """Normalise ``export()``'s arguments into one :class:`MethodSpec` per method.

    ``model, example_inputs`` give the method ``"forward"``; each ``methods`` entry is
    ``name: (module_or_bound_method, example_inputs)`` or a :class:`MethodSpec`.
    """
    specs: list[MethodSpec] = []
    if isinstance(model, torch.export.ExportedProgram):
        specs.append(MethodSpec("forward", None, (), None, model))
    elif model is not None:
        if example_inputs is None:
            raise ExportError(
                "`opforge.export.export(model, example_inputs)`: example_inputs — found None — "
                "valid: a tuple of example tensors — fix: export(model, (torch.randn(1, 3),))"
            )
        specs.append(MethodSpec("forward", _as_module("forward", model), _as_inputs("forward", example_inputs), dynamic_shapes))
    for name, entry in (methods or {}).items():
        if not isinstance(name, str) or not name.isidentifier():
            raise ExportError(
                f"`opforge.export.export(methods=...)`: method name {name!r} — valid: a Python identifier — "
                "fix: rename the method, e.g. 'encode'"
            )
        if any(spec.name == name for spec in specs):
            raise ExportError(
                f"`opforge.export.export(methods=...)`: method {name!r} — defined twice (the model argument "
                "already defines 'forward') — fix: pass model=None or choose another name"
            )
        if isinstance(entry, MethodSpec):
            specs.append(MethodSpec(name, entry.module, entry.example_inputs, entry.dynamic_shapes,
                                    entry.exported))
            continue
        if isinstance(entry, torch.export.ExportedProgram):
            specs.append(MethodSpec(name, None, (), None, entry))
            continue
        if not (isinstance(entry, (tuple, list)) and len(entry) in (2, 3)):
            raise ExportError(
                f"`opforge.export.export(methods=...)`: method {name!r} — found {type(entry).__name__} — "
                "valid: (module_or_bound_method, example_inputs), an ExportedProgram or MethodSpec — "
                f"fix: methods={{{name!r}: (model.{name}, (x,))}}"
            )
        dims = entry[2] if len(entry) == 3 else None
        specs.append(MethodSpec(name, _as_module(name, entry[0]), _as_inputs(name, entry[1]), dims))
    if not specs:
        raise ExportError(
            "`opforge.export.export()`: methods — found none — valid: a model with example inputs and/or "
            "methods={name: (module, inputs)} — fix: export(model, (x,))"
        )
    return specs


def _not_a_meta_failure(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith("failed while attempting to run meta")


@contextlib.contextmanager
def quiet_torch_internals():
    """torch 2.13 warns about its own pytree internals on every export and decomposition;
    the warning is not about the user's model, so it is not shown to them. And when an op
    refuses its fake inputs (a shape mismatch), torch logs ~20 lines of traceback before
    raising the error that capture turns into one ExportError: that log is dropped too."""
    fake_tensor_log = logging.getLogger("torch._subclasses.fake_tensor")
    fake_tensor_log.addFilter(_not_a_meta_failure)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r".*treespec, LeafSpec.*",
                                    category=FutureWarning)
            yield
    finally:
        fake_tensor_log.removeFilter(_not_a_meta_failure)


def capture(spec: MethodSpec, *, strict: bool = False) -> MethodGraph:
    """Run ``torch.export.export`` on one method; user errors become ``ExportError``.
    A method given as an ``ExportedProgram`` is taken as it is."""
    if spec.exported is not None:
        method = method_graph_from_exported(spec.name, spec.exported)
        example = getattr(spec.exported, "example_inputs", None)  # (args, kwargs) or None
        if example is not None and not example[1]:
            check_fakes(method, example[0])
        return _with_dim_names(method, None)
    module = spec.module
    was_training = module.training
    try:
        module.eval()
    except NotImplementedError as exc:  # torchao's PT2E graphs refuse train()/eval()
        raise ExportError(
            f"`opforge.export.export`: method {spec.name!r} — {type(module).__name__}.eval() "
            "refused (a torchao PT2E graph module) — valid: a module that can switch to eval "
            "mode — fix: convert with opforge.quantize.convert (or quantize), or call "
            "torchao.quantization.pt2e.allow_exported_model_train_eval(model) first"
        ) from exc
    try:
        with quiet_torch_internals():
            exported = torch.export.export(
                module, spec.example_inputs, dynamic_shapes=spec.dynamic_shapes, strict=strict
            )
    except ExportError:
        raise
    except Exception as exc:  # noqa: BLE001 - torch raises many unrelated types here
        raise _capture_error(spec, strict, exc) from exc
    finally:
        module.train(was_training)
    method = method_graph_from_exported(spec.name, exported)
    check_fakes(method, spec.example_inputs)  # a wrong fake would plan wrong shapes
    if isinstance(module, _BoundMethod):  # model.decode's buffers are model's: 'cache', not 'owner.cache'
        method.notes["buffer_prefix"] = "owner."
        method.notes["buffer_names"] = {p: name.removeprefix("owner.")
                                        for p, name in method.notes["buffer_names"].items()}
    return _with_dim_names(method, spec.dynamic_shapes)


def _with_dim_names(method: MethodGraph, dynamic_shapes: Any) -> MethodGraph:
    """Note the user's ``Dim`` names of the symbols (``{'s31': 'batch'}``) for the program."""
    names: dict[str, str] = {}
    entries = (list(dynamic_shapes.values()) if isinstance(dynamic_shapes, dict)
               else list(dynamic_shapes) if isinstance(dynamic_shapes, (list, tuple)) else [])
    for node, dims in zip(method.user_inputs(), entries):
        fake = node.meta.get("val")
        items = (dims.items() if isinstance(dims, dict) else enumerate(dims)
                 if isinstance(dims, (list, tuple)) else ())
        for dim, spec in items:
            name = getattr(spec, "__name__", None)
            if (not isinstance(fake, torch.Tensor) or not isinstance(dim, int) or name is None
                    or not name.isidentifier() or hasattr(spec, "root") or dim >= fake.dim()):
                continue
            size = fake.shape[dim]
            if isinstance(size, torch.SymInt) and size.node.expr.is_Symbol:
                names.setdefault(str(size.node.expr), name)
    if len(set(names.values())) == len(names):  # only when the names are unambiguous
        method.notes["dim_names"] = names
    return method


def _capture_error(spec: MethodSpec, strict: bool, exc: Exception) -> ExportError:
    where = user_frame_of_exception(exc)
    text = str(exc)
    api = f"`opforge.export.export(strict={strict})`"
    subject = f"method {spec.name!r}" + (f" at {where}" if where else "")
    first_line = next((line.strip() for line in text.splitlines() if line.strip()), type(exc).__name__)
    data_dependent = (
        "data-dependent" in text.lower()
        or "GuardOnDataDependentSymNode" in type(exc).__name__
        or "Data-dependent branching" in text
    )
    if data_dependent:
        return ExportError(
            f"{api}: {subject} — found data-dependent control flow (a Python `if`/loop on a tensor's "
            f"value): {first_line} — valid: control flow that depends only on shapes and constants — fix:\n"
            "  1. express the branch with torch.cond(pred, true_fn, false_fn, (x,)), or\n"
            "  2. make it branchless, e.g. torch.where(cond, a, b)"
        )
    fixes = "  1. check the model runs eagerly on the example inputs\n"
    fixes += "  2. try non-strict capture (the default; drop --strict)\n" if strict else "  2. try strict=True (--strict)\n"
    return ExportError(
        f"{api}: {subject} — torch.export failed: {type(exc).__name__}: {first_line} — "
        f"valid: a model torch.export can trace — fix:\n{fixes}"
    )


def method_graph_from_exported(name: str, exported: Any) -> MethodGraph:
    """Build the pass IR from an ``ExportedProgram`` (placeholder kinds and constants)."""
    from torch.export.graph_signature import InputKind as TorchInputKind

    kinds: dict[str, str] = {}
    constants: dict[str, torch.Tensor] = {}
    buffers: dict[str, str] = {}  # placeholder → buffer name (state is shared by it)
    state = exported.state_dict
    for spec in exported.graph_signature.input_specs:
        node_name = spec.arg.name
        if spec.kind == TorchInputKind.USER_INPUT:
            kinds[node_name] = InputKind.USER
            continue
        if spec.kind == TorchInputKind.PARAMETER:
            kinds[node_name], tensor = InputKind.PARAMETER, state[spec.target]
        elif spec.kind == TorchInputKind.BUFFER:
            kinds[node_name] = InputKind.BUFFER
            buffers[node_name] = spec.target
            tensor = state[spec.target] if spec.target in state else exported.constants[spec.target]
        elif spec.kind == TorchInputKind.CONSTANT_TENSOR:
            kinds[node_name], tensor = InputKind.CONSTANT, exported.constants[spec.target]
        else:
            raise ExportError(
                f"`opforge.export.export()`: method {name!r} input {node_name} — found a {spec.kind.name} "
                "input (script object or effect token) — valid: tensors, parameters, buffers, tensor "
                "constants — fix: keep TorchBind objects and side-effecting ops out of the exported method"
            )
        constants[node_name] = tensor.detach()
    return MethodGraph(
        name=name,
        graph_module=exported.graph_module,
        input_kinds=kinds,
        constants=constants,
        exported=exported,
        notes={"buffer_names": buffers},
    )
