"""The console the verbs print on: tables and names are never cut in a pipe.

On a terminal, output fits the window as rich lays it out. When stdout is not a terminal
(a pipe, a file, a script capturing the output) rich assumes 80 columns: it cuts long table
cells with an ellipsis (``custom::native::scale_sh…``) and breaks long lines, so a script
could not read an operator, kernel or path back. There the console is made wide enough for
any name instead; a table is only as wide as its content, so short tables do not change.
Horizontal rules, which would span the whole width, keep 80 columns.
"""

from __future__ import annotations

from typing import Any

__all__ = ["table_console", "PIPE_WIDTH"]

# wide enough that no schema, operator, kernel or path name is ever cut
PIPE_WIDTH = 100_000
_RULE_WIDTH = 80


def table_console(**kwargs: Any):
    """A ``rich.console.Console`` that never cuts names when not on a terminal.

    >>> table_console(file=__import__("io").StringIO()).width   # not a terminal
    100000
    """
    from rich.console import Console
    from rich.rule import Rule

    class _PipeConsole(Console):
        def rule(self, title: Any = "", *, characters: str = "─", style: Any = "rule.line",
                 align: Any = "center") -> None:
            self.print(Rule(title, characters=characters, style=style, align=align),
                       width=min(self.width, _RULE_WIDTH))

    console = Console(**kwargs)
    if console.is_terminal:
        return console
    console = _PipeConsole(**kwargs)
    console.width = PIPE_WIDTH
    return console
