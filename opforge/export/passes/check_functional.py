"""Reject what the program format cannot express: mutation and control-flow operators;
turn buffer updates into program state.

After decomposition torch has functionalized the graph: ``x.add_(1)`` on an input is an
``add`` plus a *user-input mutation* output, a custom op with a ``Tensor(a!)`` argument
is wrapped in ``auto_functionalized``. A program has no way to write back into a
caller's tensor, so each of these is an ``ExportError``, all reported at once.

A buffer update (``self.cache.index_copy_(...)``, ``self.count.add_(1)``) is a *buffer
mutation* output: the buffer becomes program state (its placeholder kind ``STATE``; notes
``state``: placeholder → buffer name, ``state_outputs``: output position → placeholder),
and the emitter copies the new value into the state at the end of each call.
"""

from __future__ import annotations

import torch

from opforge.errors import ExportError
from opforge.export.diagnostics import describe_node
from opforge.export.method_graph import InputKind, MethodGraph
from opforge.export.out_variants import (
    is_mutating_schema, op_key, suggest_functional_schema, suggest_out_schema,
)
from opforge.export.pass_manager import ExportPass

__all__ = ["CheckFunctional"]

_API = "`opforge.export.export()`"


def _mutated_op_problem(node: torch.fx.Node) -> str:
    op = node.args[0] if node.args else None
    schema = getattr(op, "_schema", None)
    if schema is None:
        return f"{describe_node(node)} — mutates its arguments — fix: make the op functional"
    written = [a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    functional = suggest_functional_schema(schema)
    try:
        out = suggest_out_schema(torch._C.parse_schema(functional))
    except Exception:  # noqa: BLE001 - the out schema is a courtesy; the functional one is the fix
        out = "its derived .out overload"
    return (
        f"{describe_node(node)} — custom op `{op_key(op)}` writes to its argument(s) "
        f"{', '.join(written)} (`{schema}`) — valid: functional ops returning new tensors, plus their out "
        f"variants — fix: define the functional op `{functional}` with the out variant `{out}` "
        "(an op manifest derives the out variant) and use its result instead"
    )


class CheckFunctional(ExportPass):
    """Raise one ``ExportError`` listing every mutation or higher-order op in the method."""

    requires = frozenset({"core_aten_or_custom"})
    ensures = frozenset({"functional"})

    def run(self, method: MethodGraph) -> MethodGraph:
        problems: list[str] = []
        signature = method.exported.graph_signature
        nodes = {n.name: n for n in method.graph.nodes}
        for produced, user_input in signature.user_inputs_to_mutate.items():
            problems.append(
                f"{describe_node(nodes[produced])} — writes in place into the input `{user_input}` — "
                "valid: methods that leave their inputs unchanged — fix: use the out-of-place op "
                "(x = x.add(1) instead of x.add_(1)) and return the new value"
            )
        self._state(method, signature, nodes, problems)
        for node in method.call_nodes():
            target = node.target
            if isinstance(target, torch._ops.HigherOrderOperator):
                if "auto_functionalized" in target.name():
                    problems.append(_mutated_op_problem(node))
                else:
                    problems.append(
                        f"{describe_node(node)} — higher-order op `{target.name()}` — valid: straight-line "
                        "graphs of operators (control-flow operators are not in the program format yet) — "
                        "fix: make the computation branchless (torch.where) or export each branch as a method"
                    )
            elif isinstance(target, torch._ops.OpOverload) and is_mutating_schema(target._schema):
                problems.append(
                    f"{describe_node(node)} — `{op_key(target)}` mutates an argument — "
                    "valid: functional ops — fix: use its functional variant"
                )
        if problems:
            listed = "\n".join(f"  {i}. {p}" for i, p in enumerate(problems, 1))
            raise ExportError(
                f"{_API}: method {method.name!r} — {len(problems)} mutation(s) the program format cannot "
                f"express:\n{listed}"
            )
        # User-input mutation outputs are refused and buffer mutation outputs are noted as
        # state; the ExportedProgram is not needed any more.
        method.exported = None
        return method

    @staticmethod
    def _state(method: MethodGraph, signature, nodes, problems: list[str]) -> None:
        from torch.export.graph_signature import InputKind as TorchInputKind, OutputKind

        placeholders = {spec.target: spec.arg.name for spec in signature.input_specs
                        if spec.kind == TorchInputKind.BUFFER}
        state: dict[str, str] = {}
        outputs: dict[int, str] = {}
        for position, spec in enumerate(signature.output_specs):
            if spec.kind != OutputKind.BUFFER_MUTATION:
                continue
            placeholder = placeholders.get(spec.target)
            buffer = method.notes.get("buffer_names", {}).get(placeholder, spec.target)
            if placeholder is None or placeholder in state:
                problems.append(
                    f"{describe_node(nodes[spec.arg.name])} — updates the buffer `{buffer}`, "
                    "which is not a plain registered buffer of the module (or is updated twice)"
                    " — valid: buffers registered with register_buffer, each updated once per "
                    "call — fix: register the buffer, and keep one update per call")
                continue
            state[placeholder] = buffer
            outputs[position] = placeholder
            method.input_kinds[placeholder] = InputKind.STATE
        method.notes["state"] = state
        method.notes["state_outputs"] = outputs
