"""``opforge oppackage new|build``: op packages from an OpDef (Qualcomm's XML format, or an
``op_package:`` entry of a YAML manifest) to a compiled library a backend loads."""

from __future__ import annotations

import json
from pathlib import Path

import click

__all__ = ["oppackage"]


@click.group("oppackage")
def oppackage() -> None:
    """Op packages: generate a skeleton from an OpDef, build it for a target."""


def _read_package(source: Path, package: str | None):
    """(OpPackage, its OpDef XML text) from an XML file or a manifest's op_package entry."""
    from opforge.backends.oppackage.xml_reader import load_opdef_xml
    from opforge.backends.oppackage.xml_writer import to_opdef_xml
    from opforge.backends.oppackage.yaml_reader import load_manifest_packages
    from opforge.errors import ManifestError

    if source.suffix.lower() == ".xml":
        pkg = load_opdef_xml(source)
        if package and package != pkg.name:
            raise ManifestError(f"`opforge oppackage new`: {source} declares package {pkg.name!r}, "
                                f"not {package!r} — fix: drop --package or check the file")
        return pkg, source.read_text(encoding="utf-8")
    found = load_manifest_packages(source)
    if package:
        found = [p for p in found if p.name == package]
    if len(found) != 1:
        names = ", ".join(p.name for p in load_manifest_packages(source)) or "none"
        raise ManifestError(
            f"`opforge oppackage new`: {source}: {len(found)} op_package entries match — found: "
            f"{names} — valid: an OpDef .xml file, or a manifest with one op_package entry (or "
            "--package NAME) — fix: name the package with --package")
    return found[0], to_opdef_xml(found[0])


@oppackage.command("new")
@click.argument("source", type=click.Path(dir_okay=False, path_type=Path))
@click.option("-o", "--output", "output", required=True, type=click.Path(path_type=Path),
              help="The project folder to create (new or empty).")
@click.option("--package", default=None, help="Which op_package of a YAML manifest.")
@click.option("--force", is_flag=True, help="Write into a non-empty folder (op sources there are kept).")
def new(source: Path, output: Path, package: str | None, force: bool) -> None:
    """Generate a package project from SOURCE (an OpDef .xml, or a manifest .yaml with an
    op_package entry): one C++ source per op, the interface provider, build files."""
    from opforge.backends.oppackage.skeleton import generate_skeleton, skeleton_ops

    pkg, xml_text = _read_package(source, package)
    generate_skeleton(pkg, xml_text, output, force=force)
    click.echo(f"package {pkg.name} → {output}/")
    for sk in skeleton_ops(pkg):
        click.echo(f"  src/ops/{sk.name}.cpp: {sk.signature}")
    click.echo(f"next: write the op bodies, then `opforge oppackage build {output} --target cpu "
               f"-o libQnn{pkg.name}.so`")


@oppackage.command("build")
@click.argument("project", type=click.Path(file_okay=False, path_type=Path))
@click.option("--target", default="cpu", show_default=True,
              help="cpu (htp, dsp, gpu, lpai need Qualcomm's SDKs and are refused).")
@click.option("--platform", default=None, help="x86_64, aarch64_android, aarch64 (default: this machine).")
@click.option("-o", "--output", "output", default=None, type=click.Path(path_type=Path),
              help="The library to write (default: ./libQnn<Package>.so).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def build(project: Path, target: str, platform: str | None, output: Path | None, as_json: bool) -> None:
    """Compile the package project PROJECT (made by `opforge oppackage new`)."""
    from opforge.backends.oppackage.build import build_package, check_target, find_opdef
    from opforge.backends.oppackage.xml_reader import load_opdef_xml

    t, p = check_target(target, platform)  # refuse before reading anything
    library = build_package(project, target=t, platform=p, output=output)
    pkg = load_opdef_xml(find_opdef(project))
    if as_json:
        click.echo(json.dumps({"library": str(library), "package": pkg.name, "target": t,
                               "platform": p, "ops": [op.name for op in pkg.ops],
                               "interface_provider": f"{pkg.name}InterfaceProvider"}))
        return
    click.echo(f"built {library} (package {pkg.name}, target {t}, platform {p}; ops: "
               f"{', '.join(op.name for op in pkg.ops)}; interface provider "
               f"{pkg.name}InterfaceProvider)")
