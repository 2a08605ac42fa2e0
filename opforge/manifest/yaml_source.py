"""Reading manifest YAML with line numbers, so every error can say file:line.

PyYAML's safe loader is used (no tags that construct objects); mappings are built as
:class:`LineMap`, a dict that remembers the line of itself and of each key. Scanner and
parser failures (tab indentation, truncated files, unclosed quotes) become
:class:`ManifestError` with the file, the line and the fix.
"""

from __future__ import annotations

import yaml

from opforge.errors import ManifestError

__all__ = ["LineMap", "load_yaml"]


class LineMap(dict):
    """A mapping that knows the 1-based line of itself (``.line``) and of each key."""

    line: int = 0
    key_lines: dict

    def line_of(self, key: str) -> int:
        return self.key_lines.get(key, self.line)


class _LineLoader(yaml.SafeLoader):
    pass


def _construct_mapping(loader: _LineLoader, node: yaml.MappingNode) -> LineMap:
    loader.flatten_mapping(node)
    result = LineMap()
    result.line = node.start_mark.line + 1
    result.key_lines = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, (str, int, float, bool)) and key is not None:
            raise ManifestError(f"{key_node.start_mark.line + 1}: a mapping key must be a "
                                f"plain value, found {type(key).__name__}")
        if key in result:
            raise ManifestError(f"{key_node.start_mark.line + 1}: duplicate key {key!r} "
                                f"(first at line {result.key_lines[key]}); remove one of them")
        result[key] = loader.construct_object(value_node, deep=True)
        result.key_lines[key] = key_node.start_mark.line + 1
    return result


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


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
        hint = ("the file may be truncated or a quote/bracket left open — complete the entry"
                if "end of stream" in what or "unexpected end" in what or "found unexpected end" in what
                else "fix the YAML syntax at that line")
        raise ManifestError(f"`opforge manifest`: {filename}:{line}: YAML syntax error — {what} — {hint}") from None
    except yaml.YAMLError as exc:
        raise ManifestError(f"`opforge manifest`: {filename}: YAML error — {exc}") from None
