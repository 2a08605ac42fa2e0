"""Out-variant derivation (both ways), the variant signature, and the export check.

A program file is a dataflow graph in which each tensor is written once, by the kernel
that produces it, into memory planned ahead of time. So every call is emitted as an *out
variant*: the functional arguments plus keyword-only ``Tensor(a!)`` arguments that the
kernel writes into. Functional → out follows ATen's convention:

* one return:      ``f(Tensor x) -> Tensor``  →  ``f.out(Tensor x, *, Tensor(a!) out) -> Tensor(a!)``
* several returns: ``out0, out1, ...`` with distinct alias sets ``a, b, ...``
  (named returns keep their names: ``(Tensor values, Tensor indices)``)
* ``Tensor[]`` return: ``*, Tensor(a!)[] out`` and ``-> ()``.

The overload becomes ``out`` (no overload) or ``<overload>_out``.
"""

from __future__ import annotations

from dataclasses import replace

from opforge.errors import SchemaError
from opforge.schema.model import (
    Annotation,
    Argument,
    Arguments,
    BaseType,
    FunctionSchema,
    ListType,
    OperatorName,
    Return,
    SchemaKind,
    Type,
)

__all__ = ["out_variant", "functional_variant", "signature", "check_exportable"]

_TENSOR = BaseType("Tensor")
_TENSOR_LIST = ListType(_TENSOR)


def _alias_names(count: int, taken: set[str]) -> list[str]:
    names, i = [], 0
    while len(names) < count:
        n, s = i, ""
        while True:  # a, b, ..., z, aa, ab, ...
            s = chr(ord("a") + n % 26) + s
            n = n // 26 - 1
            if n < 0:
                break
        if s not in taken:
            names.append(s)
        i += 1
    return names


def _used_alias_names(schema: FunctionSchema) -> set[str]:
    used: set[str] = set()
    for item in (*schema.arguments.flat, *schema.returns):
        if item.annotation is not None:
            used.update(item.annotation.alias_set, item.annotation.alias_set_after)
    return used


def out_variant(schema: FunctionSchema) -> FunctionSchema:
    """Derive the ``.out`` overload of a functional schema."""
    where = f"`FunctionSchema.out_variant`: {schema.name}"
    kind = schema.kind()
    if kind is SchemaKind.out:
        return schema
    if kind is not SchemaKind.functional:
        raise SchemaError(f"{where} — it mutates its input, so it has no derived out variant; "
                          "define the functional form and derive from that")
    if schema.is_view():
        raise SchemaError(
            f"{where} — it is a view (returns an alias of an input), and a view writes nothing; "
            f"define a copying `{schema.name.name}_copy` functional op and derive its out variant"
        )
    if not schema.returns:
        raise SchemaError(f"{where} — it returns nothing (`-> ()`), so there is nothing to write into "
                          "an out argument; return the result tensor(s) instead")
    for r in schema.returns:
        if r.type not in (_TENSOR, _TENSOR_LIST):
            raise SchemaError(
                f"{where} — return type '{r.type}' cannot be an out argument: out variants write "
                "into preallocated tensors (Tensor or Tensor[]), and a "
                f"'{r.type}' is not one — return a Tensor (e.g. a 0-dim tensor) instead"
            )
    if any(r.type == _TENSOR_LIST for r in schema.returns) and len(schema.returns) > 1:
        raise SchemaError(f"{where} — a Tensor[] return can only be the sole return to derive an "
                          "out variant (ATen's rule: `*, Tensor(a!)[] out) -> ()`)")
    taken_args = {a.name for a in schema.arguments.flat}
    if len(schema.returns) == 1:
        names = [schema.returns[0].name or "out"]
    else:
        names = [r.name or f"out{i}" for i, r in enumerate(schema.returns)]
    for n in names:
        if n in taken_args:
            raise SchemaError(f"{where} — an input argument is already called '{n}', which the "
                              "out argument needs; rename that input")
    aliases = _alias_names(len(names), _used_alias_names(schema))
    outs = tuple(
        Argument(n, r.type, None, Annotation((al,), True))
        for n, r, al in zip(names, schema.returns, aliases)
    )
    if schema.returns[0].type == _TENSOR_LIST:
        returns: tuple[Return, ...] = ()
    elif len(schema.returns) == 1:
        returns = (Return(_TENSOR, schema.returns[0].name, outs[0].annotation),)
    else:
        returns = tuple(Return(_TENSOR, r.name, o.annotation) for r, o in zip(schema.returns, outs))
    ov = schema.name.overload
    name = replace(schema.name, overload=f"{ov}_out" if ov else "out")
    args = Arguments(schema.arguments.positional, schema.arguments.kwarg_only + outs)
    return FunctionSchema(name, args, returns)


def functional_variant(schema: FunctionSchema) -> FunctionSchema:
    """Derive the functional overload of an out schema (the inverse of :func:`out_variant`)."""
    if schema.kind() is SchemaKind.functional:
        return schema
    if schema.kind() is not SchemaKind.out:
        raise SchemaError(
            f"`FunctionSchema.functional_variant`: {schema.name} — it is {schema.kind().value}, "
            "not an out variant; only out variants have a derived functional form"
        )
    outs = schema.arguments.out
    kw = tuple(a for a in schema.arguments.kwarg_only if not a.is_write)
    if len(outs) == 1 and outs[0].type == _TENSOR_LIST:
        returns: tuple[Return, ...] = (Return(_TENSOR_LIST),)
    else:
        returns = tuple(
            Return(o.type, _return_name(schema, i, o, len(outs)))
            for i, o in enumerate(outs)
        )
    ov = schema.name.overload
    if ov == "out":
        ov = ""
    elif ov.endswith("_out"):
        ov = ov[: -len("_out")]
    name = OperatorName(schema.name.namespace, schema.name.name, ov)
    return FunctionSchema(name, Arguments(schema.arguments.positional, kw), returns)


def _return_name(schema: FunctionSchema, i: int, out: Argument, n: int) -> str | None:
    """Out names that were derived (``out``, ``out0``...) become unnamed returns again."""
    if (n == 1 and out.name == "out") or out.name == f"out{i}":
        return None
    if len(schema.returns) == n and schema.returns[i].name is not None:
        return schema.returns[i].name
    return None if n == 1 else out.name


_TENSOR_OPTIONS = {
    ("dtype", "ScalarType?"), ("layout", "Layout?"), ("device", "Device?"), ("pin_memory", "bool?"),
}


def _plain(t: Type) -> str:
    return str(t)


def signature(schema: FunctionSchema) -> tuple:
    """A key equal for a functional schema and its out variant (names and annotations aside).

    Used to find an op's existing out overload among its overloads (ATen names them
    irregularly: ``add.Tensor`` ↔ ``add.out``, ``sum.dim_IntList`` ↔ ``sum.IntList_out``).
    """
    if schema.kind() is SchemaKind.out:
        results = tuple(_plain(a.type) for a in schema.arguments.out)
    else:
        results = tuple(_plain(r.type) for r in schema.returns)
    # ATen's out variants of factory ops drop the TensorOptions (the out tensor carries them):
    # `arange.start_step(..., *, ScalarType? dtype=None, Layout? layout=None, ...)` ↔
    # `arange.start_out(..., *, Tensor(a!) out)`.
    args = tuple(
        (a.name, _plain(a.type), a.default)
        for a in schema.arguments.non_out
        if not (a in schema.arguments.kwarg_only and (a.name, _plain(a.type)) in _TENSOR_OPTIONS)
    )
    return (schema.name.namespace or "aten", schema.name.name, args, results)


def check_exportable(schema: FunctionSchema, *, out_name: str | None = None) -> None:
    """Refuse ops that mutate their inputs: a program's tensors are written only by their producer."""
    kind = schema.kind()
    if kind not in (SchemaKind.inplace, SchemaKind.mutable):
        return
    mutated = ", ".join(f"'{a.name}'" for a in schema.arguments.flat if a.is_write) or "'self'"
    if out_name is None:
        out_name = _guess_out_name(schema)
    if out_name.startswith("aten::") or schema.name.namespace in (None, "aten"):
        fix = f"use the out variant `{out_name}` (or the functional op and assign its result)"
    else:
        base = out_name.rsplit(".", 1)[0]
        fix = (f"define the functional op `{base}(...) -> Tensor` that returns a new tensor; "
               f"its out variant `{out_name}` is then derived and exported")
    raise SchemaError(
        f"`export`: {schema.name} — mutates its argument {mutated} in place — a program file is a "
        "dataflow graph in which each tensor is written once, by the kernel that produces it, into "
        "memory planned ahead of time, so in-place and mutating ops cannot be exported — "
        f"{fix}"
    )


def _guess_out_name(schema: FunctionSchema) -> str:
    from opforge.schema.native_functions import find_out_variant

    base = schema.name.name
    if schema.name.is_inplace:
        base = base[2:-2].removeprefix("i") if base.startswith("__") else base[:-1]
        base = f"__{base}__" if schema.name.name.startswith("__") else base
    ns = schema.name.namespace or "aten"
    found = find_out_variant(ns, base, schema)
    if found is not None:
        return found
    return f"{ns}::{base}.{schema.name.overload + '_out' if schema.name.overload else 'out'}"
