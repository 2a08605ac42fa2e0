"""``CustomRegOp`` and ``DataType``: MindSpore's registration info, as MindSpore writes it.

>>> from opforge.mindspore import CustomRegOp, DataType
>>> info = (CustomRegOp("CustomAdd").input(0, "x1").input(1, "x2").output(0, "y")
...         .dtype_format(DataType.F32_Default, DataType.F32_Default, DataType.F32_Default)
...         .target("CPU").get_op_info())
>>> info["dtype_format"], [i["name"] for i in info["inputs"]]
([(('float32', 'DefaultFormat'), ('float32', 'DefaultFormat'), ('float32', 'DefaultFormat'))], ['x1', 'x2'])

``get_op_info()`` returns the dictionary MindSpore's ``CustomRegOp`` returns (``op_name``,
``inputs``, ``outputs``, ``attr``, ``fusion_type``, ``dtype_format``, ``target``, with
MindSpore's values for every builder chain), so a ``reg_info=`` written for MindSpore is
accepted unchanged. Builder misuse (a non-string name, target or default_value, a row of
the wrong width) is refused where it is written, not at launch. ``DataType`` is MindSpore's
table of ``(dtype, format)`` pairs (``opforge.mindspore.data_type``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from opforge.errors import ManifestError, shown
from opforge.mindspore.attrs import attr_values
from opforge.mindspore.data_type import DataType
from opforge.mindspore.dtypes import DTYPES, FORMATS

__all__ = ["CustomRegOp", "DataType", "RegInfo", "parse_reg_info"]

_PARAM_TYPES = ("required", "optional", "dynamic")


class RegInfoTypeError(ManifestError, TypeError):
    """A builder argument of the wrong type: a ``ManifestError`` and, as MindSpore raises
    for it, a ``TypeError``."""


class CustomRegOp:
    """MindSpore's registration-info builder for a custom operator.

    Each method takes and checks what MindSpore's takes and checks, and ``get_op_info()``
    returns the dictionary MindSpore's returns, for any chain of calls: the keys an
    argument left ``None`` are absent, ``fusion_type`` is ``""`` unless set, ``target`` is
    ``"UnKnown"`` unless set. opforge checks earlier where MindSpore would fail later: a
    ``param_type`` outside required/optional/dynamic, a ``dtype_format`` row whose width is
    not the number of inputs plus outputs declared so far (MindSpore checks this too).
    """

    def __init__(self, op_name="Custom") -> None:
        if not isinstance(op_name, str) or not op_name.strip():
            raise ManifestError(f"`CustomRegOp({shown(op_name)})`: op_name — found "
                                f"{type(op_name).__name__} {shown(op_name)} — valid: a non-empty "
                                "string — fix: CustomRegOp(\"CustomAdd\")")
        # the instance's fields are the dictionary (MindSpore's get_op_info reads __dict__)
        self.op_name = op_name
        self.inputs: list[dict] = []
        self.outputs: list[dict] = []
        self.attr_: list[dict] = []
        self.fusion_type_ = ""
        self.dtype_format_: list[tuple] = []
        self.target_ = "UnKnown"

    def _api(self, method: str) -> str:
        return f"CustomRegOp({self.op_name!r}).{method}"

    def _entry(self, api: str, values: dict, checks: dict, kwargs: dict) -> dict:
        entry = {}
        for key, value in values.items():
            if value is None:
                continue
            kind = checks[key]
            if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                raise RegInfoTypeError(f"`{api}`: {key} {shown(value)} — found "
                                    f"{type(value).__name__} — valid: {kind.__name__} or None "
                                    f"(MindSpore raises TypeError) — fix: pass a {kind.__name__}")
            entry[key] = value
        return {**entry, **kwargs}

    def _io(self, kind: str, index, name, param_type, kwargs) -> "CustomRegOp":
        api = self._api(f"{kind}(...)")
        entry = self._entry(api, {"index": index, "name": name, "paramType": param_type},
                            {"index": int, "name": str, "paramType": str}, kwargs)
        if entry.get("index", 0) < 0:
            raise ManifestError(f"`{api}`: index {index} — valid: an int >= 0 — fix: number "
                                f"the {kind}s 0, 1, ...")
        if param_type is not None and param_type not in _PARAM_TYPES:
            raise ManifestError(f"`{api}`: param_type {shown(param_type)} — valid: "
                                f"{', '.join(_PARAM_TYPES)} — fix: param_type=\"required\"")
        (self.inputs if kind == "input" else self.outputs).append(entry)
        return self

    def input(self, index=None, name=None, param_type="required", **kwargs) -> "CustomRegOp":
        """Declare input ``index`` named ``name`` (any string, as in MindSpore)."""
        return self._io("input", index, name, param_type, kwargs)

    def output(self, index=None, name=None, param_type="required", **kwargs) -> "CustomRegOp":
        """Declare output ``index`` named ``name``."""
        return self._io("output", index, name, param_type, kwargs)

    def attr(self, name=None, param_type=None, value_type=None, default_value=None,
             **kwargs) -> "CustomRegOp":
        """Declare an attribute; ``default_value`` is a string parsed by ``value_type``
        (``"2.5"``, ``"1,2,3"``). opforge also takes ``value=`` (a string or a value)."""
        api = self._api("attr(...)")
        self.attr_.append(self._entry(
            api, {"name": name, "paramType": param_type, "type": value_type,
                  "defaultValue": default_value},
            {"name": str, "paramType": str, "type": str, "defaultValue": str}, kwargs))
        return self

    def fusion_type(self, fusion_type) -> "CustomRegOp":
        """The fusion type (recorded; opforge does not fuse)."""
        if not isinstance(fusion_type, str):
            raise RegInfoTypeError(f"`{self._api('fusion_type(...)')}`: {shown(fusion_type)} — found "
                                f"{type(fusion_type).__name__} — valid: a string (MindSpore "
                                "raises TypeError) — fix: .fusion_type(\"OPAQUE\")")
        self.fusion_type_ = fusion_type
        return self

    def dtype_format(self, *pairs) -> "CustomRegOp":
        """One supported combination: a ``(dtype, format)`` (or ``(dtype, format,
        object_type)``) per input then per output."""
        api = self._api("dtype_format(...)")
        for i, pair in enumerate(pairs):
            if (not isinstance(pair, tuple) or len(pair) not in (2, 3)
                    or not all(isinstance(p, str) for p in pair)):
                raise ManifestError(f"`{api}`: entry {i} {shown(pair)} — valid: a tuple of two "
                                    "or three strings, (dtype, format), such as "
                                    "DataType.F32_Default — fix: use the DataType constants")
        width = len(self.inputs) + len(self.outputs)
        if len(pairs) != width:
            raise ManifestError(f"`{api}`: {len(pairs)} (dtype, format) pairs — valid: {width}, "
                                f"one per input ({len(self.inputs)}) then per output "
                                f"({len(self.outputs)}) declared before it — fix: declare the "
                                ".input()/.output() first, then one DataType each per row")
        self.dtype_format_.append(tuple(pairs))
        return self

    def target(self, target=None) -> "CustomRegOp":
        """The device: ``"CPU"`` (the only one opforge runs AOT kernels on)."""
        if target is not None and not isinstance(target, str):
            raise RegInfoTypeError(f"`{self._api('target(...)')}`: target {shown(target)} — found "
                                f"{type(target).__name__} — valid: \"CPU\", \"GPU\", "
                                "\"Ascend\" or None (MindSpore raises TypeError) — fix: "
                                ".target(\"CPU\")")
        self.target_ = target
        return self

    def get_op_info(self) -> dict:
        """The registration-info dictionary: every field, ``_`` stripped from its name."""
        return {k.rstrip("_"): v for k, v in self.__dict__.items()}


@dataclass(frozen=True)
class RegInfo:
    """Registration info, checked: what the rest of ``opforge.mindspore`` reads."""

    op_name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    dtype_formats: tuple[tuple[tuple[str, str], ...], ...]  # rows: inputs then outputs
    attrs: tuple[dict, ...] = ()
    target: str = "CPU"

    def dtype_rows(self) -> tuple[tuple[str, ...], ...]:
        """Each supported combination's dtypes (``"float32"``), inputs then outputs."""
        return tuple(tuple(d for d, _ in row) for row in self.dtype_formats)

    def to_json(self) -> dict:
        return {"op_name": self.op_name, "inputs": list(self.inputs),
                "outputs": list(self.outputs),
                "dtype_format": [[list(p) for p in row] for row in self.dtype_formats],
                "attr": list(self.attrs), "target": self.target}

    @classmethod
    def from_json(cls, data: dict) -> "RegInfo":
        return cls(data["op_name"], tuple(data["inputs"]), tuple(data["outputs"]),
                   tuple(tuple(tuple(p) for p in row) for row in data["dtype_format"]),
                   tuple(data.get("attr", ())), data.get("target", "CPU"))


def parse_reg_info(reg_info: object, api: str) -> RegInfo:
    """A ``reg_info=`` (dict, JSON string, list of them, ``CustomRegOp``) → ``RegInfo``.

    Refused with ``ManifestError``: no CPU entry in a list, unnamed or misnumbered inputs
    and outputs, ``dtype_format`` rows of the wrong width, unknown dtypes or formats.
    """
    if isinstance(reg_info, CustomRegOp):
        reg_info = reg_info.get_op_info()
    if isinstance(reg_info, str):
        try:
            reg_info = json.loads(reg_info)
        except ValueError as e:
            raise ManifestError(f"`{api}`: reg_info — a string that is not JSON ({e}) — valid: "
                                "CustomRegOp(...).get_op_info(), its dict or its JSON — fix: "
                                "pass the dict") from None
    if isinstance(reg_info, (list, tuple)):
        cpu = [r for r in reg_info if isinstance(r, dict) and r.get("target") in ("CPU", None)]
        if len(cpu) != 1:
            targets = [r.get("target") if isinstance(r, dict) else type(r).__name__
                       for r in reg_info]
            raise ManifestError(f"`{api}`: reg_info — a list with targets {targets} — valid: "
                                "exactly one entry with target \"CPU\" — fix: add "
                                ".target(\"CPU\") to one CustomRegOp")
        reg_info = cpu[0]
    if not isinstance(reg_info, dict):
        raise ManifestError(f"`{api}`: reg_info — found {type(reg_info).__name__} — valid: "
                            "CustomRegOp(...).get_op_info() (a dict) — fix: call "
                            ".get_op_info() on the CustomRegOp")
    target = reg_info.get("target", "CPU")
    if target not in ("CPU", "UnKnown", None):
        raise ManifestError(f"`{api}`: reg_info target {shown(target)} — valid: \"CPU\" (opforge "
                            "runs AOT kernels on the CPU) — fix: .target(\"CPU\")")
    names = {}
    for kind in ("inputs", "outputs"):
        entries = [e if isinstance(e, dict) else {"name": e} for e in reg_info.get(kind) or []]
        for position, entry in enumerate(entries):
            index = entry.get("index", position)
            if index is not None and index != position:
                raise ManifestError(
                    f"`{api}`: reg_info {kind[:-1]} {entry.get('name')!r} — has index {index} "
                    f"at position {position} — valid: {kind} declared in index order 0, 1, ... — "
                    f"fix: declare .{kind[:-1]}({position}, ...) in order")
            if entry.get("paramType") not in (None, "required"):  # None: MindSpore's default
                raise ManifestError(
                    f"`{api}`: reg_info {kind[:-1]} {entry.get('name')!r} — paramType "
                    f"{entry.get('paramType')!r} — valid: \"required\" (an opforge op has a "
                    "fixed number of tensors) — fix: define one op per arity, or pass every "
                    "tensor")
            if not entry.get("name"):
                raise ManifestError(f"`{api}`: reg_info {kind[:-1]} {position} — has no name — "
                                    f"valid: a name as in the kernel's prototype — fix: "
                                    f".{kind[:-1]}({position}, \"x{position}\")")
        names[kind] = tuple(e["name"] for e in entries)
    duplicate = [n for n in names["inputs"] + names["outputs"]
                 if (names["inputs"] + names["outputs"]).count(n) > 1]
    if duplicate:
        raise ManifestError(f"`{api}`: reg_info — name {duplicate[0]!r} is used twice among the "
                            "inputs and outputs — valid: distinct names — fix: rename one")
    width = len(names["inputs"]) + len(names["outputs"])
    rows = []
    for r, row in enumerate(reg_info.get("dtype_format") or []):
        row = tuple(tuple(p)[:2] for p in row)  # (dtype, format[, object type])
        if len(row) != width:
            raise ManifestError(
                f"`{api}`: reg_info dtype_format row {r} — has {len(row)} (dtype, format) pairs "
                f"— valid: {width}, one per input then per output "
                f"({', '.join(names['inputs'] + names['outputs'])}) — fix: write one "
                "DataType per input and output in the row")
        for dtype, fmt in row:
            if dtype not in DTYPES or fmt not in FORMATS:
                raise ManifestError(
                    f"`{api}`: reg_info dtype_format row {r} — ({dtype!r}, {fmt!r}) — valid "
                    f"dtypes: {', '.join(DTYPES)}; formats: {', '.join(f or repr(f) for f in FORMATS)} "
                    "— fix: use a DataType constant such as DataType.F32_Default")
        rows.append(row)
    attrs = tuple(reg_info.get("attr") or ())
    attr_values(attrs, api)  # each value parses as its value_type, or is refused here
    return RegInfo(str(reg_info.get("op_name", "")), names["inputs"], names["outputs"],
                   tuple(rows), attrs, "CPU")
