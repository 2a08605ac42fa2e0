"""Compile specs: typed key/value pairs a backend is lowered and initialised with.

A backend declares the keys it accepts (:class:`SpecDef`: name, type, default, help);
the user gives values as Python objects or as ``KEY=VALUE`` text on the command line;
the program stores them beside the blob as ``(key, bytes)`` pairs, each value one type
letter, a colon and its text (``b"i:4"``, ``b"s:x86_64"``, ``b"b:1"``, ``b"f:0.5"``,
``b"j:{...}"`` for JSON, ``b"x:"`` + raw bytes). Decoding is strict: the bytes come from a
file and are untrusted like the rest of it.

>>> defs = (SpecDef("num_threads", "int", 0, "threads; 0 = OPFORGE_NUM_THREADS"),)
>>> specs = resolve_specs("cpu", defs, {"num_threads": "2"})
>>> specs["num_threads"], encode_specs(specs)
(2, (('num_threads', b'i:2'),))
>>> decode_specs("cpu", defs, encode_specs(specs))["num_threads"]
2
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from opforge.errors import BackendError, shown

__all__ = ["SpecDef", "SPEC_TYPES", "resolve_specs", "encode_specs", "decode_specs", "parse_spec_args"]

SPEC_TYPES = {"int": "i", "str": "s", "bool": "b", "float": "f", "json": "j", "bytes": "x"}
_LETTERS = {v: k for k, v in SPEC_TYPES.items()}
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


@dataclass(frozen=True)
class SpecDef:
    """One compile spec a backend accepts: ``type`` is a key of ``SPEC_TYPES``;
    ``check(value) -> str | None`` returns what is wrong with a value (None when fine)."""

    name: str
    type: str
    default: Any
    help: str
    check: Any = None

    def __post_init__(self) -> None:
        if self.type not in SPEC_TYPES:
            raise ValueError(f"SpecDef {self.name!r}: type {self.type!r} not in {sorted(SPEC_TYPES)}")


def _convert(backend: str, spec: SpecDef, value: Any) -> Any:
    where = f"backend {backend!r} compile spec {spec.name!r}"
    kind = spec.type
    try:
        if kind == "int":
            if isinstance(value, bool) or not isinstance(value, (int, str)):
                raise ValueError
            value = int(value, 0) if isinstance(value, str) else int(value)
        elif kind == "float":
            value = float(value)
            if not math.isfinite(value):
                raise ValueError
        elif kind == "bool":
            if isinstance(value, str):
                if value.strip().lower() not in _TRUE + _FALSE:
                    raise ValueError
                value = value.strip().lower() in _TRUE
            elif not isinstance(value, bool):
                raise ValueError
        elif kind == "str":
            if not isinstance(value, str):
                raise ValueError
        elif kind == "json":
            value = json.loads(value) if isinstance(value, (str, bytes)) else json.loads(json.dumps(value))
        elif kind == "bytes":
            value = value.encode() if isinstance(value, str) else bytes(value)
    except (ValueError, TypeError) as e:
        raise BackendError(
            f"{where}: value {shown(value)} — not {_article(kind)} {kind} — valid: {spec.help} — "
            f"fix: pass {_article(kind)} {kind} (e.g. --compile-spec {spec.name}=...)") from e
    problem = spec.check(value) if spec.check is not None else None
    if problem:
        raise BackendError(f"{where}: value {shown(value)} — {problem} — valid: {spec.help} — "
                           f"fix: pass a valid value, or leave it out for the default {spec.default!r}")
    return value


def _article(word: str) -> str:
    return "an" if word[:1] in "aeiou" else "a"


def resolve_specs(backend: str, defs: Iterable[SpecDef], given: Mapping[str, Any] | None) -> dict[str, Any]:
    """Given values (Python objects or text) → every declared key with its typed value.

    An unknown key is a ``BackendError`` listing the valid keys.
    """
    table = {d.name: d for d in defs}
    given = dict(given or {})
    unknown = sorted(set(given) - set(table))
    if unknown:
        import difflib

        valid = ", ".join(f"{d.name} ({d.type}: {d.help})" for d in table.values()) or "(none)"
        near = [f"{u!r} → did you mean {m[0]!r}?" for u in unknown
                for m in [difflib.get_close_matches(str(u), list(table), n=1, cutoff=0.6)] if m]
        fix = "; ".join(near) if near else "check the spelling, or drop them"
        raise BackendError(
            f"backend {backend!r}: unknown compile spec(s) {', '.join(map(repr, unknown))} — "
            f"valid: {valid} — fix: {fix}")
    return {name: (_convert(backend, d, given[name]) if name in given else d.default)
            for name, d in table.items()}


def _text(kind: str, value: Any) -> bytes:
    if kind == "bytes":
        return bytes(value)
    if kind == "bool":
        return b"1" if value else b"0"
    if kind == "json":
        return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()
    if kind == "float":
        return repr(float(value)).encode()
    return str(value).encode()


def encode_specs(specs: Mapping[str, Any], defs: Iterable[SpecDef] | None = None) -> tuple[tuple[str, bytes], ...]:
    """Typed values → the ``(key, bytes)`` pairs a ``DelegateBlob`` stores (sorted by key)."""
    kinds = {d.name: d.type for d in defs} if defs is not None else {}
    out = []
    for key in sorted(specs):
        value = specs[key]
        kind = kinds.get(key) or (
            "bool" if isinstance(value, bool) else "int" if isinstance(value, int) else
            "float" if isinstance(value, float) else "str" if isinstance(value, str) else
            "bytes" if isinstance(value, (bytes, bytearray, memoryview)) else "json")
        out.append((key, SPEC_TYPES[kind].encode() + b":" + _text(kind, value)))
    return tuple(out)


def decode_specs(backend: str, defs: Iterable[SpecDef],
                 pairs: Iterable[tuple[str, bytes]]) -> dict[str, Any]:
    """The stored pairs → typed values, checked like user input (unknown keys, wrong type
    letters and bad text are ``BackendError``s); keys not stored get their default."""
    table = {d.name: d for d in defs}
    given: dict[str, Any] = {}
    for key, raw in pairs:
        raw = bytes(raw)
        letter, sep, text = raw.partition(b":")
        spec = table.get(key)
        if spec is None:
            raise BackendError(
                f"backend {backend!r}: the program stores compile spec {shown(key)}, which this "
                f"backend does not know — valid: {', '.join(table) or '(none)'} — fix: load the "
                "program with the opforge version that exported it, or re-export it")
        if not sep or _LETTERS.get(letter.decode("latin-1")) != spec.type:
            raise BackendError(
                f"backend {backend!r}: stored compile spec {key!r} = {shown(raw)} — not a "
                f"{spec.type} value ('{SPEC_TYPES[spec.type]}:' prefix) — valid: what export "
                "writes — fix: re-export the program; this one was altered or corrupted")
        if spec.type == "bytes":
            given[key] = text
            continue
        try:
            given[key] = text.decode("utf-8")
        except UnicodeDecodeError as e:
            raise BackendError(f"backend {backend!r}: stored compile spec {key!r} — not UTF-8 — "
                               "fix: re-export the program") from e
    return resolve_specs(backend, defs, given)


def parse_spec_args(items: Iterable[str]) -> dict[str, str]:
    """``["num_threads=2", ...]`` (the CLI's ``--compile-spec``) → a dict of text values."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise BackendError(
                f"--compile-spec {shown(item)} — not KEY=VALUE — valid: e.g. num_threads=2 — "
                "fix: write the key, '=' and the value")
        out[key.strip()] = value
    return out
