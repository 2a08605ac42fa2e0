"""``opforge.export.export``: a PyTorch model → a verified ``Program``.

    method specs → capture (torch.export, then each custom op's fake against its real
    implementation) → run_front (passes to a functional graph, every method) → run_back
    (delegation, out variants, memory plan) → kernel check → emit → verify

The fake check (``fake_check.py``) runs right after capture, since every shape planned
later comes from the fakes. The kernel check runs before emission, so a program that would
die on the device with "missing operator" is never produced (unless ``allow_missing``).
"""

from __future__ import annotations

import re
from typing import Any, Callable, Iterable, Mapping

import torch
import torch.fx

import importlib.metadata

from opforge.backends.named_data import NamedDataPool
from opforge.errors import ExportError, InternalError, ProgramError
from opforge.export.capture import capture, method_specs
from opforge.export.delegation import resolve_backends
from opforge.export.lowered import is_delegate
from opforge.export.emit import emit_program
from opforge.export.kernel_sets import check_kernels, preserved_by_kernels, resolve_kernels
from opforge.export.memory_planning import DEFAULT_ALIGNMENT, TensorLifetime
from opforge.export.method_graph import MethodGraph, is_alloc, is_size_read
from opforge.export.out_variants import op_key
from opforge.export.passes.decompose import decomposition_table
from opforge.export.pipeline import run_back, run_front
from opforge.program import Program, verify

__all__ = ["export", "normalize_op_name", "memory_plan_metadata"]

_OP_NAME = re.compile(r"(?P<ns>[A-Za-z_]\w*)(::|\.)(?P<op>[A-Za-z_]\w*)(\.(?P<overload>\w+))?\Z")


def normalize_op_name(name: str) -> str:
    """``"aten::linear"``, ``"aten::linear.default"``, ``"aten.linear.default"`` → ``"aten::linear"``."""
    match = _OP_NAME.match(name.strip())
    if match is None:
        raise ExportError(
            f"`opforge.export.export(preserve_ops=...)`: op name {name!r} — not an operator name — "
            "valid: 'ns::op' or 'ns::op.overload' (e.g. 'aten::linear') — fix: spell it like the schema"
        )
    overload = match["overload"]
    base = f"{match['ns']}::{match['op']}"
    return base if overload in (None, "default") else f"{base}.{overload}"


def memory_plan_metadata(method: MethodGraph) -> dict[str, str]:
    """Planned arena bytes vs the naive sum, as program user metadata for one method."""
    plan = method.notes["memory_plan"]
    prefix = f"opforge.memory_plan.{method.name}"
    return {
        f"{prefix}.arena_bytes": str(plan.arena_bytes),
        f"{prefix}.naive_bytes": str(plan.naive_bytes),
        f"{prefix}.planned_tensors": str(len(plan.allocations)),
    }


def export(
    model: torch.nn.Module | None,
    example_inputs: tuple | None = None,
    *,
    methods: Mapping[str, Any] | None = None,
    strict: bool = False,
    preserve_ops: Iterable[str] = (),
    kernels: Any = None,
    allow_missing: bool = False,
    dynamic_shapes: Any = None,
    alignment: int = DEFAULT_ALIGNMENT,
    mem_id_policy: Callable[[TensorLifetime, torch.fx.Node], int] | None = None,
    on_step: Callable[[str, str], None] | None = None,
    backends: Iterable[Any] | None = None,
    compile_specs: Mapping[str, Any] | None = None,
    grow: Iterable[str] = (),
    debug_handles: bool = True,
) -> Program:
    """Export ``model`` (method ``"forward"``) and/or named ``methods`` to a Program.

    ``methods`` maps a method name to ``(module_or_bound_method, example_inputs)``, e.g.
    ``{"encode": (model.encode, (x,))}``. ``strict`` selects torch.export's strict
    (TorchDynamo) capture; ``preserve_ops`` (``"aten::linear"``) are kept out of
    decomposition; ``kernels`` (``"portable"``, ``"aten"``, a container of
    ``"ns::op.overload"`` keys, or a list of these) is checked to cover every operator —
    a missing one raises ``ExportError`` listing all of them, or warns with
    ``allow_missing=True``. ``on_step(step, method)`` reports progress.

    ``backends`` (names such as ``"cpu"``, ``(name, compile_specs)`` pairs or Backend
    instances) lower what each backend takes, in order, to delegate calls; ``compile_specs``
    applies to every backend given by name alone. Nodes left on kernels are still checked
    against ``kernels``. Why each node was or was not delegated:
    ``opforge.export.delegation_report(program)``.

    ``grow`` names ``Dim``s (by their names) whose memory grows instead of being planned
    at their upper bound: such a Dim may have no ``max``; every tensor whose sizes read it
    lives outside the arenas, is allocated at its size at the example inputs and grows
    geometrically (×2) when a call needs more, within the runtime's memory limit
    (format version 4; ``docs/architecture.md``, "Growing memory").

    ``debug_handles`` keeps, in the program's metadata, the FX node (name, op, source line)
    each instruction and each op inside a delegate came from (``opforge compare`` aligns
    runs by it; ``opforge.program.debug_info``); ``False`` leaves it out.

    A delegate's large constants are views of the model's weights, not copies (as
    ``torch.export``'s state dict is): a model of N bytes of weights exports in about N
    more, at most. Weights changed in place after ``export`` change what ``save`` writes:
    export again after changing them.

    >>> import torch
    >>> from opforge.export import export
    >>> program = export(torch.nn.Linear(3, 2), (torch.randn(1, 3),), kernels="portable")
    >>> [op.key for op in program.method("forward").operators]
    ['aten::linear.out']
    """
    step = on_step or (lambda name, method: None)
    grow = _grow_names(grow, dynamic_shapes, methods, backends)
    requests = resolve_backends(backends, compile_specs)
    specs = method_specs(model, example_inputs, methods, dynamic_shapes)
    resolved = resolve_kernels(kernels)
    preserve = {normalize_op_name(name) for name in preserve_ops}
    for request in requests:
        preserve |= {normalize_op_name(name) for name in request.backend.preserved_ops(request.specs)}
    if resolved is not None:
        preserve |= preserved_by_kernels(resolved[1], decomposition_table().keys())
    functional = []
    for spec in specs:
        step("capture", spec.name)
        method = capture(spec, strict=strict)
        method.notes["grow"] = grow
        functional.append(run_front(method, preserve_ops=preserve, on_pass=step))
    # a buffer one method updates is state in every method (shared by name): a method that
    # only reads it must not see it as a constant (a delegate would bake its initial value)
    state = frozenset(name for method in functional for name in method.notes["state"].values())
    planned = []
    pool = NamedDataPool()  # every delegate's named constants, each held once (named_data.py)
    for method in functional:
        method.notes["program_state"] = state
        method.notes["named_data_pool"] = pool
        planned.append(run_back(method, alignment=alignment, mem_id_policy=mem_id_policy,
                                on_pass=step, backends=requests))
    metadata = {"opforge.version": importlib.metadata.version("opforge"), "opforge.torch_version": str(torch.__version__)}
    for method in planned:
        metadata.update(memory_plan_metadata(method))
        # the user inputs' names (the forward's parameters): how a runner such as
        # opforge.runtime.generate tells `tokens` from `positions` without guessing
        metadata[f"opforge.input_names.{method.name}"] = ",".join(
            node.name for node in method.user_inputs())
    if resolved is not None:
        step("check kernels", ",".join(s.name for s in specs))
        used: dict[str, list[str]] = {}
        for method in planned:
            for node in method.call_nodes():
                if not is_alloc(node) and not is_delegate(node) and not is_size_read(node):
                    used.setdefault(op_key(node.target), [])
                    if method.name not in used[op_key(node.target)]:
                        used[op_key(node.target)].append(method.name)
        missing = check_kernels(used, resolved[0], resolved[1], allow_missing=allow_missing)
        metadata["opforge.kernels"] = resolved[0]
        if missing:
            metadata["opforge.missing_kernels"] = ",".join(missing)
    step("emit", ",".join(s.name for s in specs))
    program = emit_program(planned, user_metadata=metadata, debug_handles=debug_handles)
    try:
        verify(program)
    except ProgramError as exc:
        raise InternalError(f"`opforge.export.export()`: the emitted program fails verification: {exc}") from exc
    return program


def _grow_names(grow: Iterable[str], dynamic_shapes: Any, methods: Any, backends: Any) -> frozenset[str]:
    """``export(grow=...)`` checked: Dim names (str), with dynamic shapes, without backends."""
    api = "`opforge.export.export(grow=...)`"
    names = [grow] if isinstance(grow, str) else list(grow)
    if not names:
        return frozenset()
    bad = [n for n in names if not isinstance(n, str) or not n.isidentifier()]
    if bad:
        raise ExportError(f"{api}: names — found {bad!r} — valid: the names of torch.export.Dim "
                          "objects in dynamic_shapes — fix: grow=['seq'] for Dim('seq')")
    if dynamic_shapes is None and not methods:
        raise ExportError(f"{api}: {names!r} — found no dynamic_shapes — valid: grow names "
                          "dynamic dimensions — fix: pass dynamic_shapes with a Dim of that name")
    if backends:
        raise ExportError(f"{api}: {names!r} with backends — valid: growing memory on kernels "
                          "(the lean and ATen runtimes); backends take planned tensors only — "
                          "fix: drop backends=..., or drop grow and give the Dim a max")
    return frozenset(names)
