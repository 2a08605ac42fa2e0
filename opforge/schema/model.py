"""The ATen function-schema model: frozen dataclasses that print back to the exact string.

A schema such as ``aten::add.out(Tensor self, Tensor other, *, Scalar alpha=1,
Tensor(a!) out) -> Tensor(a!)`` is an :class:`OperatorName`, an :class:`Arguments`
(positional, then keyword-only after ``*``) and a tuple of :class:`Return`. Types are a
small algebra: a :class:`BaseType` (``Tensor``, ``int``, ``Scalar``...), wrapped by
:class:`OptionalType` (``T?``) and :class:`ListType` (``T[]``, ``T[2]``). Aliasing
annotations (``(a!)``, ``(a)``, ``(a -> *)``) belong to the argument or return, and are
printed right after the base type's name, as ATen writes them (``Tensor(a!)[]``).

Every class checks its invariants in ``__post_init__``; ``str()`` of every class is the
canonical ATen spelling, and :func:`opforge.schema.parse_schema` asserts that it
reproduces its input exactly.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from opforge.errors import InternalError

__all__ = [
    "BASE_TYPES",
    "Annotation",
    "Argument",
    "Arguments",
    "BaseType",
    "FunctionSchema",
    "ListType",
    "OperatorName",
    "OptionalType",
    "Return",
    "SchemaKind",
    "Type",
]

# Every base type name ATen's schema grammar knows (torchgen's BaseTy, plus `complex`).
BASE_TYPES = frozenset(
    {
        "Tensor", "int", "SymInt", "SymBool", "float", "bool", "str", "complex",
        "Scalar", "ScalarType", "Layout", "Device", "DeviceIndex", "MemoryFormat",
        "Generator", "Dimname", "DimVector", "QScheme", "Storage", "Stream",
        "ConstQuantizerPtr", "GraphModule", "Any",
    }
)

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


class SchemaKind(enum.Enum):
    """How an operator treats its arguments (torchgen's classification)."""

    functional = "functional"  # returns fresh tensors, mutates nothing
    out = "out"  # writes into keyword-only `Tensor(a!) out` arguments
    inplace = "inplace"  # `add_`: mutates `self` and returns it
    mutable = "mutable"  # mutates some other positional argument


@dataclass(frozen=True)
class Annotation:
    """An aliasing annotation: ``a``, ``a!``, ``a|b``, ``a -> *``."""

    alias_set: tuple[str, ...]
    is_write: bool = False
    alias_set_after: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.alias_set:
            raise InternalError("Annotation needs at least one alias set name")

    def __str__(self) -> str:
        s = "|".join(self.alias_set) + ("!" if self.is_write else "")
        if self.alias_set_after:
            s += " -> " + "|".join(self.alias_set_after)
        return s


@dataclass(frozen=True)
class BaseType:
    name: str

    def __post_init__(self) -> None:
        if self.name not in BASE_TYPES:
            raise InternalError(f"unknown base type {self.name!r}")

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class OptionalType:
    elem: "Type"

    def __post_init__(self) -> None:
        if isinstance(self.elem, OptionalType):
            raise InternalError("Optional of Optional is not a schema type")

    def __str__(self) -> str:
        return f"{self.elem}?"


@dataclass(frozen=True)
class ListType:
    elem: "Type"
    size: int | None = None

    def __post_init__(self) -> None:
        if self.size is not None and self.size < 1:
            raise InternalError(f"list size must be >= 1, got {self.size}")

    def __str__(self) -> str:
        return f"{self.elem}[{'' if self.size is None else self.size}]"


Type = BaseType | OptionalType | ListType


def base_of(t: Type) -> BaseType:
    """The innermost base type: ``Tensor?[]`` → ``Tensor``."""
    while not isinstance(t, BaseType):
        t = t.elem
    return t


def is_tensor_like(t: Type) -> bool:
    return base_of(t).name == "Tensor"


def _annotated(t: Type, annotation: Annotation | None) -> str:
    text = str(t)
    if annotation is None:
        return text
    base = base_of(t).name
    return text.replace(base, f"{base}({annotation})", 1)


def _check_name(kind: str, name: str) -> None:
    if not _IDENT.match(name):
        raise InternalError(f"{kind} name {name!r} is not an identifier")


@dataclass(frozen=True)
class Argument:
    """One argument: ``Tensor(a!) out``, ``int dim=-1``, ``Tensor? weight=None``."""

    name: str
    type: Type
    default: str | None = None  # the default exactly as written (validated by the parser)
    annotation: Annotation | None = None

    def __post_init__(self) -> None:
        _check_name("argument", self.name)

    @property
    def is_write(self) -> bool:
        return self.annotation is not None and self.annotation.is_write

    def __str__(self) -> str:
        default = "" if self.default is None else f"={self.default}"
        return f"{_annotated(self.type, self.annotation)} {self.name}{default}"


@dataclass(frozen=True)
class Return:
    """One return: ``Tensor``, ``Tensor(a!)``, ``Tensor values``."""

    type: Type
    name: str | None = None
    annotation: Annotation | None = None

    def __post_init__(self) -> None:
        if self.name is not None:
            _check_name("return", self.name)

    @property
    def is_write(self) -> bool:
        return self.annotation is not None and self.annotation.is_write

    def __str__(self) -> str:
        text = _annotated(self.type, self.annotation)
        return text if self.name is None else f"{text} {self.name}"


@dataclass(frozen=True)
class Arguments:
    """Positional arguments, then keyword-only ones (after ``*``)."""

    positional: tuple[Argument, ...] = ()
    kwarg_only: tuple[Argument, ...] = ()

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for arg in self.flat:
            if arg.name in seen:
                raise InternalError(f"duplicate argument name {arg.name!r}")
            seen.add(arg.name)

    @property
    def flat(self) -> tuple[Argument, ...]:
        """All arguments in schema order (the order a kernel receives them)."""
        return self.positional + self.kwarg_only

    @property
    def out(self) -> tuple[Argument, ...]:
        """The out arguments: keyword-only and written to (``*, Tensor(a!) out``)."""
        return tuple(a for a in self.kwarg_only if a.is_write)

    @property
    def non_out(self) -> tuple[Argument, ...]:
        return tuple(a for a in self.flat if not (a.is_write and a in self.kwarg_only))

    def __str__(self) -> str:
        parts = [str(a) for a in self.positional]
        if self.kwarg_only:
            parts.append("*")
            parts.extend(str(a) for a in self.kwarg_only)
        return ", ".join(parts)


@dataclass(frozen=True)
class OperatorName:
    """``namespace::name.overload``; the namespace is None for ATen-style bare names."""

    namespace: str | None
    name: str
    overload: str = ""

    def __post_init__(self) -> None:
        if self.namespace is not None:
            _check_name("namespace", self.namespace)
        _check_name("operator", self.name)
        if self.overload:
            _check_name("overload", self.overload)

    @property
    def is_inplace(self) -> bool:
        """ATen's naming rule: ``add_`` and ``__iand__`` mutate their first argument."""
        if self.name.startswith("__") and self.name.endswith("__"):
            return self.name.startswith("__i") and self.name not in {"__init__"}
        return self.name.endswith("_") and not self.name.endswith("__")

    @property
    def qualified(self) -> str:
        """``ns::name.overload`` with ``aten`` as the default namespace (a registry key)."""
        ns = self.namespace or "aten"
        return f"{ns}::{self.name}.{self.overload or 'default'}"

    def __str__(self) -> str:
        ns = f"{self.namespace}::" if self.namespace else ""
        ov = f".{self.overload}" if self.overload else ""
        return f"{ns}{self.name}{ov}"


@dataclass(frozen=True)
class FunctionSchema:
    """An ATen function schema. ``str(FunctionSchema.parse(s)) == s``.

    >>> s = FunctionSchema.parse("my_ops::mul3(Tensor input) -> Tensor")
    >>> str(s.out_variant())
    'my_ops::mul3.out(Tensor input, *, Tensor(a!) out) -> Tensor(a!)'
    """

    name: OperatorName
    arguments: Arguments
    returns: tuple[Return, ...]

    def __post_init__(self) -> None:
        if not all(isinstance(r, Return) for r in self.returns):
            raise InternalError("returns must be Return objects")

    # -- parsing and printing -------------------------------------------------------
    @staticmethod
    def parse(text: str, *, api: str = "FunctionSchema.parse") -> "FunctionSchema":
        """Parse an ATen schema string; ``api`` names the caller in error messages."""
        from opforge.schema.parser import parse_schema

        return parse_schema(text, api=api)

    def __str__(self) -> str:
        if len(self.returns) == 1:
            rets = str(self.returns[0])
        else:
            rets = "(" + ", ".join(str(r) for r in self.returns) + ")"
        return f"{self.name}({self.arguments}) -> {rets}"

    # -- classification ---------------------------------------------------------------
    def kind(self) -> SchemaKind:
        """functional, out, inplace or mutable (see :class:`SchemaKind`)."""
        if self.arguments.out:
            return SchemaKind.out
        if not any(a.is_write for a in self.arguments.flat):
            return SchemaKind.functional  # a trailing `_` alone mutates nothing
        return SchemaKind.inplace if self.name.is_inplace else SchemaKind.mutable

    def is_functional(self) -> bool:
        return self.kind() is SchemaKind.functional

    def is_out_variant(self) -> bool:
        return self.kind() is SchemaKind.out

    def is_mutating(self) -> bool:
        """True for in-place and other mutating ops that are not out variants."""
        return self.kind() in (SchemaKind.inplace, SchemaKind.mutable)

    def is_view(self) -> bool:
        """A view returns an alias of an input without writing it (``Tensor(a)``)."""
        return any(r.annotation is not None and not r.is_write for r in self.returns)

    @property
    def mutated_arguments(self) -> tuple[Argument, ...]:
        return tuple(a for a in self.arguments.flat if a.is_write)

    # -- variants (implemented in opforge.schema.variants) -----------------------------
    def out_variant(self) -> "FunctionSchema":
        from opforge.schema.variants import out_variant

        return out_variant(self)

    def functional_variant(self) -> "FunctionSchema":
        from opforge.schema.variants import functional_variant

        return functional_variant(self)

    def signature(self) -> tuple:
        from opforge.schema.variants import signature

        return signature(self)

    def check_exportable(self) -> None:
        from opforge.schema.variants import check_exportable

        check_exportable(self)

