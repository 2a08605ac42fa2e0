"""Where a graph node came from, in words a user can act on.

Every export error names the node and, when torch recorded it, the line of model
source that produced it (``node.meta["stack_trace"]``). This module turns a node into
that subject text; it builds no messages itself.
"""

from __future__ import annotations

import os
import re
import traceback

import torch
import torch.fx

__all__ = ["node_location", "source_line", "describe_node", "user_frame_of_exception"]

_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>[^\n]+)\n(?P<code>[^\n]*)')


# Frames inside torch or opforge's export stage are never what the user should edit.
_LIBRARY_DIRS = (
    os.path.dirname(os.path.abspath(torch.__file__)) + os.sep,
    os.path.dirname(os.path.abspath(__file__)) + os.sep,
)


def _is_library_file(path: str) -> bool:
    return os.path.abspath(path).startswith(_LIBRARY_DIRS) or "/site-packages/" in path


def source_line(stack_trace: str | None) -> str | None:
    """The innermost user frame of a recorded stack trace, as ``file:line (code)``."""
    if not stack_trace:
        return None
    frames = [m for m in _FRAME.finditer(stack_trace) if not _is_library_file(m["file"])]
    if not frames:
        return None
    last = frames[-1]
    code = last["code"].strip()
    return f"{last['file']}:{last['line']} in {last['func'].strip()}" + (f" ({code})" if code else "")


def node_location(node: torch.fx.Node) -> str | None:
    """``file:line in func (code)`` of the model source that produced ``node``, if known."""
    return source_line(node.meta.get("stack_trace"))


def describe_node(node: torch.fx.Node) -> str:
    """``node `name` (target) at file:line`` — the subject part of an error message."""
    target = getattr(node.target, "__name__", None) if node.op != "call_function" else None
    target = target or str(node.target)
    where = node_location(node)
    return f"node `{node.name}` ({target})" + (f" at {where}" if where else "")


def user_frame_of_exception(exc: BaseException) -> str | None:
    """The model source line an exception points at: from its message, else its traceback."""
    where = source_line(str(exc))
    if where:
        return where
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not _is_library_file(f.filename)]
    if not frames:
        return None
    f = frames[-1]
    return f"{f.filename}:{f.lineno} in {f.name}" + (f" ({f.line.strip()})" if f.line else "")
