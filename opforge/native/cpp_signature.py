"""From an out schema to the C++ kernel signature a library author writes.

The mapping follows ExecuTorch's kernel signatures (``Tensor& mul3_out_impl(
KernelRuntimeContext& ctx, const Tensor& in, Tensor& out)``), spelled with opforge's
types. Each argument also gets its ABI parameter kind (``opforge.native.abi``) and the
C++ expression the generated glue uses to unbox it from ``opforge_arg args[i]``.

============================  =====================================  ==================
schema type                   C++ parameter                          ABI kind
============================  =====================================  ==================
``Tensor``                    ``const opforge::Tensor&``             TENSOR
``Tensor(a!)`` (out)          ``opforge::Tensor&``                   TENSOR | OUT
``Tensor?``                   ``const opforge::optional<Tensor>&``   TENSOR | OPTIONAL
``Tensor[]``, out ``[]``      ``opforge::TensorList``                TENSOR_LIST
``Tensor?[]``                 ``opforge::ArrayRef<optional<Tensor>>`` OPT_TENSOR_LIST
``int``, ``SymInt``           ``int64_t``                            INT
``float``                     ``double``                             DOUBLE
``bool``                      ``bool``                               BOOL
``Scalar``                    ``const opforge::Scalar&``             SCALAR
``ScalarType``                ``opforge::ScalarType``                SCALAR_TYPE
``int[]``, ``SymInt[N]``      ``opforge::IntArrayRef``               INT_LIST
``float[]``                   ``opforge::ArrayRef<double>``          DOUBLE_LIST
``bool[]``                    ``opforge::ArrayRef<bool>``            BOOL_LIST
``str``                       ``opforge::string_view``               STRING
``T?`` (non-tensor)           ``opforge::optional<T>``               kind | OPTIONAL
============================  =====================================  ==================
"""

from __future__ import annotations

from dataclasses import dataclass

from opforge.native.abi import KIND_OPTIONAL, KIND_OUT, KIND_SCALAR, ArgTag
from opforge.errors import BuildError
from opforge.manifest import OpDef
from opforge.schema import Argument, BaseType, FunctionSchema, ListType, OptionalType

__all__ = ["CppArg", "CppSignature", "cpp_signature", "renamed_parameters"]

_T = "opforge::"
# base type name -> (C++ type, kind, unboxing expression of `a`, the opforge_arg)
_SCALARS = {
    "int": ("int64_t", ArgTag.INT, "{a}.v.i"),
    "SymInt": ("int64_t", ArgTag.INT, "{a}.v.i"),
    "float": ("double", ArgTag.DOUBLE, "{a}.v.d"),
    "bool": ("bool", ArgTag.BOOL, "({a}.v.i != 0)"),
    "ScalarType": (f"{_T}ScalarType", ArgTag.SCALAR_TYPE, f"static_cast<{_T}ScalarType>({{a}}.v.i)"),
    "str": (f"{_T}string_view", ArgTag.STRING,
            f"{_T}string_view(static_cast<const char*>({{a}}.v.list.data), static_cast<size_t>({{a}}.v.list.size))"),
}
_LISTS = {
    "int": (f"{_T}IntArrayRef", ArgTag.INT_LIST, f"{_T}detail::to_list<int64_t>({{a}})"),
    "SymInt": (f"{_T}IntArrayRef", ArgTag.INT_LIST, f"{_T}detail::to_list<int64_t>({{a}})"),
    "float": (f"{_T}ArrayRef<double>", ArgTag.DOUBLE_LIST, f"{_T}detail::to_list<double>({{a}})"),
    "bool": (f"{_T}ArrayRef<bool>", ArgTag.BOOL_LIST, f"{_T}detail::to_list<bool>({{a}})"),
}


@dataclass(frozen=True)
class CppArg:
    """One kernel parameter: its schema name, C++ type, ABI kind and unboxing code."""

    name: str
    cpp_type: str  # as declared, e.g. "const opforge::Tensor&"
    kind: int
    local_type: str  # the type of the glue's local variable
    unbox: str  # C++ expression of `{a}` (an opforge_arg) giving the local's value
    by_ref: bool = False  # the local is a reference into args (no copy)


@dataclass(frozen=True)
class CppSignature:
    """The C++ kernel an out overload expects: ``ret ns::native::fn(params)``."""

    namespace: str  # "custom::native"
    function: str  # "mul3_out_impl"
    returns: str  # "opforge::Tensor&", "std::tuple<opforge::Tensor&, opforge::Tensor&>", "void"
    args: tuple[CppArg, ...]

    @property
    def qualified(self) -> str:
        return f"{self.namespace}::{self.function}"

    def params(self, with_context: bool, names: bool = True) -> str:
        parts = [f"{a.cpp_type} {a.name}" if names else a.cpp_type for a in self.args]
        if with_context:
            parts.insert(0, f"{_T}KernelContext& ctx" if names else f"{_T}KernelContext&")
        return ", ".join(parts)

    def declaration(self, with_context: bool = True) -> str:
        """``opforge::Tensor& custom::native::mul3_out_impl(opforge::KernelContext& ctx, ...)``"""
        return f"{self.returns} {self.qualified}({self.params(with_context)})"


def cpp_signature(opdef: OpDef, cpp_name: str) -> CppSignature:
    """The C++ signature of kernel ``cpp_name`` (already in its ``native`` namespace)."""
    schema = opdef.out
    namespace, _, function = cpp_name.rpartition("::")
    args = tuple(_cpp_arg(opdef, a, a in schema.arguments.out) for a in schema.arguments.flat)
    return CppSignature(namespace, function, _returns(schema), args)


def _returns(schema: FunctionSchema) -> str:
    if not schema.returns:
        return "void"
    if len(schema.returns) == 1:
        return f"{_T}Tensor&"
    return "std::tuple<" + ", ".join(f"{_T}Tensor&" for _ in schema.returns) + ">"


def _unsupported(opdef: OpDef, arg: Argument) -> BuildError:
    return BuildError(
        f"`opforge build`: {opdef.source}: {opdef.out_key} — argument '{arg.name}' has type "
        f"{arg.type}, which the native kernel ABI does not carry — supported: Tensor, Tensor?, "
        "Tensor[], Tensor?[], int, float, bool, Scalar, ScalarType, str, their lists and "
        "optionals — bind this op to a portable (Python) kernel, or drop the argument"
    )


def _cpp_arg(opdef: OpDef, arg: Argument, is_out: bool) -> CppArg:
    t, name = arg.type, _cpp_ident(arg.name)
    optional = isinstance(t, OptionalType)
    inner = t.elem if optional else t
    opt_bit = KIND_OPTIONAL if optional else 0
    if inner == BaseType("Tensor"):
        if optional:
            return CppArg(name, f"const {_T}optional<{_T}Tensor>&", ArgTag.TENSOR | opt_bit,
                          f"{_T}optional<{_T}Tensor>",
                          f"{_T}detail::none_or({{a}}, {_T}Tensor({{a}}.v.tensor))")
        if is_out:
            return CppArg(name, f"{_T}Tensor&", ArgTag.TENSOR | KIND_OUT, f"{_T}Tensor&",
                          f"{_T}Tensor::wrap({{a}}.v.tensor)", by_ref=True)
        return CppArg(name, f"const {_T}Tensor&", ArgTag.TENSOR, f"const {_T}Tensor&",
                      f"{_T}Tensor::wrap({{a}}.v.tensor)", by_ref=True)
    if isinstance(inner, ListType) and not optional:
        elem = inner.elem
        if elem == BaseType("Tensor"):
            kind = ArgTag.TENSOR_LIST | (KIND_OUT if is_out else 0)
            return CppArg(name, f"{_T}TensorList", kind, f"{_T}TensorList",
                          f"{_T}detail::to_tensor_list({{a}})")
        if elem == OptionalType(BaseType("Tensor")):
            return CppArg(name, f"{_T}ArrayRef<{_T}optional<{_T}Tensor>>", ArgTag.OPT_TENSOR_LIST,
                          f"std::vector<{_T}optional<{_T}Tensor>>",
                          f"{_T}detail::to_optional_tensor_list({{a}})")
    if isinstance(inner, ListType) and isinstance(inner.elem, BaseType) and inner.elem.name in _LISTS:
        cpp, tag, unbox = _LISTS[inner.elem.name]
        if optional:
            return CppArg(name, f"{_T}optional<{cpp}>", tag | opt_bit, f"{_T}optional<{cpp}>",
                          f"{_T}detail::none_or({{a}}, {unbox})")
        return CppArg(name, cpp, tag, cpp, unbox)
    if isinstance(inner, BaseType) and inner.name == "Scalar":
        if optional:
            return CppArg(name, f"const {_T}optional<{_T}Scalar>&", KIND_SCALAR | opt_bit,
                          f"{_T}optional<{_T}Scalar>",
                          f"{_T}detail::none_or({{a}}, {_T}detail::to_scalar({{a}}))")
        return CppArg(name, f"const {_T}Scalar&", KIND_SCALAR, f"{_T}Scalar",
                      f"{_T}detail::to_scalar({{a}})")
    if isinstance(inner, BaseType) and inner.name in _SCALARS:
        cpp, tag, unbox = _SCALARS[inner.name]
        if optional:
            return CppArg(name, f"{_T}optional<{cpp}>", tag | opt_bit, f"{_T}optional<{cpp}>",
                          f"{_T}detail::none_or({{a}}, {unbox})")
        return CppArg(name, cpp, tag, cpp, unbox)
    raise _unsupported(opdef, arg)


# Names the generated glue's own code uses in the scope where it calls the kernel (the
# context `ctx`, the ABI's argument array `args`, loop and count variables): a schema
# argument of one of these names becomes the parameter `name_`.
_RESERVED = {"ctx", "args", "a", "c", "n"}


def _cpp_ident(name: str) -> str:
    """A schema argument name as a C++ parameter name (keywords and glue names renamed)."""
    from opforge.manifest.model import _CPP_KEYWORDS

    return f"{name}_" if name in _CPP_KEYWORDS or name in _RESERVED else name


def renamed_parameters(opdef: OpDef) -> list[tuple[str, str, str]]:
    """``(schema name, C++ parameter name, why)`` of each argument of ``opdef``'s out
    overload whose C++ parameter is not named as in the schema.

    >>> from opforge.manifest import parse_manifest
    >>> op = parse_manifest("- func: t::f.out(Tensor a, Tensor new, *, Tensor(a!) out) -> Tensor(a!)", "t.yaml")[0]
    >>> [(old, new) for old, new, _ in renamed_parameters(op)]
    [('a', 'a_'), ('new', 'new_')]
    """
    from opforge.manifest.model import _CPP_KEYWORDS

    renamed = []
    for arg in opdef.out.arguments.flat:
        cpp = _cpp_ident(arg.name)
        if cpp != arg.name:
            why = ("C++ keywords" if arg.name in _CPP_KEYWORDS else
                   "names the generated glue uses where it calls the kernel")
            renamed.append((arg.name, cpp, why))
    return renamed
