"""Operator definitions: :class:`OpDef` and its kernel bindings.

An :class:`OpDef` is one operator, defined once: its functional schema and its out
schema (one derived from the other), its kernel bindings (ExecuTorch's
``kernels: [{arg_meta, kernel_name}]``), an optional Python reference implementation,
an optional fake (shape/dtype inference), documentation and where it was defined.

Kernel names follow ExecuTorch's rule: the kernel lives in a ``native`` sub-namespace of
the namespace written in the manifest, so ``custom::mul3_out_impl`` is the C++ function
``custom::native::mul3_out_impl``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from opforge.errors import ManifestError
from opforge.schema import FunctionSchema

if TYPE_CHECKING:
    from opforge.manifest.quantization import QuantContract  # noqa: F401

__all__ = ["OpDef", "KernelBinding", "TensorMeta", "native_kernel_name", "check_kernel_name",
           "DTYPE_NAMES"]

# c10 ScalarType names as ExecuTorch's type_alias lists spell them → ATen dtype numbers.
DTYPE_NAMES: dict[str, int] = {
    "Byte": 0, "Char": 1, "Short": 2, "Int": 3, "Long": 4, "Half": 5, "Float": 6,
    "Double": 7, "ComplexHalf": 8, "ComplexFloat": 9, "ComplexDouble": 10, "Bool": 11,
    "QInt8": 12, "QUInt8": 13, "QInt32": 14, "BFloat16": 15,
}

_CPP_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_CPP_KEYWORDS = frozenset(
    """alignas alignof and and_eq asm auto bitand bitor bool break case catch char char8_t
    char16_t char32_t class compl concept const consteval constexpr constinit const_cast
    continue co_await co_return co_yield decltype default delete do double dynamic_cast else
    enum explicit export extern false float for friend goto if inline int long mutable
    namespace new noexcept not not_eq nullptr operator or or_eq private protected public
    register reinterpret_cast requires return short signed sizeof static static_assert
    static_cast struct switch template this thread_local throw true try typedef typeid
    typename union unsigned using virtual void volatile wchar_t while xor xor_eq""".split()
)


def check_kernel_name(name: object) -> str | None:
    """None if ``name`` is a valid (qualified) C++ function name, else what is wrong."""
    if not isinstance(name, str) or not name:
        return "a kernel name is a non-empty string such as custom::mul3_out_impl"
    parts = name.removeprefix("::").split("::")
    for part in parts:
        if not _CPP_IDENT.match(part):
            return (f"'{part}' is not a C++ identifier (letters, digits and '_', not starting "
                    "with a digit; namespaces separated by '::')")
        if part in _CPP_KEYWORDS:
            return f"'{part}' is a C++ keyword"
    return None


def native_kernel_name(kernel_name: str) -> str:
    """ExecuTorch's rule: ``custom::mul3_out_impl`` → ``custom::native::mul3_out_impl``.

    A name already inside a ``native`` namespace is left as it is.
    """
    parts = kernel_name.removeprefix("::").split("::")
    if len(parts) >= 2 and parts[-2] == "native":
        return "::".join(parts)
    return "::".join([*parts[:-1], "native", parts[-1]])


@dataclass(frozen=True)
class TensorMeta:
    """What a dtype-specific kernel accepts for one tensor argument (ExecuTorch arg_meta)."""

    dtype: str  # a c10 name from DTYPE_NAMES, e.g. "Float"
    dim_order: tuple[int, ...] | None = None

    def __str__(self) -> str:
        order = "" if self.dim_order is None else ";" + ",".join(map(str, self.dim_order))
        return f"{DTYPE_NAMES[self.dtype]}{order}"


@dataclass(frozen=True)
class KernelBinding:
    """One kernel of an operator: ``{arg_meta, kernel_name}``.

    ``arg_meta`` is None for the fallback kernel, used when no dtype-specific one matches;
    otherwise it maps tensor argument names to the dtype (and dim order) it accepts.
    """

    kernel_name: str  # as written in the manifest
    arg_meta: tuple[tuple[str, TensorMeta], ...] | None = None

    def __post_init__(self) -> None:
        problem = check_kernel_name(self.kernel_name)
        if problem:
            raise ManifestError(f"`KernelBinding`: kernel_name {self.kernel_name!r} — {problem}")

    @property
    def cpp_name(self) -> str:
        """The C++ function the build expects (with the ``native`` namespace added)."""
        return native_kernel_name(self.kernel_name)

    @property
    def dtype_key(self) -> str:
        """``"default"`` for the fallback, else ``"v1/6;0,1|6;0,1"`` (ExecuTorch's key form)."""
        if self.arg_meta is None:
            return "default"
        return "v1/" + "|".join(str(meta) for _, meta in self.arg_meta)


@dataclass(frozen=True)
class OpDef:
    """One operator, defined once (from YAML or from :func:`opforge.op`).

    >>> from opforge.schema import FunctionSchema
    >>> d = OpDef.from_schema(FunctionSchema.parse("my_ops::mul3(Tensor input) -> Tensor"))
    >>> d.name, str(d.out.name)
    ('my_ops::mul3', 'my_ops::mul3.out')
    """

    functional: FunctionSchema
    out: FunctionSchema
    kernels: tuple[KernelBinding, ...] = ()
    python_impl: Callable | str | None = None  # callable, or "module:function"
    fake: Callable | str | None = None  # callable, or "module:function"
    doc: str = ""
    source: str = "<python>"  # where it was defined: "file.yaml:12" or "module.py:34"
    is_aten: bool = False  # an ATen op bound to custom kernels (`op: add.out`)
    extra: tuple[tuple[str, object], ...] = field(default=(), compare=False)
    # callable, or "module:function": () -> [(args, kwargs), ...] of the functional op,
    # samples `opforge check` runs besides the ones it generates
    samples: Callable | str | None = None
    # how opforge.quantize treats the op (opforge.manifest.quantization); None: no contract,
    # the op stays float and the quantization report says so
    quantization: "QuantContract | None" = None

    def __post_init__(self) -> None:
        if not self.functional.is_functional():
            raise ManifestError(f"`OpDef`: {self.functional.name} — functional schema expected, "
                                f"got a {self.functional.kind().value} one ({self.source})")
        if not self.out.is_out_variant():
            raise ManifestError(f"`OpDef`: {self.out.name} — out schema expected ({self.source})")
        if self.quantization is not None:
            from opforge.manifest.quantization import QuantContract

            object.__setattr__(self, "quantization", QuantContract.parse(
                self.quantization, self.functional, f"quantization ({self.source})"))

    @classmethod
    def from_schema(cls, schema: FunctionSchema, **kw) -> "OpDef":
        """Build from either the functional or the out schema; the other is derived."""
        if schema.is_out_variant():
            return cls(schema.functional_variant(), schema, **kw)
        return cls(schema, schema.out_variant(), **kw)

    @property
    def namespace(self) -> str:
        return self.functional.name.namespace or "aten"

    @property
    def name(self) -> str:
        """``ns::op`` (no overload)."""
        return f"{self.namespace}::{self.functional.name.name}"

    @property
    def out_key(self) -> str:
        """The registry key of the out overload, e.g. ``my_ops::mul3.out``."""
        return self.out.name.qualified.replace("aten::", f"{self.namespace}::", 1)

    @property
    def fallback_kernel(self) -> KernelBinding | None:
        return next((k for k in self.kernels if k.arg_meta is None), None)
