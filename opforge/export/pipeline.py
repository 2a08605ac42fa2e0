"""The export pipeline of one method, top to bottom.

    capture (torch.export)                            capture.py
      → DecomposeToCoreAten   captured → core_aten_or_custom
      → TagDebugHandles       core_aten_or_custom → debug_handles (each call's FX node)
      → SymbolicSizes         core_aten_or_custom → sizes_symbolic (symbols, guards)
      → CheckFunctional       core_aten_or_custom → functional (mutated buffers → state)
      → DropAssertions        functional → assertion_free
      → Delegate              (with backends) partitions → delegate calls   delegation.py
      → ToOutVariant          functional, assertion_free → all_out_variants
      → LiftConstants         functional → constants_lifted
      → UpdateStateInPlace    all_out_variants, constants_lifted → cache writes into the state
      → PlanMemory            all_out_variants, constants_lifted → memory_planned   (last)
    emit (→ Program)                                  emit.py

Each arrow is a pass (``passes/``); the pass manager checks the contract of each.
``export`` runs the passes up to DropAssertions (``run_front``) on every method before the
rest (``run_back``) on any: delegation must know every method's state.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Sequence

import torch.fx

from opforge.export.delegation import Delegate
from opforge.export.memory_planning import DEFAULT_ALIGNMENT, TensorLifetime
from opforge.export.method_graph import MethodGraph
from opforge.export.pass_manager import PassManager
from opforge.export.passes import (
    CheckFunctional, DecomposeToCoreAten, DropAssertions, LiftConstants, PlanMemory, SymbolicSizes,
    TagDebugHandles, ToOutVariant, UpdateStateInPlace,
)

__all__ = ["run_pipeline", "run_front", "run_back"]


def run_pipeline(
    method: MethodGraph,
    *,
    preserve_ops: Iterable[str] = (),
    alignment: int = DEFAULT_ALIGNMENT,
    mem_id_policy: Callable[[TensorLifetime, torch.fx.Node], int] | None = None,
    on_pass: Callable[[str, str], None] | None = None,
    backends: Sequence[Any] = (),
) -> MethodGraph:
    """Run the export passes on a captured method; returns it planned and ready to emit.

    ``preserve_ops`` are ``"aten::linear.default"`` keys kept out of decomposition;
    ``backends`` are resolved requests (``delegation.resolve_backends``) to lower for.
    """
    method = run_front(method, preserve_ops=preserve_ops, on_pass=on_pass)
    return run_back(method, alignment=alignment, mem_id_policy=mem_id_policy, on_pass=on_pass,
                    backends=backends)


def run_front(method: MethodGraph, *, preserve_ops: Iterable[str] = (),
              on_pass: Callable[[str, str], None] | None = None) -> MethodGraph:
    """The passes up to a functional, assertion-free graph whose state is known (notes
    ``state``): ``export`` runs them on every method before delegating any, since a
    buffer one method updates is state in all of them."""
    passes = [
        DecomposeToCoreAten(preserve=preserve_ops),
        TagDebugHandles(),
        SymbolicSizes(),
        CheckFunctional(),
        DropAssertions(),
    ]
    return PassManager(passes, on_pass=on_pass).run(method)


def run_back(method: MethodGraph, *, alignment: int = DEFAULT_ALIGNMENT,
             mem_id_policy: Callable[[TensorLifetime, torch.fx.Node], int] | None = None,
             on_pass: Callable[[str, str], None] | None = None,
             backends: Sequence[Any] = ()) -> MethodGraph:
    """Delegation, out variants and memory planning (the rest of ``run_pipeline``)."""
    passes = [
        *([Delegate(backends)] if backends else []),
        ToOutVariant(),
        LiftConstants(),
        UpdateStateInPlace(),
        PlanMemory(alignment=alignment, mem_id_policy=mem_id_policy),  # always last
    ]
    return PassManager(passes, on_pass=on_pass).run(method)
