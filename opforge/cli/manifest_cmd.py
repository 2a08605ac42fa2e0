"""``opforge manifest PATH``: validate an operator manifest and list its ops and kernels.

PATH is a YAML manifest, a ``path/to/ops.py`` file or a module name (``pkg.ops``) whose
``@opforge.op`` definitions are listed (see :func:`opforge.manifest.load_definitions`).
"""

from __future__ import annotations

import json

import click


@click.command("manifest")
@click.argument("path", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the operators as JSON.")
def manifest(path: str, as_json: bool) -> None:
    """Validate the manifest at PATH and list every operator with its kernels.

    PATH is a YAML manifest, a path/to/ops.py file or a module name (pkg.ops) whose
    @opforge.op operators are listed; modules are found from the current directory first.
    """
    from rich.markup import escape
    from rich.table import Table

    from opforge.cli.tables import table_console
    from opforge.manifest import load_definitions

    defs = load_definitions(path)
    rows = [{
        "op": d.name,
        "functional": str(d.functional),
        "out": str(d.out),
        "aten": d.is_aten,
        "kernels": [{"kernel_name": k.kernel_name, "cpp": k.cpp_name, "dtype_key": k.dtype_key}
                    for k in d.kernels],
        "python": _reference(d.python_impl),
        "fake": _reference(d.fake),
        "source": d.source,
    } for d in defs]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    console = table_console()
    table = Table(title=f"{path}: {len(defs)} operator(s)", show_lines=True)
    for col in ("operator", "schemas (functional / out)", "kernels (C++ · dtypes)", "python · fake", "defined at"):
        table.add_column(col, overflow="fold")
    for d, r in zip(defs, rows):
        kernels = "\n".join(f"{k['cpp']} · {k['dtype_key']}" for k in r["kernels"]) or "—"
        cells = (d.name + (" (ATen)" if d.is_aten else ""), f"{r['functional']}\n{r['out']}",
                 kernels, f"{r['python'] or '—'}\n{r['fake'] or '—'}", d.source)
        table.add_row(*(escape(c) for c in cells))
    console.print(table)


def _reference(ref) -> str | None:
    """A ``python:``/``fake:`` reference as ``module:function`` (a callable from Python too)."""
    if ref is None or isinstance(ref, str):
        return ref
    return f"{getattr(ref, '__module__', '?')}:{getattr(ref, '__qualname__', repr(ref))}"
