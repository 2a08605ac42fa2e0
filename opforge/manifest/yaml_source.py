"""Reading manifest YAML with line numbers, so every error can say file:line.

PyYAML's safe loader is used (no tags that construct objects); mappings are built as
:class:`LineMap`, a dict that remembers the line of itself and of each key. Scanner and
parser failures (tab indentation, truncated files, unclosed quotes) become
:class:`ManifestError` with the file, the line and the fix.

A manifest may come from anyone, so composing a document is bounded (:class:`_LineLoader`):

- ``MAX_ALIAS_NODES``: the YAML nodes all aliases of a document add when expanded. An
  alias is a reference to an anchored node, so aliases of aliases grow exponentially: the
  468-byte "billion laughs" document (nine lists of nine aliases of the list before)
  stands for 9**9 strings, and formatting one value of it ran out of memory. Each
  composed node's expanded size is kept, so an alias costs its target's size at once.
- ``MAX_DEPTH``: lists and mappings nested inside each other. Composing and constructing
  recurse once per level; past Python's recursion limit that would be a RecursionError.
- an alias of a node that contains it (a recursive structure) is refused, and so is an
  integer too long for Python to convert (over 4300 digits).

Manifests of any real size stay far below both limits: an entry is ~10 nodes and ~4 deep.
"""

from __future__ import annotations

import yaml

from opforge.errors import ManifestError, shown

__all__ = ["LineMap", "load_yaml", "MAX_ALIAS_NODES", "MAX_DEPTH"]

MAX_ALIAS_NODES = 100_000  # nodes that all aliases of one document may add when expanded
MAX_DEPTH = 64  # lists and mappings nested inside each other


class LineMap(dict):
    """A mapping that knows the 1-based line of itself (``.line``) and of each key."""

    line: int = 0
    key_lines: dict

    def line_of(self, key: str) -> int:
        return self.key_lines.get(key, self.line)


class _LineLoader(yaml.SafeLoader):
    """PyYAML's safe loader, bounded while composing (see the module docstring)."""

    def __init__(self, stream) -> None:
        super().__init__(stream)
        self._sizes: dict[int, int] = {}  # id(node) → its node count with aliases expanded
        self._alias_nodes = 0
        self._depth = 0

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            node = super().compose_node(parent, index)  # raises on an undefined alias
            self._count_alias(event, node)
            return node
        collection = isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent))
        if collection:
            self._depth += 1
            if self._depth > MAX_DEPTH:
                raise ManifestError(
                    f"{event.start_mark.line + 1}: a value — lists and mappings nested "
                    f"{self._depth} deep — valid: at most {MAX_DEPTH} levels (MAX_DEPTH) — "
                    "fix: flatten the value (a manifest entry needs a few levels)")
        node = super().compose_node(parent, index)
        if collection:
            self._depth -= 1
            children = (node.value if isinstance(node, yaml.SequenceNode)
                        else [n for pair in node.value for n in pair])
            self._sizes[id(node)] = 1 + sum(self._sizes[id(c)] for c in children)
        else:
            self._sizes[id(node)] = 1
        return node

    def _count_alias(self, event: yaml.AliasEvent, node: yaml.Node) -> None:
        line = event.start_mark.line + 1
        size = self._sizes.get(id(node))
        if size is None:  # its anchor's list or mapping is still being composed
            raise ManifestError(
                f"{line}: alias *{event.anchor} — refers to a list or mapping that contains it "
                "— valid: a tree of values, not a recursive structure — fix: write the value "
                "out instead of the alias")
        self._alias_nodes += size
        if self._alias_nodes > MAX_ALIAS_NODES:
            raise ManifestError(
                f"{line}: alias *{event.anchor} — expands to {size} YAML nodes, "
                f"{self._alias_nodes} for the document's aliases so far — valid: at most "
                f"{MAX_ALIAS_NODES} nodes added by aliases (the alias limit, MAX_ALIAS_NODES; "
                "aliases of aliases grow exponentially, as in a 'billion laughs' document) — "
                "fix: write the repeated values out, or alias only small values")

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        try:
            return super().construct_yaml_int(node)
        except ValueError:
            raise ManifestError(
                f"{node.start_mark.line + 1}: an integer — {len(node.value)} characters long "
                "— valid: at most 4300 digits — fix: write a shorter number, or quote it as a "
                "string") from None


def _construct_mapping(loader: _LineLoader, node: yaml.MappingNode) -> LineMap:
    loader.flatten_mapping(node)
    result = LineMap()
    result.line = node.start_mark.line + 1
    result.key_lines = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, (str, int, float, bool)) and key is not None:
            raise ManifestError(f"{key_node.start_mark.line + 1}: a mapping key must be a "
                                f"plain value, found {type(key).__name__} {shown(key)}")
        if key in result:
            raise ManifestError(f"{key_node.start_mark.line + 1}: duplicate key {shown(key)} "
                                f"(first at line {result.key_lines[key]}); remove one of them")
        result[key] = loader.construct_object(value_node, deep=True)
        result.key_lines[key] = key_node.start_mark.line + 1
    return result


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_LineLoader.add_constructor("tag:yaml.org,2002:int", _LineLoader.construct_yaml_int)


def load_yaml(text: str, filename: str) -> object:
    """Parse YAML text; a syntax error becomes ManifestError ``filename:line: ...``."""
    if "\t" in text:
        for number, line in enumerate(text.splitlines(), 1):
            stripped = line.lstrip(" ")
            if stripped.startswith("\t"):
                raise ManifestError(
                    f"`opforge manifest`: {filename}:{number}: the line is indented with a tab — "
                    "YAML indentation must use spaces — replace the tab with spaces"
                )
    try:
        return yaml.load(text, Loader=_LineLoader)  # noqa: S506 - a SafeLoader subclass
    except ManifestError as exc:
        raise ManifestError(f"`opforge manifest`: {filename}:{exc}") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else "?"
        what = exc.problem or "invalid YAML"
        what = what if len(what) <= 200 else what[:199] + "…"  # may quote an anchor name
        hint = ("the file may be truncated or a quote/bracket left open — complete the entry"
                if "end of stream" in what or "unexpected end" in what or "found unexpected end" in what
                else "fix the YAML syntax at that line")
        raise ManifestError(f"`opforge manifest`: {filename}:{line}: YAML syntax error — {what} — {hint}") from None
    except yaml.YAMLError as exc:
        raise ManifestError(f"`opforge manifest`: {filename}: YAML error — {shown(str(exc))}") from None
