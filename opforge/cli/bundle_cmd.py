"""``opforge bundle PROGRAM... -o DIR``: an app folder that runs programs without Python
(the native runtime, only the kernels the programs call, CMakeLists.txt and main.c)."""

from __future__ import annotations

import click

__all__ = ["bundle"]


@click.command("bundle")
@click.argument("programs", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("-o", "--output", "out_dir", required=True, type=click.Path(file_okay=False),
              help="The folder to write (new or empty).")
@click.option("--kernels", "libraries", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="A native kernel library for the programs' custom operators; repeatable.")
@click.option("--method", "method_name", default="forward", show_default=True,
              help="The method main.c runs.")
@click.option("--app", default="opforge_app", show_default=True, help="The executable's name.")
def bundle(programs: tuple[str, ...], out_dir: str, libraries: tuple[str, ...],
           method_name: str, app: str) -> None:
    """Write what an app needs to run PROGRAMS with the native runtime."""
    from opforge.native_runtime.bundle import bundle as write_bundle

    written = write_bundle(programs, out_dir, kernels=libraries, method=method_name, app=app)
    click.echo(f"wrote {written.path}: {len(written.programs)} program(s), "
               f"{len(written.selected)} portable kernel(s), {len(written.libraries)} native "
               f"librar{'y' if len(written.libraries) == 1 else 'ies'}")
    if written.cpu is not None:
        click.echo(f"cpu delegates: {written.cpu.engine} and {written.cpu.onednn} (linked by the app)")
    click.echo(f"build it: cmake -S {written.path} -B {written.path}/build "
               f"-DCMAKE_BUILD_TYPE=Release && cmake --build {written.path}/build")
