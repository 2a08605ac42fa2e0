"""Attribute values of a MindSpore custom op, parsed by their declared type (no torch).

A ``CustomRegOp(...).attr(name, param_type, value_type, default_value)`` gives the value as a
string (``"2.5"``, ``"1,2,3"``), as MindSpore requires; opforge also takes a ``value=``
keyword (a string or a Python value) and ``Custom(...).add_prim_attr(name, value)``. This
module turns each into one typed Python value, as MindSpore does before a kernel reads it
with ``Attr<T>``; a value that does not parse as its type is refused here, when the op is
defined, not read as 0 by the kernel.

    value_type      default_value     Python value        the kernel reads
    "int"           "3"               3                   Attr<int64_t>, Attr<int>
    "float"         "2.5"             2.5                 Attr<float>, Attr<double>
    "bool"          "true"/"false"    True                Attr<bool>
    "str"           "sum"             "sum"               Attr<std::string>
    "listInt"       "1,2,3"           [1, 2, 3]           Attr<std::vector<int64_t>>
    "listFloat"     "0.5,1"           [0.5, 1.0]          Attr<std::vector<float>>
    "listBool"      "true,false"      [True, False]       (no Attr<T> in MindSpore's header)
    "listStr"       "a,b"             ["a", "b"]          (no Attr<T> in MindSpore's header)
    "listListInt"   "[[1,2],[3]]"     [[1, 2], [3]]       Attr<std::vector<std::vector<int64_t>>>
    "listListFloat" "[[0.5],[1]]"     [[0.5], [1.0]]      Attr<std::vector<std::vector<float>>>
"""

from __future__ import annotations

import json

from opforge.errors import ManifestError, shown

__all__ = ["ATTR_TYPES", "parse_attr", "attr_values"]

# value_type -> (element kind, list depth)
ATTR_TYPES: dict[str, tuple[str, int]] = {
    "int": ("int", 0), "float": ("float", 0), "bool": ("bool", 0), "str": ("str", 0),
    "listInt": ("int", 1), "listFloat": ("float", 1), "listBool": ("bool", 1),
    "listStr": ("str", 1), "listListInt": ("int", 2), "listListFloat": ("float", 2),
}


def _scalar(kind: str, raw: object) -> object:
    if isinstance(raw, str) and kind != "str":
        text = raw.strip()
        if kind == "int":
            return int(text, 10)
        if kind == "float":
            return float(text)
        if text.lower() in ("true", "false"):
            return text.lower() == "true"
        raise ValueError(f"{raw!r} is not true or false")
    if kind == "int" and type(raw) is int:
        return raw
    if kind == "float" and type(raw) in (int, float):
        return float(raw)
    if kind == "bool" and type(raw) is bool:
        return raw
    if kind == "str" and isinstance(raw, str):
        return raw
    raise ValueError(f"{raw!r} is a {type(raw).__name__}, not a {kind}")


def _nested(kind: str, depth: int, raw: object) -> object:
    if depth == 0:
        return _scalar(kind, raw)
    if isinstance(raw, str):
        text = raw.strip()
        if depth == 2 or text.startswith("["):
            raw = json.loads(text if kind != "bool" else text.replace("True", "true")
                             .replace("False", "false"))
        else:
            raw = [] if not text else [item.strip() for item in text.split(",")]
    if not isinstance(raw, (list, tuple)):
        raise ValueError(f"{raw!r} is not a list")
    return [_nested(kind, depth - 1, item) for item in raw]


def _infer(raw: object) -> str:
    if isinstance(raw, bool):
        return "bool"
    if isinstance(raw, int):
        return "int"
    if isinstance(raw, float):
        return "float"
    if isinstance(raw, str):
        return "str"
    if isinstance(raw, (list, tuple)) and raw:
        inner = _infer(raw[0])
        return "list" + inner[0].upper() + inner[1:] if inner in ("int", "float", "bool", "str",
                                                                  "listInt", "listFloat") else ""
    return ""


def parse_attr(name: str, value_type: object, raw: object, api: str) -> tuple[str, object]:
    """One attribute's value by its declared ``value_type`` → ``(value_type, value)``."""
    declared = value_type if value_type is not None else _infer(raw)
    if declared not in ATTR_TYPES:
        raise ManifestError(f"`{api}`: attribute {name!r} — value_type {shown(value_type)} "
                            f"(value {raw!r}) — valid: {', '.join(ATTR_TYPES)} — fix: "
                            f".attr({name!r}, \"required\", \"float\", \"2.5\")")
    kind, depth = ATTR_TYPES[declared]
    try:
        return declared, _nested(kind, depth, raw)
    except (ValueError, TypeError) as e:
        example = {"int": "3", "float": "2.5", "bool": "true", "str": "text"}[kind]
        if depth:
            example = ",".join([example] * 2) if depth == 1 else f"[[{example}],[{example}]]"
        raise ManifestError(f"`{api}`: attribute {name!r} — {raw!r} does not parse as "
                            f"{declared} ({e}) — valid: a {declared} such as {example!r} — fix: "
                            "write the value in its type, as a string for default_value") from None


def attr_values(attrs, api: str) -> dict[str, tuple[str, object]]:
    """The attributes that have a value (``value`` first, then ``defaultValue``), parsed:
    name → ``(value_type, value)``. An attribute without either is left out: reading it
    is an error at run time, as in MindSpore."""
    values: dict[str, tuple[str, object]] = {}
    for attr in attrs:
        if not isinstance(attr, dict) or not isinstance(attr.get("name"), str):
            raise ManifestError(f"`{api}`: attribute {shown(attr)} — valid: a dict with a "
                                "\"name\" — fix: .attr(\"scale\", \"required\", \"float\", \"1.0\")")
        raw = attr["value"] if attr.get("value") is not None else attr.get("defaultValue")
        if raw is None:
            continue
        values[attr["name"]] = parse_attr(attr["name"], attr.get("type"), raw, api)
    return values
