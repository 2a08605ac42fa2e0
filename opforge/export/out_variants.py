"""Functional operator → out-variant operator, on torch's own schema objects.

An out variant is the overload of the same operator packet that takes its results as
keyword-only, write-aliased ``out`` arguments (``Tensor(a!) out``) and computes the same
function as the functional overload. Two overloads match when their non-out arguments
agree in name and type, except that the out variant may drop the tensor-options
keywords of a factory op (``dtype``, ``layout``, ``device``, ``pin_memory``): the out
tensor already carries them (e.g. ``aten::arange.start_step`` → ``aten::arange.start_out``).

Views (``permute``, ``view``, ``select.int``…) alias their input; the program has no
aliasing, so a view ``ns::X.ov`` becomes its copying twin ``ns::X_copy.ov`` first and
then that twin's out variant. torchgen generates the ``_copy`` twin for every view op.

This works on ``torch._C.FunctionSchema``; it is kept behind these few functions so that
it can move onto ``opforge.schema.FunctionSchema`` without touching the passes.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any

import torch

__all__ = [
    "OutVariant",
    "op_key",
    "is_out_schema",
    "is_view_schema",
    "is_mutating_schema",
    "out_argument_names",
    "find_out_variant",
    "suggest_out_schema",
    "suggest_functional_schema",
    "bind_arguments",
]

# Keyword arguments of factory ops that an out variant takes from its out tensor.
TENSOR_OPTIONS = frozenset({"dtype", "layout", "device", "pin_memory"})


@dataclass(frozen=True)
class OutVariant:
    """How one functional overload maps onto an out overload.

    ``out_names`` are the out overload's out arguments in schema order (one per result of
    the functional op); ``dropped`` the functional keywords the out variant does not take.
    ``via_copy`` is true when a view op went through its ``_copy`` twin.
    """

    functional: Any  # torch._ops.OpOverload
    out: Any  # torch._ops.OpOverload
    out_names: tuple[str, ...]
    dropped: frozenset[str]
    via_copy: bool


def op_key(op: Any) -> str:
    """The registry key of a torch ``OpOverload``, as the schema writes it:
    ``"aten::add.out"``, or ``"aten::relu"`` for the default overload (torch's ``.default``)."""
    overload = op._schema.overload_name
    return f"{op._schema.name}.{overload}" if overload else op._schema.name


def is_out_schema(schema: torch._C.FunctionSchema) -> bool:
    """True when the schema takes its results through ``out`` arguments."""
    return any(a.is_out for a in schema.arguments)


def is_mutating_schema(schema: torch._C.FunctionSchema) -> bool:
    """True when the schema writes to an argument that is not an ``out`` argument."""
    return any(a.alias_info is not None and a.alias_info.is_write and not a.is_out for a in schema.arguments)


def is_view_schema(schema: torch._C.FunctionSchema) -> bool:
    """True when a result aliases an argument without writing to it (a view)."""
    return any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns)


def out_argument_names(schema: torch._C.FunctionSchema) -> tuple[str, ...]:
    return tuple(a.name for a in schema.arguments if a.is_out)


def _signature(schema: torch._C.FunctionSchema, drop: frozenset[str] = frozenset()) -> tuple:
    return tuple(
        (a.name, str(a.type), a.kwarg_only)
        for a in schema.arguments
        if not a.is_out and a.name not in drop
    )


def _packet(op: Any, name: str) -> Any | None:
    namespace = getattr(torch.ops, op.namespace)
    try:
        return getattr(namespace, name)
    except (AttributeError, RuntimeError):
        return None


def _out_overload_of(op: Any) -> tuple[Any, frozenset[str]] | None:
    packet = _packet(op, op._schema.name.split("::", 1)[1])
    if packet is None:
        return None
    wanted = _signature(op._schema)
    options = frozenset(a.name for a in op._schema.arguments if a.name in TENSOR_OPTIONS and a.kwarg_only)
    relaxed = _signature(op._schema, options)
    results = len(op._schema.returns)
    for name in packet.overloads():
        candidate = getattr(packet, name)
        schema = candidate._schema
        if not is_out_schema(schema) or len(out_argument_names(schema)) != max(results, 1):
            continue
        mine = _signature(schema)
        if mine == wanted:
            return candidate, frozenset()
        if options and mine == relaxed:
            return candidate, options
    return None


@functools.lru_cache(maxsize=None)
def find_out_variant(op: Any) -> OutVariant | None:
    """The out variant of functional overload ``op`` (through its ``_copy`` twin for a
    view), or None when the operator has none."""
    if is_out_schema(op._schema):
        return OutVariant(op, op, out_argument_names(op._schema), frozenset(), False)
    from opforge.torch_bridge.library_ops import LIBRARY_NAMESPACES, ensure_registered

    if op.namespace in LIBRARY_NAMESPACES:
        # their out overloads are opforge's (torch, torchao, transformers define functional ones)
        ensure_registered(op.namespace)
    functional, via_copy = op, False
    if is_view_schema(op._schema):
        packet = _packet(op, op._schema.name.split("::", 1)[1] + "_copy")
        twin = getattr(packet, op._overloadname, None) if packet is not None else None
        if twin is None:
            return None
        functional, via_copy = twin, True
    found = _out_overload_of(functional)
    if found is None:
        return None
    out, dropped = found
    return OutVariant(op, out, out_argument_names(out._schema), dropped, via_copy)


def _split_schema_text(schema: torch._C.FunctionSchema) -> tuple[str, str, str]:
    """``("ns::op.overload", "argument text", "return text")`` of a schema."""
    text = str(schema)
    name, rest = text.split("(", 1)
    arguments, returns = rest.rsplit(") -> ", 1)
    return name, arguments, returns


def suggest_out_schema(schema: torch._C.FunctionSchema) -> str:
    """The out-variant schema an operator author should register, as text.

    ``my_ops::scale(Tensor x, float s) -> Tensor`` gives
    ``my_ops::scale.out(Tensor x, float s, *, Tensor(a!) out) -> Tensor(a!)``.
    """
    try:  # the opforge schema model derives it exactly
        from opforge.schema import FunctionSchema

        return str(FunctionSchema.parse(str(schema)).out_variant())
    except Exception:  # noqa: BLE001 - fall back to the simple derivation below
        pass
    name, arguments, _ = _split_schema_text(schema)
    base, _, overload = name.partition(".")
    results = len(schema.returns)
    letters = "abcdefghijklmnopqrstuvwxyz"
    outs = [f"Tensor({letters[i]}!) {'out' if results == 1 else f'out{i}'}" for i in range(results)]
    star = [] if any(a.kwarg_only for a in schema.arguments) else ["*"]
    rets = [f"Tensor({letters[i]}!)" for i in range(results)]
    ret_text = rets[0] if results == 1 else f"({', '.join(rets)})"
    parts = ([arguments] if arguments else []) + star + outs
    return f"{base}.{overload + '_out' if overload else 'out'}({', '.join(parts)}) -> {ret_text}"


def suggest_functional_schema(schema: torch._C.FunctionSchema) -> str:
    """A functional replacement for a mutating schema: written arguments become results.

    ``my_ops::bump(Tensor(a!) x) -> ()`` gives ``my_ops::bump_functional(Tensor x) -> Tensor``.
    """
    name, arguments, _ = _split_schema_text(schema)
    written = [a for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    plain = re.sub(r"\([a-z]+!?\)", "", arguments)
    results = "Tensor" if len(written) == 1 else f"({', '.join(['Tensor'] * len(written))})"
    return f"{name.partition('.')[0]}_functional({plain}) -> {results}"


_MISSING = object()


def bind_arguments(schema: torch._C.FunctionSchema, args: tuple, kwargs: dict) -> dict[str, Any]:
    """Map FX call arguments onto schema argument names (only those given)."""
    bound: dict[str, Any] = {}
    positional = [a for a in schema.arguments if not a.kwarg_only]
    if len(args) > len(positional):
        raise TypeError(f"{schema.name}: {len(args)} positional arguments, schema takes {len(positional)}")
    for arg, value in zip(positional, args):
        bound[arg.name] = value
    names = {a.name for a in schema.arguments}
    for key, value in kwargs.items():
        if key not in names:
            raise TypeError(f"{schema.name}: unknown keyword argument {key!r}")
        bound[key] = value
    return bound
