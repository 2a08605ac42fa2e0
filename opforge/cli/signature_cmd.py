"""``opforge signature MANIFEST``: the C++ declarations a manifest's kernels must have."""

from __future__ import annotations

import json
from pathlib import Path

import click


@click.command("signature")
@click.argument("manifest", type=click.Path(dir_okay=False))
@click.option("--op", "ops", multiple=True, metavar="NAME",
              help="Only this op (ns::name or name); repeatable.")
@click.option("--stub", type=click.Path(dir_okay=False), default=None,
              help="Also write a C++ source defining every kernel as 'not implemented yet'.")
@click.option("--json", "as_json", is_flag=True, help="Print the declarations as JSON.")
def signature(manifest: str, ops: tuple[str, ...], stub: str | None, as_json: bool) -> None:
    """Print the C++ declaration of every kernel MANIFEST binds (what to implement).

    Each kernel may take a leading `opforge::KernelContext& ctx` (to report errors) or
    not; the return type must be exactly the one printed.
    """
    from opforge.native.declarations import declarations, render_stub
    from opforge.errors import ManifestError
    from opforge.manifest import load_definitions

    opdefs = load_definitions(manifest, api="opforge signature")
    decls = declarations(opdefs, ops)
    if not decls:
        known = ", ".join(sorted({d.name for d in opdefs})) or "(none)"
        raise ManifestError(
            f"`opforge signature`: {manifest} — no kernel bindings"
            f"{' for ' + ', '.join(ops) if ops else ''} — valid ops: {known} — fix: add "
            "`kernels: [{arg_meta: null, kernel_name: ns::name}]` to the entry, or pass "
            "--op with one of the names above")
    if stub:
        from opforge._user_files import os_error_text, write_atomic

        try:
            write_atomic(Path(stub), [render_stub(decls, manifest).encode()])
        except OSError as e:
            raise click.ClickException(f"`opforge signature --stub`: {os_error_text(e, stub, 'write')}")
    if as_json:
        click.echo(json.dumps([{"declaration": d.text, "without_context": d.without_context,
                                "serves": list(d.ops),
                                "renamed": [{"schema": old, "cpp": new, "why": why}
                                            for old, new, why in d.renamed]}
                               for d in decls], indent=2))
        return
    for d in decls:
        for served in d.ops:
            click.echo(f"// {served}")
        if d.renamed_note:
            click.echo(f"// {d.renamed_note}")
        click.echo(d.text + ";")
        click.echo("")
    if stub:
        click.echo(f"// stub written to {stub}", err=True)
