"""Tables never cut names when stdout is not a terminal (issue 16, item 7)."""

from __future__ import annotations

import io
from pathlib import Path

from rich.table import Table

import opforge.cli
from opforge.cli.tables import table_console

NAME = "custom::native::scale_" + "shifted_" * 30 + "out"


def test_a_piped_table_keeps_whole_names_and_rules_stay_short():
    out = io.StringIO()
    console = table_console(file=out)
    table = Table("op", "C++ kernel", title="kernels")
    table.add_row("my_ops::scale.out", NAME)
    console.rule("kernels")
    console.print(table)
    console.print(f"built {NAME}.so")
    text = out.getvalue()
    assert NAME in text and f"built {NAME}.so" in text and "…" not in text
    assert len(text.splitlines()[0]) == 80


def test_every_verb_prints_on_the_table_console():
    for path in Path(opforge.cli.__file__).parent.glob("*_cmd.py"):
        source = path.read_text()
        if "Table(" in source:
            assert "table_console()" in source and "Console()" not in source, path.name
