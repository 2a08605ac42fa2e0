"""``opforge manifest FILE``: validate an operator manifest and list its ops and kernels."""

from __future__ import annotations

import json

import click


@click.command("manifest")
@click.argument("path", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the operators as JSON.")
def manifest(path: str, as_json: bool) -> None:
    """Validate the manifest at PATH and list every operator with its kernels."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from opforge.manifest import load_manifest

    defs = load_manifest(path)
    rows = [{
        "op": d.name,
        "functional": str(d.functional),
        "out": str(d.out),
        "aten": d.is_aten,
        "kernels": [{"kernel_name": k.kernel_name, "cpp": k.cpp_name, "dtype_key": k.dtype_key}
                    for k in d.kernels],
        "python": d.python_impl if isinstance(d.python_impl, str) else None,
        "fake": d.fake if isinstance(d.fake, str) else None,
        "source": d.source,
    } for d in defs]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    console = Console()
    table = Table(title=f"{path}: {len(defs)} operator(s)", show_lines=True)
    for col in ("operator", "schemas (functional / out)", "kernels (C++ · dtypes)", "python · fake", "defined at"):
        table.add_column(col, overflow="fold")
    for d, r in zip(defs, rows):
        kernels = "\n".join(f"{k['cpp']} · {k['dtype_key']}" for k in r["kernels"]) or "—"
        cells = (d.name + (" (ATen)" if d.is_aten else ""), f"{r['functional']}\n{r['out']}",
                 kernels, f"{r['python'] or '—'}\n{r['fake'] or '—'}", d.source)
        table.add_row(*(escape(c) for c in cells))
    console.print(table)
