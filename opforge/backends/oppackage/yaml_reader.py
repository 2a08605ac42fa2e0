"""Op packages in opforge's YAML manifest: an ``op_package:`` entry beside the ops.

One manifest can hold the torch ops and the package that implements them on a backend;
the entry carries the same data as an OpDef XML file, with the XML elements in snake case::

    - op_package: ExampleOpPackage
      domain: aisw
      version: "1.0"
      ops:
        - name: ExampleCustomOp
          description: multiplies by 3
          references: [{source: opforge, url: "my_ops.yaml"}]
          inputs:
            - {name: input, datatypes: [QNN_DATATYPE_FLOAT_32], shape: {rank: ND}}
          outputs:
            - {name: output, datatypes: [QNN_DATATYPE_FLOAT_32], shape: {rank: ND}}
          parameters:
            - {name: alpha, mandatory: false, datatypes: [QNN_DATATYPE_FLOAT_32],
               shape: {rank: SCALAR}, default: 1}
          supported_backends: [CPU]
          use_default_translation: false
      supplemental:
        - backend: CPU
          supported_ops: [ExampleCustomOp]
          ops: [{name: ExampleCustomOp, inputs: [{name: input, datatypes: [...]}]}]

Tensors also take ``mandatory``, ``repeated``, ``is_static_tensor``, ``enumeration`` and
``constraints: [{type, text, id}]``. Unknown keys are errors with ``file:line``.
The manifest reader checks these entries when it reads a manifest (``check_entry``);
``load_manifest_packages`` returns them.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

from opforge.backends.oppackage.model import (
    C_NAME_MAX, CONSTRAINT_TYPES, DATATYPES, LAYOUTS, RANKS, Constraint, OpDefinition,
    OpPackage, Supplement, TensorDef, is_c_name,
)
from opforge.errors import ManifestError, shown

__all__ = ["ENTRY_KEY", "parse_package_entry", "check_entry", "load_manifest_packages",
           "parse_manifest_packages"]

ENTRY_KEY = "op_package"
_PKG_KEYS = ("op_package", "domain", "version", "ops", "supplemental")
_OP_KEYS = ("name", "description", "references", "inputs", "outputs", "parameters",
            "supported_backends", "use_default_translation")
_TENSOR_KEYS = {"input": ("name", "description", "mandatory", "datatypes", "shape", "default",
                          "repeated", "is_static_tensor", "constraints"),
                "output": ("name", "description", "mandatory", "datatypes", "shape", "default",
                           "repeated", "constraints"),
                "parameter": ("name", "description", "mandatory", "datatypes", "shape",
                              "default", "enumeration", "constraints")}
_BACKENDS = ("CPU", "GPU", "DSP", "HTP", "LPAI")


class _At:
    def __init__(self, filename: str, node: Any, parent: "_At | None" = None, key: str = "") -> None:
        self.filename, self.node = filename, node
        line = getattr(node, "line", 0)
        if not line and parent is not None:
            line = parent.line_of(key)
        self.line = line

    def line_of(self, key: str) -> int:
        get = getattr(self.node, "line_of", None)
        return get(key) if get else self.line

    def fail(self, key: str | None, found: str, valid: str, fix: str) -> ManifestError:
        line = self.line_of(key) if key else self.line
        subject = f"{key}: " if key else ""
        return ManifestError(f"`opforge manifest`: {self.filename}:{line}: {ENTRY_KEY} {subject}"
                             f"{found} — valid: {valid} — fix: {fix}")


def _mapping(at: _At, keys: tuple[str, ...], what: str) -> dict:
    if not isinstance(at.node, dict):
        raise at.fail(None, f"{what} is {shown(at.node)}", "a mapping", f"write the {what} as key: value lines")
    for k in at.node:
        if k not in keys:
            near = difflib.get_close_matches(str(k), keys, n=1)
            raise at.fail(str(k), f"unknown key in the {what}", ", ".join(keys),
                          f"did you mean {near[0]!r}?" if near else "remove it")
    return at.node


def _str(at: _At, key: str, *, required: bool = False, default: str = "") -> str:
    value = at.node.get(key)
    if value is None:
        if required:
            raise at.fail(key, "missing", "a string", f"add {key}: ...")
        return default
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise at.fail(key, f"{shown(value)}", "a string", "quote it")
    return str(value)


def _bool(at: _At, key: str, default: bool) -> bool:
    value = at.node.get(key, default)
    if not isinstance(value, bool):
        raise at.fail(key, f"{shown(value)}", "true or false", f"write {key}: true or false")
    return value


def _list(at: _At, key: str) -> list:
    value = at.node.get(key, [])
    if value is None:
        return []
    if not isinstance(value, list):
        raise at.fail(key, f"{shown(value)}", "a list", f"write {key}: [...]")
    return value


def _choice(at: _At, key: str, value: Any, valid: tuple[str, ...], what: str) -> str:
    text = str(value)
    if text not in valid:
        near = difflib.get_close_matches(text, valid, n=1)
        raise at.fail(key, f"unknown {what} {shown(value)}", ", ".join(valid),
                      f"did you mean {near[0]}?" if near else f"use one of the valid {what}s")
    return text


def _constraints(at: _At) -> tuple[Constraint, ...]:
    out = []
    for c in _list(at, "constraints"):
        cat = _At(at.filename, c, at, "constraints")
        _mapping(cat, ("type", "text", "id"), "constraint")
        out.append(Constraint(_choice(cat, "type", cat.node.get("type"), CONSTRAINT_TYPES,
                                      "constraint type"), _str(cat, "text"), _str(cat, "id")))
    return tuple(out)


def _shape(at: _At, *, full: bool) -> tuple:
    raw = at.node.get("shape")
    if raw is None:
        return ("ND", "UNDEFINED", "") if full else (None, None, None)
    sat = _At(at.filename, raw, at, "shape")
    _mapping(sat, ("rank", "layout", "text") if full else ("layout", "text"), "shape")
    rank = _choice(sat, "rank", str(raw.get("rank", "ND")).upper(), RANKS, "rank") if full else None
    layout = raw.get("layout")
    layout = _choice(sat, "layout", str(layout).upper(), LAYOUTS, "layout") if layout is not None else (
        "UNDEFINED" if full else None)
    text = _str(sat, "text") if "text" in raw or full else None
    return rank, layout, text


def _datatypes(at: _At, *, required: bool) -> tuple[str, ...]:
    values = _list(at, "datatypes")
    if required and not values:
        raise at.fail("datatypes" if "datatypes" in at.node else None, "no datatypes",
                      "a list of QNN_DATATYPE_* names", "add datatypes: [QNN_DATATYPE_FLOAT_32]")
    return tuple(_choice(at, "datatypes", v, DATATYPES, "datatype") for v in values)


def _tensor(at: _At, role: str) -> TensorDef:
    _mapping(at, _TENSOR_KEYS[role], role)
    rank, layout, text = _shape(at, full=True)
    default = at.node.get("default")
    enumeration = tuple(str(e) for e in _list(at, "enumeration"))
    return TensorDef(role, _str(at, "name", required=True), _str(at, "description"),
                     _bool(at, "mandatory", True), _datatypes(at, required=True), rank, layout,
                     text, None if default is None else (
                         ", ".join(map(str, default)) if isinstance(default, list) else
                         str(default).lower() if isinstance(default, bool) else str(default)),
                     enumeration, _bool(at, "repeated", False), _bool(at, "is_static_tensor", False),
                     _constraints(at), at.line)


def _op(at: _At) -> OpDefinition:
    _mapping(at, _OP_KEYS, "op")
    name = _str(at, "name", required=True)
    if not is_c_name(name):
        raise at.fail("name", f"op type {shown(name)} is not a C identifier of at most "
                      f"{C_NAME_MAX} characters", "ASCII letters, digits and '_'", "rename it")
    refs = []
    for r in _list(at, "references"):
        rat = _At(at.filename, r, at, "references")
        _mapping(rat, ("source", "url"), "reference")
        refs.append((_str(rat, "source"), _str(rat, "url")))
    groups = {}
    for key, role in (("inputs", "input"), ("outputs", "output"), ("parameters", "parameter")):
        items = [_tensor(_At(at.filename, t, at, key), role) for t in _list(at, key)]
        names = [t.name for t in items]
        dup = next((n for n in names if names.count(n) > 1), None)
        if dup is not None:
            raise at.fail(key, f"{role} {dup!r} declared twice", "unique names", "rename one")
        groups[key] = tuple(items)
    if not groups["outputs"]:
        raise at.fail(None, f"op {name!r} declares no outputs", "at least one", "add outputs: [...]")
    backends = tuple(_choice(at, "supported_backends", str(b).upper(), _BACKENDS, "backend")
                     for b in _list(at, "supported_backends"))
    return OpDefinition(name, _str(at, "description"), tuple(refs), groups["inputs"],
                        groups["outputs"], groups["parameters"], backends,
                        _bool(at, "use_default_translation", False), False, at.line)


def _supplemental(at: _At, ops: dict[str, OpDefinition]):
    _mapping(at, ("backend", "supported_ops", "ops"), "supplemental list")
    backend = _choice(at, "backend", str(at.node.get("backend", "")).upper(), _BACKENDS, "backend")
    supported = []
    for name in _list(at, "supported_ops"):
        supported.append(_choice(at, "supported_ops", name, tuple(ops), "op"))
    sups = []
    for s in _list(at, "ops"):
        sat = _At(at.filename, s, at, "ops")
        _mapping(sat, ("name", "inputs", "outputs", "parameters", "constraints",
                       "only_default_supported"), "supplemental op")
        op = ops[_choice(sat, "name", _str(sat, "name", required=True), tuple(ops), "op")]
        tensors = []
        for key, role, declared in (("inputs", "input", op.inputs), ("outputs", "output", op.outputs),
                                    ("parameters", "parameter", op.parameters)):
            for t in _list(sat, key):
                tat = _At(at.filename, t, sat, key)
                _mapping(tat, ("name", "datatypes", "shape", "constraints"), f"supplemental {role}")
                tname = _choice(tat, "name", _str(tat, "name", required=True),
                                tuple(d.name for d in declared), role)
                _, layout, text = _shape(tat, full=False)
                tensors.append((role, tname, _datatypes(tat, required=False), layout, text,
                                _constraints(tat)))
        only = sat.node.get("only_default_supported")
        sups.append(Supplement(op.name, _constraints(sat), tuple(tensors),
                               None if only is None else _bool(sat, "only_default_supported", False),
                               sat.line))
    return (backend, tuple(supported), tuple(sups))


def parse_package_entry(entry: Any, filename: str = "<manifest>") -> OpPackage:
    """One ``op_package:`` manifest entry (a mapping from ``load_yaml``) → ``OpPackage``."""
    at = _At(filename, entry)
    _mapping(at, _PKG_KEYS, "op_package entry")
    name = _str(at, "op_package", required=True)
    if not is_c_name(name):
        raise at.fail("op_package", f"package name {shown(name)} is not a C identifier of "
                      f"at most {C_NAME_MAX} characters", "ASCII letters, digits and '_'",
                      "rename it (it names libQnn<name>.so)")
    ops = [_op(_At(filename, o, at, "ops")) for o in _list(at, "ops")]
    if not ops:
        raise at.fail("ops", "no ops", "at least one op", "add ops: [...]")
    names = [o.name for o in ops]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup is not None:
        raise at.fail("ops", f"op {dup!r} declared twice", "one entry per op type", "merge them")
    by_name = {o.name: o for o in ops}
    sups = tuple(_supplemental(_At(filename, s, at, "supplemental"), by_name)
                 for s in _list(at, "supplemental"))
    return OpPackage(name, _str(at, "domain"), _str(at, "version"), tuple(ops), sups,
                     f"{filename}:{at.line}")


def check_entry(entry: Any, filename: str) -> None:
    """What the manifest reader calls for an ``op_package:`` entry: ManifestError if wrong."""
    parse_package_entry(entry, filename)


def parse_manifest_packages(text: str, filename: str = "<manifest>") -> list[OpPackage]:
    """The ``op_package:`` entries of manifest YAML text."""
    from opforge.manifest.yaml_source import load_yaml

    data = load_yaml(text, filename)
    if not isinstance(data, list):
        return []
    return [parse_package_entry(item, filename) for item in data
            if isinstance(item, dict) and ENTRY_KEY in item]


def load_manifest_packages(path: str | Path) -> list[OpPackage]:
    """The ``op_package:`` entries of a manifest file (its ops are ignored here)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ManifestError(f"`opforge manifest`: {path}: cannot read it ({e})") from None
    return parse_manifest_packages(text, str(path))
