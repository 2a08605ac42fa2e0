"""Validation of argument defaults against their types.

Defaults are kept exactly as written (so schemas round-trip), but a default must be a
value of its argument's type: ``int dim=-1``, ``float eps=1e-05``, ``str mode='mean'``,
``int[2] stride=1`` (a scalar broadcast to the list), ``bool[3] mask=[True, True, True]``,
``ScalarType? dtype=None``, ``MemoryFormat memory_format=contiguous_format``.
:func:`check_default` returns None when the default fits, else what was expected.
"""

from __future__ import annotations

import re

from opforge.schema.model import BaseType, ListType, OptionalType, Type

__all__ = ["check_default", "SCALAR_TYPE_NAMES"]

_INT = re.compile(r"-?[0-9]+\Z")
_FLOAT = re.compile(r"-?(?:[0-9]+\.?[0-9]*(?:[eE][-+]?[0-9]+)?|\.[0-9]+(?:[eE][-+]?[0-9]+)?|inf|nan)\Z")
_STRING = re.compile(r"""(?:"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')\Z""")

# Identifiers ATen uses as defaults, per base type (enum members of c10 / at::Reduction).
SCALAR_TYPE_NAMES = frozenset(
    {"uint8", "int8", "int16", "short", "int32", "int", "int64", "long", "float16", "half",
     "float32", "float", "float64", "double", "complex32", "complex64", "complex128",
     "bool", "bfloat16", "cfloat", "cdouble", "chalf"}
)
_ENUMS = {
    "int": {"Mean", "Sum", "None"},  # at::Reduction, spelled as names in schemas
    "SymInt": set(),
    "ScalarType": SCALAR_TYPE_NAMES,
    "Layout": {"strided", "sparse_coo", "sparse_csr", "sparse_csc", "sparse_bsr",
               "sparse_bsc", "mkldnn", "jagged"},
    "MemoryFormat": {"contiguous_format", "preserve_format", "channels_last",
                     "channels_last_3d"},
    "QScheme": {"per_tensor_affine", "per_channel_affine", "per_tensor_symmetric",
                "per_channel_symmetric", "per_channel_affine_float_qparams"},
    "Device": {"cpu", "cuda", "meta"},
}


def _scalar_ok(base: str, text: str) -> bool:
    if base in ("int", "SymInt", "DeviceIndex"):
        return bool(_INT.match(text)) or text in _ENUMS["int"]
    if base in ("float",):
        return bool(_INT.match(text) or _FLOAT.match(text))
    if base in ("bool", "SymBool"):
        return text in ("True", "False")
    if base == "Scalar":
        return bool(_INT.match(text) or _FLOAT.match(text)) or text in ("True", "False")
    if base == "complex":
        return bool(_INT.match(text) or _FLOAT.match(text))
    if base in ("str", "Dimname"):
        return bool(_STRING.match(text))
    if base == "Device":
        return bool(_STRING.match(text)) or text in _ENUMS["Device"]
    if base in _ENUMS:
        return text in _ENUMS[base]
    return False  # Tensor, Generator, Storage, Stream...: only `None` (if optional)


def _expected(t: Type) -> str:
    if isinstance(t, OptionalType):
        return f"None or {_expected(t.elem)}"
    if isinstance(t, ListType):
        return f"a list like [a, b] of {_expected(t.elem)} (or one value, broadcast)"
    name = t.name
    examples = {
        "int": "an integer such as -1", "SymInt": "an integer such as 0",
        "float": "a number such as 1e-05", "bool": "True or False",
        "Scalar": "a number such as 1 or 0.5", "str": "a quoted string such as 'mean'",
        "ScalarType": "a dtype name such as float or long",
    }
    if name in examples:
        return examples[name]
    if name in _ENUMS:
        return "one of " + ", ".join(sorted(_ENUMS[name]))
    return f"no default (type {name} only takes None, and only when optional)"


def _split_list(text: str) -> list[str] | None:
    if not (text.startswith("[") and text.endswith("]")):
        return None
    inner = text[1:-1].strip()
    if not inner:
        return []
    return [p.strip() for p in inner.split(",")]


def check_default(t: Type, text: str) -> str | None:
    """Return None if ``text`` is a valid default for ``t``, else a description of what is."""
    if text == "None":
        return None if isinstance(t, OptionalType) else (
            f"{_expected(t)} (None is only valid for an optional type such as '{t}?')"
        )
    inner = t.elem if isinstance(t, OptionalType) else t
    if isinstance(inner, ListType):
        items = _split_list(text)
        elem = inner.elem
        if items is None:  # a single value broadcast to the list (`int[2] stride=1`)
            ok = isinstance(elem, BaseType) and _scalar_ok(elem.name, text)
        else:
            ok = all(isinstance(elem, BaseType) and _scalar_ok(elem.name, i) for i in items)
            # ATen treats a list size as a hint (`int[1] dim=[-2,-1]` is valid), not a check.
        return None if ok else _expected(t)
    if isinstance(inner, BaseType) and _scalar_ok(inner.name, text):
        return None
    return _expected(t)
