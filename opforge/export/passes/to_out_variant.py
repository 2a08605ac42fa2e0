"""Functional → out variant: every operator call writes into a planned ``alloc``.

For each call ``y = op(x, ...)`` the pass inserts one ``alloc`` node per result (sizes
and dtype from the node's fake value) and replaces the call by
``op.out(x, ..., out=alloc)``; users of ``y`` (and of ``getitem(y, i)`` for ops with
several results) then read the ``alloc`` nodes, and the ``getitem`` nodes disappear.
Views go through their ``_copy`` twin (``permute`` → ``permute_copy.out``), so no two
values of the program alias. Results nobody reads (the mean/rstd of a layer norm) still
get an ``alloc``: the out variant writes them.

An operator without an out variant is collected; at the end one ``ExportError`` lists
every such operator with the schema of the out variant to register.

``as_strided`` is the one view that reads its input's *storage* rather than its elements;
:func:`_rebase_as_strided` makes it read the input's own elements or refuses it.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx

from opforge.errors import ExportError
from opforge.export.lowered import DelegateOut, LoweredDelegate
from opforge.export.diagnostics import describe_node
from opforge.export.method_graph import MethodGraph, alloc, is_size_read
from opforge.export.out_variants import OutVariant, bind_arguments, find_out_variant, op_key, suggest_out_schema
from opforge.export.pass_manager import ExportPass

__all__ = ["ToOutVariant"]


def _fake_results(node: torch.fx.Node) -> list[Any]:
    val = node.meta.get("val")
    return list(val) if isinstance(val, (tuple, list)) else [val]


def _new_alloc(graph: torch.fx.Graph, source: torch.fx.Node, fake: Any, name: str) -> torch.fx.Node:
    if not isinstance(fake, torch.Tensor):
        raise ExportError(
            f"`opforge.export.export()`: {describe_node(source)} — result {name} is {type(fake).__name__}, "
            "not a tensor — valid: operators returning tensors — fix: keep Python scalars out of the "
            "exported computation (no .item(), no tensor-valued shapes)"
        )
    # symbolic sizes: the alloc node carries the sizes at the export example (the graph stays
    # runnable by torch there); the fake value keeps the SymInts the emitter expresses
    sizes = tuple(s if isinstance(s, int) else _hint(s) for s in fake.shape)
    node = graph.create_node("call_function", alloc, (sizes, fake.dtype), {}, name=name)
    node.meta["val"] = fake
    node.meta["stack_trace"] = source.meta.get("stack_trace")
    return node


def _hint(size: Any) -> int:
    if getattr(size.node, "hint", None) is not None:
        return int(size.node.hint)
    if size.node.expr.free_symbols and not size.node.has_hint():
        # a data-dependent size (unbacked: no example value): its upper bound
        return int(size.node.shape_env.bound_sympy(size.node.expr).upper)
    return int(size)


def _out_call(graph: torch.fx.Graph, node: torch.fx.Node, variant: OutVariant) -> list[Any]:
    """Insert allocs and the out call before ``node``; returns the alloc of each result
    (of each list item for a ``Tensor[]`` result), in order."""
    functional = variant.functional._schema
    bound = bind_arguments(functional, node.args, node.kwargs)
    for name in variant.dropped:
        bound.pop(name, None)
    fakes = _fake_results(node)
    results: list[Any] = []
    out_kwargs: dict[str, Any] = {}
    list_result = len(functional.returns) == 1 and isinstance(functional.returns[0].type, torch.ListType)
    with graph.inserting_before(node):
        if list_result:
            items = [_new_alloc(graph, node, fake, f"{node.name}_out{i}") for i, fake in enumerate(fakes)]
            out_kwargs[variant.out_names[0]] = items
            results.extend(items)
        else:
            for i, (out_name, fake) in enumerate(zip(variant.out_names, fakes)):
                suffix = "" if len(fakes) == 1 else str(i)
                results.append(_new_alloc(graph, node, fake, f"{node.name}_out{suffix}"))
                out_kwargs[out_name] = results[-1]
        args: list[Any] = []
        kwargs: dict[str, Any] = {}
        for arg in variant.out._schema.arguments:
            if arg.is_out or arg.name not in bound:
                continue  # out arguments are added below; defaults are filled by the emitter
            positional = not arg.kwarg_only and not kwargs and len(args) == _positional_index(variant.out._schema, arg.name)
            if positional:
                args.append(bound[arg.name])
            else:
                kwargs[arg.name] = bound[arg.name]
        kwargs.update(out_kwargs)
        call = graph.create_node("call_function", variant.out, tuple(args), kwargs, name=f"{node.name}_call")
    call.meta.update({k: v for k, v in node.meta.items() if k in ("stack_trace", "nn_module_stack", "val", "debug_handle")})
    call.meta["functional_target"] = op_key(node.target)
    return results


# as_strided's sizes, strides and offset count elements of its input's storage in ATen. In
# a program every value is its own C-contiguous buffer, and the out variant reads its
# input's elements in row-major order (opforge/kernels/portable/view_copy.py). The two
# readings agree when the input is contiguous (size-1 dimensions aside) and every element
# read lies within it; an explicit offset is absolute in ATen, so it is rebased by the
# input's own storage offset. Anything else would run and silently read other elements:
# it is refused. ``adaptive_avg_pool2d(x, 1)`` of a channels-last ``x`` restrides a fresh
# ``mean`` result this way, which always passes.
_STORAGE_RELATIVE = (torch.ops.aten.as_strided.default, torch.ops.aten.as_strided_copy.default)


def _rebase_as_strided(node: torch.fx.Node) -> None:
    """Rebase ``node``'s explicit storage offset onto its input, or raise ``ExportError``
    when ATen would read storage outside the input's own elements."""
    bound = bind_arguments(node.target._schema, node.args, node.kwargs)
    source = bound["self"].meta.get("val") if isinstance(bound["self"], torch.fx.Node) else None
    size, stride, offset = list(bound["size"]), list(bound["stride"]), bound.get("storage_offset")
    if not isinstance(source, torch.Tensor) or not all(
            isinstance(v, int) for v in [*size, *stride, *source.shape, *source.stride(),
                                         source.storage_offset(), offset or 0]):
        return  # symbolic sizes: refused when the result is planned
    base = source.storage_offset()
    start = (base if offset is None else offset) - base
    if 0 in size:
        start = max(start, 0)  # an empty result reads nothing
    else:
        reach = start + sum((n - 1) * s for n, s in zip(size, stride))
        problem = None
        if not source.is_contiguous():
            problem = f"an input of strides {tuple(source.stride())}, not contiguous"
        elif start < 0 or reach >= source.numel():
            problem = (f"storage elements {base + start}..{base + reach} around an input "
                       f"holding {base}..{base + source.numel() - 1}")
        if problem is not None:
            raise ExportError(
                f"`opforge.export.export()`: {describe_node(node)} — as_strided(size={size}, "
                f"stride={stride}, storage_offset={offset}) reads {problem} — valid: "
                "as_strided within a contiguous tensor's own elements (a program gives every "
                "value its own buffer) — fix: 1. call .contiguous() before .as_strided(...); "
                "2. or write the view with view/permute/slice/expand"
            )
    if offset is not None and start != offset:
        if "storage_offset" in node.kwargs:
            node.kwargs = {**node.kwargs, "storage_offset": start}
        else:
            node.args = (*node.args[:3], start, *node.args[4:])


def _delegate_out_call(graph: torch.fx.Graph, node: torch.fx.Node) -> None:
    """``delegate(inputs...)`` → allocs for its outputs + ``DelegateOut(inputs..., outs...)``."""
    lowered = node.target
    with graph.inserting_before(node):
        outs = [_new_alloc(graph, node, fake, f"{node.name}_out{i}")
                for i, fake in enumerate(_fake_results(node))]
        call = graph.create_node("call_function", DelegateOut(lowered), (*node.args, *outs), {},
                                 name=f"{node.name}_call")
    call.meta["val"] = node.meta.get("val")
    for user in list(node.users):
        user.replace_all_uses_with(outs[user.args[1]])
        graph.erase_node(user)
    graph.erase_node(node)


def _positional_index(schema: torch._C.FunctionSchema, name: str) -> int:
    return [a.name for a in schema.arguments if not a.kwarg_only].index(name)


class ToOutVariant(ExportPass):
    """Rewrite every operator call to its out overload writing into ``alloc`` nodes."""

    requires = frozenset({"core_aten_or_custom", "functional", "assertion_free"})
    ensures = frozenset({"all_out_variants"})

    def run(self, method: MethodGraph) -> MethodGraph:
        graph = method.graph
        missing: dict[str, list[torch.fx.Node]] = {}
        for node in list(graph.nodes):
            if node.op != "call_function" or node.target is operator.getitem or \
                    is_size_read(node):  # emitted as a Move
                continue
            if isinstance(node.target, LoweredDelegate):
                _delegate_out_call(graph, node)
                continue
            variant = find_out_variant(node.target) if isinstance(node.target, torch._ops.OpOverload) else None
            if variant is None:
                missing.setdefault(str(node.target), []).append(node)
                continue
            if variant.out is node.target:
                raise ExportError(
                    f"`opforge.export.export()`: {describe_node(node)} — the model calls the out variant "
                    f"`{op_key(node.target)}` itself — valid: functional calls (export plans the out "
                    "tensors) — fix: call the functional overload"
                )
            if node.target in _STORAGE_RELATIVE:
                _rebase_as_strided(node)
            results = _out_call(graph, node, variant)
            for user in list(node.users):
                if user.target is operator.getitem:
                    user.replace_all_uses_with(results[user.args[1]])
                    graph.erase_node(user)
            if node.users:  # a single-tensor result read directly
                node.replace_all_uses_with(results[0])
            graph.erase_node(node)
        if missing:
            raise _missing_out_variants(method, missing)
        graph.lint()
        return method


def _missing_out_variants(method: MethodGraph, missing: dict[str, list[torch.fx.Node]]) -> ExportError:
    lines = []
    for i, (target, nodes) in enumerate(sorted(missing.items()), 1):
        op = nodes[0].target
        schema = getattr(op, "_schema", None)
        used = ", ".join(describe_node(n) for n in nodes[:3]) + (f" and {len(nodes) - 3} more" if len(nodes) > 3 else "")
        if schema is None:
            fix = "replace it with operators (it is not an operator overload)"
        elif not all(isinstance(r.type, torch.TensorType) for r in schema.returns) or not schema.returns:
            fix = "compute the value inside another op: results that are not tensors cannot be planned"
        elif op.namespace != "aten":
            fix = _library_op_fix(op, schema)
        else:
            fix = f"register the out overload `{suggest_out_schema(schema)}` (opforge derives it from the functional schema in the op manifest)"
        lines.append(f"  {i}. `{op_key(op) if schema is not None else target}` used by {used} — fix: {fix}")
    return ExportError(
        f"`opforge.export.export()`: method {method.name!r} — {len(missing)} operator(s) without an out "
        "variant — valid: every operator has an out overload (`Tensor(a!) out`) the program can call — "
        "fix each:\n" + "\n".join(lines)
    )


def _library_op_fix(op: Any, schema: torch._C.FunctionSchema) -> str:
    """The fixes for another library's functional op: its only implementation is a kernel
    for a device (Python or C++), which export does not trace into the program
    (``passes/decompose.py`` says why)."""
    name = f"torch.ops.{op.namespace}.{op._schema.name.split('::', 1)[1]}.{op._overloadname}"
    return (
        "its implementation is a device kernel (Python or C++), which a program cannot "
        "carry and opforge does not trace (it may read the data: .tolist(), NumPy, loops) — "
        f"1. give torch a decomposition written with torch ops, "
        f"`torch._decomp.register_decomposition({name})(fn)` or a CompositeImplicitAutograd "
        "kernel, imported before export: opforge decomposes the op at export; 2. or add the op "
        f"to an op manifest with its out overload `{suggest_out_schema(schema)}` and a kernel "
        "for each runtime (docs/manifest.md)")
