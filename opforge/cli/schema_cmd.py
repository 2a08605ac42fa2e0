"""``opforge schema "<schema>"``: parse, pretty-print, and show the out/functional twin."""

from __future__ import annotations

import json

import click

from opforge.errors import SchemaError


@click.command("schema")
@click.argument("text")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def schema(text: str, as_json: bool) -> None:
    """Parse an ATen function schema TEXT and show its out (or functional) twin."""
    from rich.markup import escape
    from rich.table import Table

    from opforge.cli.tables import table_console
    from opforge.schema import FunctionSchema

    parsed = FunctionSchema.parse(text, api="opforge schema")
    kind = parsed.kind().value + (" (view)" if parsed.is_view() else "")
    twin_label, twin, why_not = None, None, None
    try:
        if parsed.is_out_variant():
            twin_label, twin = "functional", parsed.functional_variant()
        elif parsed.is_functional():
            twin_label, twin = "out variant", parsed.out_variant()
        else:
            parsed.check_exportable()
    except SchemaError as exc:
        why_not = str(exc)
    if as_json:
        click.echo(json.dumps({
            "schema": str(parsed), "kind": parsed.kind().value, "view": parsed.is_view(),
            "arguments": [{"name": a.name, "type": str(a.type), "default": a.default,
                           "kwarg_only": a in parsed.arguments.kwarg_only,
                           "annotation": None if a.annotation is None else str(a.annotation)}
                          for a in parsed.arguments.flat],
            "returns": [{"name": r.name, "type": str(r.type)} for r in parsed.returns],
            "twin": None if twin is None else {"kind": twin_label, "schema": str(twin)},
            "note": why_not,
        }, indent=2))
        return
    console = table_console()
    console.print(f"[bold]{escape(str(parsed))}[/bold]", soft_wrap=True)
    console.print(f"operator [cyan]{parsed.name.qualified}[/cyan] — {kind}")
    table = Table("#", "argument", "type", "default", "alias", "keyword-only")
    for i, a in enumerate(parsed.arguments.flat):
        table.add_row(str(i), a.name, str(a.type), a.default or "", str(a.annotation or ""),
                      "yes" if a in parsed.arguments.kwarg_only else "")
    console.print(table)
    if parsed.returns:
        console.print("returns: " + escape(", ".join(str(r) for r in parsed.returns)))
    if twin is not None:
        console.print(f"{twin_label}: [green]{escape(str(twin))}[/green]", soft_wrap=True)
    if why_not:
        console.print(f"[yellow]note:[/yellow] {escape(why_not)}", soft_wrap=True)
