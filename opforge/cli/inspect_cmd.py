"""``opforge inspect model.opf``: methods, operator table, instructions, memory plan and
constants of a program file, as rich tables (or ``--json``)."""

from __future__ import annotations

import json
from typing import Any

import click

__all__ = ["inspect", "summary"]


def summary(program: Any) -> dict:
    """``opforge.program.describe`` plus the planner's numbers from the user metadata."""
    from opforge.program import describe

    data = describe(program)
    meta = program.metadata
    for method in data["methods"]:
        name = method["name"]
        naive = meta.get(f"opforge.memory_plan.{name}.naive_bytes")
        arena = method["memory_plan"]["total_bytes"]
        method["memory_plan"]["naive_bytes"] = int(naive) if naive is not None else None
        method["memory_plan"]["reuse_ratio"] = round(int(naive) / arena, 3) if naive and arena else None
    from opforge.backends.report import delegation_report

    data["delegation"] = delegation_report(program)
    for entry in data["delegates"]:
        entry.update(_describe_blob(program, entry["index"]))
    return data


def _describe_blob(program: Any, index: int) -> dict:
    """The backend's own view of one blob (ops, the implementation of each node), when the
    backend is installed here; otherwise why not. Never fails: inspect is for broken files."""
    from opforge.backends import decode_specs, get_backend
    from opforge.errors import OpforgeError

    blob = program.delegates[index]
    own = [(k, v) for k, v in blob.compile_specs if not k.startswith("opforge.")]
    out: dict = {"blob_bytes": program.segments[blob.segment].nbytes,
                 "specs": {k: v.decode("utf-8", "replace") for k, v in blob.compile_specs}}
    try:
        backend = get_backend(blob.id)
        specs = decode_specs(blob.id, backend.compile_spec_defs, own)
        out["backend_view"] = backend.describe_blob(program.segments[blob.segment].data, specs)
    except OpforgeError as e:
        out["backend_view_error"] = str(e)
    return out


@click.command("inspect")
@click.argument("path", type=click.Path(exists=True, dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option("--values", is_flag=True, help="Also list every value of each method.")
def inspect(path: str, as_json: bool, values: bool) -> None:
    """Show a program file's methods, operators, instructions, memory plan and constants."""
    from opforge.program import load

    data = summary(load(path))
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    _print(data, path, values)


def _print(data: dict, path: str, show_values: bool) -> None:
    from rich.markup import escape
    from rich.table import Table

    from opforge.cli.tables import table_console
    from opforge.program.describe import data_sizes

    console = table_console()
    console.print(f"[bold]{escape(path)}[/bold] — format {data['format_version']}, "
                  f"{len(data['methods'])} method(s), {data_sizes(data)}")
    for method in data["methods"]:
        plan = method["memory_plan"]
        console.rule(f"method [bold]{escape(method['name'])}[/bold]")
        console.print(f"inputs {method['inputs']}  outputs {method['outputs']}  "
                      f"{len(method['values'])} values, {len(method['instructions'])} instructions")
        ops = Table("#", "operator", "calls", title="operators")
        for op in method["operators"]:
            ops.add_row(str(op["index"]), escape(op["key"]), str(op["calls"]))
        console.print(ops)
        dynamic = method.get("dynamic")
        if dynamic and dynamic["symbols"]:
            symbols = Table("symbol", "min", "max", "memory", title="symbols (arenas at max)")
            for sym in dynamic["symbols"]:
                symbols.add_row(escape(sym["name"]), str(sym["min"]), str(sym["max"]),
                                "grows" if sym.get("grow") else "planned at max")
            console.print(symbols)
            if dynamic.get("growing_values"):
                console.print("growing tensors (outside the arenas, grown by the runtime): "
                              + ", ".join(f"%{i}" for i in dynamic["growing_values"]))
            for guard in dynamic["guards"]:
                console.print(f"guard: {escape(guard)}")
        if method.get("state"):
            console.print("state: " + ", ".join(f"{escape(s['name'])} (%{s['value']})"
                                                for s in method["state"]))
        memory = Table("arena sizes", "planned bytes", "naive bytes", "reuse", title="memory plan")
        memory.add_row(str(plan["arena_sizes"]), str(plan["total_bytes"]),
                       str(plan["naive_bytes"] if plan["naive_bytes"] is not None else "?"),
                       f"×{plan['reuse_ratio']}" if plan["reuse_ratio"] else "-")
        console.print(memory)
        instructions = Table("#", "instruction", title="instructions")
        for i, ins in enumerate(method["instructions"]):
            instructions.add_row(str(i), escape(ins["text"]))
        console.print(instructions)
        if method["constants"]:
            constants = Table("value", "dtype", "sizes", "segment", "offset", "bytes", title="constants")
            for c in method["constants"]:
                constants.add_row(f"%{c['value']}", c["dtype"], str(c["sizes"]), str(c["segment"]),
                                  str(c["offset"]), str(c["nbytes"]))
            console.print(constants)
        if show_values:
            table = Table("value", title="values")
            for text in method["values"]:
                table.add_row(escape(text))
            console.print(table)
    if data["delegates"]:
        from opforge.cli.delegation_view import print_delegation

        blobs = Table("#", "backend", "segment", "blob bytes", "compile specs", title="delegates")
        for d in data["delegates"]:
            blobs.add_row(str(d["index"]), escape(d["id"]), str(d["segment"]), str(d["blob_bytes"]),
                          escape(", ".join(f"{k}={v}" for k, v in d["specs"].items())))
        console.print(blobs)
        implementations = {d["index"]: d.get("backend_view", {}).get("nodes")
                           for d in data["delegates"]}
        print_delegation(console, data["delegation"], explain=True, implementations=implementations)
        for d in data["delegates"]:
            if "backend_view_error" in d:
                console.print(f"[yellow]delegate {d['index']}:[/yellow] {escape(d['backend_view_error'])}")
    if data["user_metadata"]:
        meta = Table("key", "value", title="metadata")
        for key, value in data["user_metadata"].items():
            if key == "opforge.delegation":
                value = f"({len(value)} bytes of JSON: the delegation report above)"
            elif key == "opforge.debug":
                value = (f"({len(value)} bytes of JSON: the debug handles, each instruction's "
                         "FX node and source line; opforge compare aligns runs by them)")
            meta.add_row(escape(key), escape(value))
        console.print(meta)
