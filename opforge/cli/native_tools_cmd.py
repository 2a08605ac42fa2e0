"""``opforge native-tools [--install-dir DIR]``: build (or find) the native runtime's tools
and print where they are; with ``--install-dir``, copy them, the runtime libraries and the
C headers there, to run without Python (docs/native-tools.md)."""

from __future__ import annotations

import click

__all__ = ["native_tools"]


@click.command("native-tools")
@click.option("--install-dir", "install_dir", type=click.Path(file_okay=False),
              help="Copy bin/opforge-run, bin/opforge-generate, lib/ and include/ here.")
def native_tools(install_dir: str | None) -> None:
    """Build opforge-run and opforge-generate (cached) and show or install them."""
    from opforge.native_runtime.launcher import TOOLS, built_tools, install_tools

    if install_dir is None:
        built = built_tools()
        for name in TOOLS:
            click.echo(f"{name}: {built.tool(name)}")
        click.echo(f"libopforge_runtime: {built.runtime_library}")
        click.echo(f"libopforge_portable: {built.portable_library}")
        return
    installed = install_tools(install_dir, quiet=False)
    for path in installed.files:
        click.echo(f"wrote {path}")
    click.echo(f"run: {installed.tool('opforge-run')} --help (no Python needed)")
