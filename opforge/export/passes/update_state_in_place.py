"""State written in place: a cache write goes straight into the state tensor.

After functionalization a buffer update is an op that makes the buffer's whole new value
(``index_put(cache, [positions], k)``, ``slice_scatter(cache, k, 0, p, p + 1)``) and the
emitter copies that value back into the state at the end of the call (``CheckFunctional``).
For a KV cache written one position per decoding step that is two copies of the whole
cache per token (the out variant copies ``self`` into its out, the ``Move`` copies the
out into the state). This pass removes both where it is safe: the write's ``out`` becomes
the state placeholder itself, so the instruction's ``self`` and ``out`` are one value
(the portable scatter kernels skip their ``self`` → ``out`` copy for that; ATen's out
variants allow the overlap), every later reader of the new value reads the state, and the
emitter drops the (now self-to-self) ``Move``.

Safe means: the new value is made by one of the scatter ops below from the state itself
(``self`` is the state placeholder), with the state's dtype and sizes, and no other node
reads the state's *old* value after the write (such a reader would see the new one): then
the copy is kept, as it is for any other update (``self.count.add_(1)``). Positions are
checked by the kernels before anything is written (a position past the cache's end is a
``KernelError``, never a write out of bounds).

A delegate that holds a cache write (``export/delegated_state.py``) has written the state in
place already: its output for the new value becomes the state the same way.

Requires out variants (the write's ``out`` is an ``alloc``); ensures ``state_in_place``:
notes ``state_in_place`` lists the placeholders written in place.
"""

from __future__ import annotations

import torch
import torch.fx

from opforge.errors import InternalError
from opforge.export.lowered import DelegateOut
from opforge.export.method_graph import MethodGraph, is_alloc
from opforge.export.out_variants import bind_arguments
from opforge.export.pass_manager import ExportPass

__all__ = ["UpdateStateInPlace", "IN_PLACE_WRITES"]

_aten = torch.ops.aten
# out variants that copy ``self`` into ``out`` and then write some positions of it
IN_PLACE_WRITES = frozenset({
    _aten.index_put.out, _aten.slice_scatter.out, _aten.select_scatter.out,
})


class UpdateStateInPlace(ExportPass):
    """Point each eligible state write's ``out`` at the state; see the module docstring."""

    requires = frozenset({"all_out_variants", "constants_lifted"})
    ensures = frozenset({"all_out_variants"})

    def run(self, method: MethodGraph) -> MethodGraph:
        order = {node: i for i, node in enumerate(method.graph.nodes)}
        outputs = method.output_args()
        in_place: list[str] = []
        for position, placeholder_name in method.notes.get("state_outputs", {}).items():
            value = outputs[position]
            state = next((n for n in method.placeholders() if n.name == placeholder_name), None)
            if state is None or not isinstance(value, torch.fx.Node) or not is_alloc(value):
                continue
            delegate = _delegate_writer(value, state)
            writer = delegate or _writer(value, state)
            if writer is None or not _same_tensor(state, value):
                continue
            if any(order[user] > order[writer] for user in state.users if user is not writer):
                if delegate is not None:  # the delegate pass checked this very condition
                    raise InternalError(f"UpdateStateInPlace: {writer.name} writes state "
                                        f"{state.name} in place, and it is read after the call")
                continue  # the old value is read after the write: keep the copy
            value.replace_all_uses_with(state)  # the write's out, later readers, the output
            method.graph.erase_node(value)
            in_place.append(state.name)
        method.graph_module.recompile()
        method.notes["state_in_place"] = in_place
        return method


def _writer(value: torch.fx.Node, state: torch.fx.Node) -> torch.fx.Node | None:
    """The scatter node that writes ``value`` (its ``out``) from ``state`` (its ``self``)."""
    writers = [u for u in value.users if u.op == "call_function" and u.kwargs.get("out") is value]
    if len(writers) != 1 or writers[0].target not in IN_PLACE_WRITES:
        return None
    writer = writers[0]
    bound = bind_arguments(writer.target._schema, writer.args, writer.kwargs)
    others = [a for name, v in bound.items() if name not in ("self", "out")
              for a in (v if isinstance(v, (list, tuple)) else (v,))]
    if bound.get("self") is not state or any(a is state for a in others):
        return None  # the state is also the written source or an index: keep the copy
    return writer


def _delegate_writer(value: torch.fx.Node, state: torch.fx.Node) -> torch.fx.Node | None:
    """The delegate call whose output ``value`` is ``state``'s new value, written in place
    by the backend (``LoweredDelegate.state_writes``; ``export/delegated_state.py``)."""
    for user in value.users:
        if isinstance(user.target, DelegateOut):
            lowered = user.target.lowered
            n = lowered.num_inputs
            for output, position in lowered.state_writes.items():
                if user.args[n + output] is value and user.args[position] is state:
                    return user
    return None


def _same_tensor(state: torch.fx.Node, value: torch.fx.Node) -> bool:
    a, b = state.meta.get("val"), value.meta.get("val")
    return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
            and all(isinstance(s, int) for s in (*a.shape, *b.shape))
            and tuple(a.shape) == tuple(b.shape))

