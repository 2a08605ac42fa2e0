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
#         "sources":   [source line, ...],                 each once
#         "nodes":     [[name, op, source index or -1], ...],   node handle = position
#         "captures":  [[instruction, value, node, item], ...],
#         "delegates": [[delegate, [[node, ...] per engine op]], ...]}}}
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

import json
from dataclasses import dataclass

from opforge.errors import ProgramError
from opforge.program.model import Program
from opforge.program.values import TensorValue

__all__ = ["DEBUG_KEY", "DebugNode", "DebugCapture", "MethodDebug", "DebugInfo", "debug_info",
           "strip_debug_handles", "with_debug_handles"]

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
        doc = {"version": DEBUG_VERSION, "methods": {}}
        for name, m in self.methods.items():
            sources = list(dict.fromkeys(n.source for n in m.nodes if n.source))
            index = {s: i for i, s in enumerate(sources)}
            doc["methods"][name] = {
                "sources": sources,
                "nodes": [[n.name, n.op, index.get(n.source, -1)] for n in m.nodes],
                   "captures": [[c.instruction, c.value, c.node, c.item] for c in m.captures],
                   "delegates": [[d, [list(op) for op in ops]]
                                 for d, ops in sorted(m.delegate_ops.items())]}
        return json.dumps(doc, separators=(",", ":"))


def with_debug_handles(program: Program, info: DebugInfo) -> Program:
    """``program`` with ``info`` as its debug table (checked against it)."""
    meta = [(k, v) for k, v in program.user_metadata if k != DEBUG_KEY]
    result = Program(methods=program.methods, segments=program.segments,
                     delegates=program.delegates,
                     user_metadata=tuple(meta) + ((DEBUG_KEY, info.to_text()),))
    debug_info(result)
    return result


def strip_debug_handles(program: Program) -> Program:
    """``program`` without its debug table (``opforge export --no-debug-handles``)."""
    meta = tuple((k, v) for k, v in program.user_metadata if k != DEBUG_KEY)
    if len(meta) == len(program.user_metadata):
        return program
    return Program(methods=program.methods, segments=program.segments,
                   delegates=program.delegates, user_metadata=meta)


def debug_info(program: Program) -> DebugInfo | None:
    """The program's debug table, checked against the program; None when it has none.

    ``ProgramError`` for a malformed table (bounded work: the text is capped and every
    count is at most the text's length)."""
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
    methods = {}
    for name, entry in doc["methods"].items():
        method = by_name.get(name)
        if method is None:
            raise _error(f"method {name[:60]!r}", "not a method of the program", ", ".join(by_name))
        methods[name] = _method(program, method, entry, f"method {name!r}")
    return DebugInfo(methods)


def _method(program: Program, method, entry: object, where: str) -> MethodDebug:
    if type(entry) is not dict:
        raise _error(where, "not an object", '{"sources", "nodes", "captures", "delegates"}')
    sources = _list(entry.get("sources"), f"{where} sources")
    if not all(type(s) is str and len(s) <= MAX_STRING for s in sources):
        raise _error(f"{where} sources", "a long or non-string item", f"strings of at most {MAX_STRING}")
    nodes = []
    for i, n in enumerate(_list(entry.get("nodes"), f"{where} nodes")):
        if type(n) is not list or len(n) != 3 or not all(
                type(s) is str and len(s) <= MAX_STRING for s in n[:2]) or type(n[2]) is not int \
                or not -1 <= n[2] < len(sources):
            raise _error(f"{where} nodes[{i}]", str(n)[:60],
                         f"[name, op, source index] (strings of at most {MAX_STRING}, index -1..{len(sources) - 1})")
        nodes.append(DebugNode(n[0], n[1], sources[n[2]] if n[2] >= 0 else ""))
    captures = []
    for i, c in enumerate(_list(entry.get("captures"), f"{where} captures")):
        subject = f"{where} captures[{i}]"
        if type(c) is not list or len(c) != 4 or not all(type(x) is int for x in c):
            raise _error(subject, str(c)[:60], "[instruction, value, node, item] integers")
        ins, value, node, item = c
        _range(subject + " instruction", ins, len(method.instructions))
        _range(subject + " value", value, len(method.values))
        _range(subject + " node", node, len(nodes))
        _range(subject + " item", item, 1 << 16)
        if type(method.values[value]) is not TensorValue:
            raise _error(subject, f"value {value}, a {type(method.values[value]).__name__}", "a tensor value")
        captures.append(DebugCapture(ins, value, node, item))
    delegate_ops: dict[int, tuple[tuple[int, ...], ...]] = {}
    for i, d in enumerate(_list(entry.get("delegates", []), f"{where} delegates")):
        subject = f"{where} delegates[{i}]"
        if type(d) is not list or len(d) != 2 or type(d[0]) is not int:
            raise _error(subject, str(d)[:60], "[delegate, [[node, ...], ...]]")
        _range(subject + " delegate", d[0], len(program.delegates))
        ops = []
        for k, op in enumerate(_list(d[1], subject + " ops")):
            if type(op) is not list or len(op) > MAX_ENTRIES:
                raise _error(f"{subject} ops[{k}]", str(op)[:60], "a list of node handles")
            for node in op:
                _range(f"{subject} ops[{k}] node", node, len(nodes))
            ops.append(tuple(op))
        delegate_ops[d[0]] = tuple(ops)
    return MethodDebug(tuple(nodes), tuple(captures), delegate_ops)


def _list(v: object, what: str) -> list:
    if type(v) is not list or len(v) > MAX_ENTRIES:
        raise _error(what, type(v).__name__, f"a list of at most {MAX_ENTRIES} items")
    return v


def _range(what: str, v: object, count: int) -> None:
    if type(v) is not int or not 0 <= v < count:
        raise _error(what, repr(v)[:40], f"0..{count - 1}" if count else "none (nothing to index)")


def _error(subject: str, found: str, valid: str) -> ProgramError:
    return ProgramError(f"`opforge.program.debug_info()`: user_metadata[{DEBUG_KEY!r}] {subject} — "
                        f"found {found} — valid: {valid} — fix: {_FIX}")
