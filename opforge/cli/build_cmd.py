"""``opforge build MANIFEST --sources a.cpp b.cpp -o libmy_ops.so``: compile native kernels.

Selection (ExecuTorch's selective build): ``--op ns::op`` (repeatable) for root ops,
``--program model.opf`` (repeatable) for the operators of exported programs,
``--include-all-ops`` (the default when neither is given); ``--dtype Float`` (repeatable)
keeps only dtype-specific kernels for those dtypes. Reports the kernels included, the
library's size, and whether it came from the cache; ``--json`` prints the same as one JSON
object for scripts.

MANIFEST is a YAML manifest, a ``path/to/ops.py`` file or a module name whose
``@opforge.op`` operators (with ``kernels=[KernelBinding(...)]``) are built; modules are
found from the current directory first.
"""

from __future__ import annotations

import json

import click


@click.command("build")
@click.argument("manifest", type=click.Path(dir_okay=False))
@click.option("--sources", "-s", "sources", multiple=True, required=True,
              help="C++ source(s) defining the kernels (repeat, or list them after one --sources).")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False),
              help="The library to write, e.g. libmy_ops.so.")
@click.option("--op", "ops", multiple=True, help="Root op to include (ns::op); repeatable.")
@click.option("--program", "programs", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="Include the operators of this program file; repeatable.")
@click.option("--include-all-ops", is_flag=True, help="Include every op of the manifest (default).")
@click.option("--dtype", "dtypes", multiple=True, help="Keep dtype-specific kernels of this dtype "
              "(c10 name: Float, Double, Int, Long, ...); repeatable.")
@click.option("--flag", "flags", multiple=True, help="Extra compiler flag, e.g. --flag=-O3; repeatable.")
@click.option("--name", default=None, help="Library name in its kernel table (default: from -o).")
@click.option("--target", default=None, help="Cross-compile for this machine (aarch64-linux-gnu; "
              "docs/arm.md); default: this one.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON object "
              "(library, key, cached, ops, kernels, ...) instead of tables.")
@click.argument("more_sources", nargs=-1, type=click.Path())
def build(manifest, sources, output, ops, programs, include_all_ops, dtypes, flags, name,
          more_sources, as_json, target) -> None:
    """Compile MANIFEST's kernels from --sources into one shared library.

    MANIFEST is a YAML manifest, a path/to/ops.py file or a module name (pkg.ops) whose
    @opforge.op operators are built; modules are found from the current directory first.
    """
    from rich.markup import escape
    from rich.table import Table

    from opforge.cli.tables import table_console
    from opforge.native import build_library

    if include_all_ops and (ops or programs):
        raise click.UsageError("--include-all-ops excludes --op and --program")
    console = table_console()
    result = build_library(manifest, [*sources, *more_sources], output, ops=list(ops),
                           programs=list(programs), dtypes=list(dtypes) or None, name=name,
                           extra_flags=tuple(flags), progress=not as_json, target=target)
    if as_json:
        click.echo(json.dumps(build_json(result), indent=2))
        return
    table = Table("op", "dtype key", "C++ kernel", title=f"kernels in {escape(str(result.path))}")
    for key, dtype_key, cpp in result.kernels:
        table.add_row(escape(key), escape(dtype_key), escape(cpp))
    console.print(table)
    how = "from the cache" if result.cached else "compiled"
    console.print(f"selection: {escape(result.selection)}")
    if result.unserved:
        console.print(f"program ops without kernels in the manifest (served by the runtime's "
                      f"own kernels): {escape(', '.join(result.unserved))}")
    console.print(f"[bold green]built[/] {escape(str(result.path))}: {len(result.ops)} op(s), "
                  f"{len(result.kernels)} kernel(s), {result.size:,} bytes, {how} in "
                  f"{result.seconds:.2f} s")


def build_json(result) -> dict:
    """What ``build --json`` prints: a :class:`~opforge.native.BuildResult` as plain data."""
    return {
        "library": str(result.path),
        "key": result.key,
        "cached": result.cached,
        "seconds": round(result.seconds, 3),
        "size": result.size,
        "selection": result.selection,
        "ops": result.ops,
        "kernels": [{"op": key, "dtype_key": dtype_key, "cpp": cpp}
                    for key, dtype_key, cpp in result.kernels],
        "unserved": list(result.unserved),
        "compiled": list(result.compiled),  # what this build recompiled ([] on a cache hit)
        "project_dir": str(result.project_dir),
    }
