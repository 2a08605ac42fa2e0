"""Debug handles: which FX node each instruction, and each op inside a delegate, came from.

# Design
#
# The table lives in the program's user metadata under ``opforge.debug`` (one UTF-8 JSON
# text), not in a new binary table: a program without it is unchanged byte for byte, old
# files load as before, a reader that does not know the key ignores it, and stripping it
# (``strip_debug_handles``) is dropping one metadata pair. It is untrusted data like the
# rest of the file: ``debug_info`` bounds the text, catches every JSON failure, checks each
# field's type and range and every index against the program (instructions, values,
# delegates), and raises ``ProgramError`` otherwise; ``verify`` runs it when the key is
# there, so a loaded program's table can be trusted. Nothing is evaluated.
#
#     {"version": 1, "methods": {NAME: {
#         "sources":   [source line, ...],               each once
#         "ops":       [operator, ...],                  each once
#         "nodes":     [name, op, source, ...],          flat: 3 per node (op: index into ops,
#                                                        source: into sources or -1);
#                                                        node handle = position / 3
#         "captures":  [instruction, value, node, item, ...],   flat: 4 per capture
#         "delegates": [[delegate, [[node, ...] per engine op]], ...]}}}
#
# Flat lists of ints are checked column by column (type, min, max), so verifying a table
# of a few thousand nodes costs a fraction of a millisecond; objects are built only when
# someone reads the table (``debug_info``).
#
# A capture says: after ``instruction`` runs, tensor ``values[value]`` holds result
# ``item`` of node ``node`` (item 0 unless the node has several results). A delegate entry
# lists, for each op of that delegate's blob in execution order, the nodes it computes
# (several when ops were fused into one).

>>> from opforge.program._sample import sample_program
>>> program = sample_program()
>>> debug_info(program) is None
True
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

from opforge.errors import ProgramError
from opforge.program.model import Program
from opforge.program.values import TensorValue

__all__ = ["DEBUG_KEY", "DebugNode", "DebugCapture", "MethodDebug", "DebugInfo", "debug_info",
           "check_debug_table", "strip_debug_handles", "with_debug_handles"]

DEBUG_KEY = "opforge.debug"
DEBUG_VERSION = 1
MAX_TEXT = 64 << 20       # characters of the JSON text
MAX_ENTRIES = 1 << 22     # nodes, captures or delegate ops per method
MAX_STRING = 4096         # a node name, op or source
_FIX = "re-export the program, or drop the table with opforge.program.strip_debug_handles"


@dataclass(frozen=True, slots=True)
class DebugNode:
    """One FX node of the exported graph (after decomposition to core ATen)."""

    name: str
    op: str       # "aten::addmm.default", or the target's name
    source: str   # "model.py:12 in forward (return self.fc(x))", "" when torch did not record it


@dataclass(frozen=True, slots=True)
class DebugCapture:
    """After ``instruction`` runs, ``values[value]`` holds result ``item`` of ``node``."""

    instruction: int
    value: int
    node: int
    item: int = 0


@dataclass(frozen=True)
class MethodDebug:
    nodes: tuple[DebugNode, ...]
    captures: tuple[DebugCapture, ...]
    delegate_ops: dict[int, tuple[tuple[int, ...], ...]]  # delegate → per engine op: nodes

    def handle_of(self, name: str) -> int | None:
        return next((i for i, n in enumerate(self.nodes) if n.name == name), None)


@dataclass(frozen=True)
class DebugInfo:
    methods: dict[str, MethodDebug]

    def to_text(self) -> str:
        doc: dict = {"version": DEBUG_VERSION, "methods": {}}
        for name, m in self.methods.items():
            sources = list(dict.fromkeys(n.source for n in m.nodes if n.source))
            ops = list(dict.fromkeys(n.op for n in m.nodes))
            source_index = {s: i for i, s in enumerate(sources)}
            op_index = {o: i for i, o in enumerate(ops)}
            doc["methods"][name] = {
                "sources": sources, "ops": ops,
                "nodes": [x for n in m.nodes
                          for x in (n.name, op_index[n.op], source_index.get(n.source, -1))],
                "captures": [x for c in m.captures
                             for x in (c.instruction, c.value, c.node, c.item)],
                "delegates": [[d, [list(op) for op in ops_]]
                              for d, ops_ in sorted(m.delegate_ops.items())]}
        return json.dumps(doc, separators=(",", ":"))


def with_debug_handles(program: Program, info: DebugInfo) -> Program:
    """``program`` with ``info`` as its debug table (checked against it)."""
    meta = [(k, v) for k, v in program.user_metadata if k != DEBUG_KEY]
    result = dataclasses.replace(program,
                                 user_metadata=tuple(meta) + ((DEBUG_KEY, info.to_text()),))
    debug_info(result)
    return result


def strip_debug_handles(program: Program) -> Program:
    """``program`` without its debug table (``opforge export --no-debug-handles``)."""
    meta = tuple((k, v) for k, v in program.user_metadata if k != DEBUG_KEY)
    if len(meta) == len(program.user_metadata):
        return program
    return dataclasses.replace(program, user_metadata=meta)


def debug_info(program: Program) -> DebugInfo | None:
    """The program's debug table, checked against the program; None when it has none.

    ``ProgramError`` for a malformed table (bounded work: the text is capped and every
    count is at most the text's length)."""
    doc = _checked(program)
    if doc is None:
        return None
    methods = {}
    for name, entry in doc["methods"].items():
        sources, ops, flat = entry["sources"], entry["ops"], entry["nodes"]
        nodes = tuple(DebugNode(flat[k], ops[flat[k + 1]], sources[flat[k + 2]] if flat[k + 2] >= 0 else "")
                      for k in range(0, len(flat), 3))
        c = entry["captures"]
        captures = tuple(DebugCapture(*c[k:k + 4]) for k in range(0, len(c), 4))
        delegate_ops = {d: tuple(tuple(op) for op in op_list) for d, op_list in entry["delegates"]}
        methods[name] = MethodDebug(nodes, captures, delegate_ops)
    return DebugInfo(methods)


def check_debug_table(program: Program) -> None:
    """``verify``'s part: the table, when there is one, is well formed and its indices are
    in range (``ProgramError`` otherwise); builds nothing."""
    _checked(program)


def _checked(program: Program) -> dict | None:
    text = next((v for k, v in program.user_metadata if k == DEBUG_KEY), None)
    if text is None:
        return None
    if len(text) > MAX_TEXT:
        raise _error("the text", f"{len(text)} characters", f"at most {MAX_TEXT}")
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise _error("the text", f"not JSON ({type(e).__name__})", "the table export writes") from None
    if type(doc) is not dict or doc.get("version") != DEBUG_VERSION or type(doc.get("methods")) is not dict:
        raise _error("the header", "no version 1 table", '{"version": 1, "methods": {...}}')
    by_name = {m.name: m for m in program.methods}
    for name, entry in doc["methods"].items():
        method = by_name.get(name)
        if method is None:
            raise _error(f"method {name[:60]!r}", "not a method of the program", ", ".join(by_name))
        _check_method(program, method, entry, f"method {name!r}")
    return doc


def _check_method(program: Program, method, entry: object, where: str) -> None:
    if type(entry) is not dict:
        raise _error(where, "not an object", '{"sources", "ops", "nodes", "captures", "delegates"}')
    sources = _list(entry.get("sources"), f"{where} sources")
    ops = _list(entry.get("ops"), f"{where} ops")
    for what, strings in (("sources", sources), ("ops", ops)):
        if not all(type(s) is str and len(s) <= MAX_STRING for s in strings):
            raise _error(f"{where} {what}", "a long or non-string item", f"strings of at most {MAX_STRING}")
    flat = _list(entry.get("nodes"), f"{where} nodes")
    if len(flat) % 3:
        raise _error(f"{where} nodes", f"{len(flat)} items", "3 per node: name, op, source")
    names = flat[0::3]
    if not all(type(s) is str and len(s) <= MAX_STRING for s in names):
        raise _error(f"{where} nodes", "a name that is long or not a string", f"strings of at most {MAX_STRING}")
    _column(f"{where} nodes (op)", flat[1::3], 0, len(ops))
    _column(f"{where} nodes (source)", flat[2::3], -1, len(sources))
    count = len(names)
    c = _list(entry.get("captures"), f"{where} captures")
    if len(c) % 4:
        raise _error(f"{where} captures", f"{len(c)} items", "4 per capture: instruction, value, node, item")
    _column(f"{where} captures (instruction)", c[0::4], 0, len(method.instructions))
    _column(f"{where} captures (value)", c[1::4], 0, len(method.values))
    _column(f"{where} captures (node)", c[2::4], 0, count)
    _column(f"{where} captures (item)", c[3::4], 0, 1 << 16)
    for value in set(c[1::4]):
        if type(method.values[value]) is not TensorValue:
            raise _error(f"{where} captures (value)", f"value {value}, a "
                         f"{type(method.values[value]).__name__}", "a tensor value")
    for i, d in enumerate(_list(entry.get("delegates"), f"{where} delegates")):
        subject = f"{where} delegates[{i}]"
        if type(d) is not list or len(d) != 2:
            raise _error(subject, str(d)[:60], "[delegate, [[node, ...], ...]]")
        _column(subject + " delegate", [d[0]], 0, len(program.delegates))
        for k, op in enumerate(_list(d[1], subject + " ops")):
            _column(f"{subject} ops[{k}]", _list(op, f"{subject} ops[{k}]"), 0, count)


def _column(what: str, items: list, lo: int, hi: int) -> None:
    """Every item an int in ``[lo, hi)``."""
    if not all(type(x) is int for x in items):
        bad = next(x for x in items if type(x) is not int)
        raise _error(what, repr(bad)[:40], "integers")
    if items and (min(items) < lo or max(items) >= hi):
        bad = min(items) if min(items) < lo else max(items)
        raise _error(what, repr(bad), f"{lo}..{hi - 1}" if hi > lo else "none (nothing to index)")


def _list(v: object, what: str) -> list:
    if type(v) is not list or len(v) > MAX_ENTRIES:
        raise _error(what, type(v).__name__, f"a list of at most {MAX_ENTRIES} items")
    return v


def _error(subject: str, found: str, valid: str) -> ProgramError:
    return ProgramError(f"`opforge.program.debug_info()`: user_metadata[{DEBUG_KEY!r}] {subject} — "
                        f"found {found} — valid: {valid} — fix: {_FIX}")
