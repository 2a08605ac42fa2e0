"""``opforge bundle PROGRAM... -o DIR``: an app folder that runs programs without Python
(the native runtime, only the kernels the programs call, CMakeLists.txt and main.c).

``--target aarch64-linux-gnu`` cross-compiles (docs/arm.md); ``--kernel-sources MANIFEST
a.cpp,b.cpp`` compiles a custom kernel library for the app's machine; ``--build`` runs the
two cmake commands too and reports the stripped app's size."""

from __future__ import annotations

import click

__all__ = ["bundle"]


@click.command("bundle")
@click.argument("programs", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("-o", "--output", "out_dir", required=True, type=click.Path(file_okay=False),
              help="The folder to write (new or empty).")
@click.option("--kernels", "libraries", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="A native kernel library for the programs' custom operators; repeatable.")
@click.option("--kernel-sources", "kernel_sources", multiple=True, nargs=2,
              type=(click.Path(exists=True, dir_okay=False), str),
              help="MANIFEST SOURCE[,SOURCE...]: a custom kernel library the bundle compiles "
                   "(for --target too); repeatable.")
@click.option("--target", default=None, help="Cross-compile for this machine "
              "(aarch64-linux-gnu); default: this one.")
@click.option("--build", "build_type", default=None, type=click.Choice(["MinSizeRel", "Release"]),
              help="Also build the app (cmake) with this build type and report its size.")
@click.option("--method", "method_name", default="forward", show_default=True,
              help="The method main.c runs.")
@click.option("--app", default="opforge_app", show_default=True, help="The executable's name.")
def bundle(programs: tuple[str, ...], out_dir: str, libraries: tuple[str, ...],
           kernel_sources: tuple[tuple[str, str], ...], target: str | None,
           build_type: str | None, method_name: str, app: str) -> None:
    """Write what an app needs to run PROGRAMS with the native runtime."""
    from opforge.native_runtime.bundle import KernelSources
    from opforge.native_runtime.bundle import bundle as write_bundle

    specs = [KernelSources(manifest, tuple(s for s in sources.split(",") if s))
             for manifest, sources in kernel_sources]
    written = write_bundle(programs, out_dir, kernels=libraries, method=method_name, app=app,
                           kernel_sources=specs, target=target)
    click.echo(f"wrote {written.path}: {len(written.programs)} program(s), "
               f"{len(written.selected)} portable kernel(s), {len(written.libraries)} native "
               f"librar{'y' if len(written.libraries) == 1 else 'ies'}"
               + (f", for {written.target}" if written.target else ""))
    if written.cpu is not None:
        click.echo(f"cpu delegates: {written.cpu.engine} and {written.cpu.onednn} (linked by the app)")
    if written.target:
        click.echo("build report:\n  " + written.report.read_text().strip().replace("\n", "\n  "))
    if build_type is None:
        click.echo(f"build it: cmake -S {written.path} -B {written.path}/build "
                   f"-DCMAKE_BUILD_TYPE=Release && cmake --build {written.path}/build")
        return
    from opforge.native_runtime.bundle_build import build_bundle, stripped_size

    built = build_bundle(written, build_type)
    click.echo(f"built {built} ({build_type}): {stripped_size(built, written.target):,} bytes "
               "stripped")
