"""``opforge msop build``: MindSpore's offline compile tool (same parameters) for AOT ops."""

from __future__ import annotations

import click

__all__ = ["msop"]


@click.group("msop")
def msop() -> None:
    """MindSpore-style AOT operators: build and install vendor packages."""


@msop.command("build")
@click.option("--op_host_path", "-o", "op_host_path", required=True,
              help="Folder of prototypes (*.yaml/*.json) and host C++ (inference).")
@click.option("--op_kernel_path", "-k", "op_kernel_path", required=True,
              help="Folder of kernels (*.cc/*.cpp, MindSpore's C signature).")
@click.option("--soc_version", default="",
              help="Ascend SoCs, ';'-separated (checked and recorded; opforge builds CPU "
                   "kernels only).")
@click.option("--ascend_cann_package_path", default="",
              help="The CANN install (checked; opforge needs no CANN for CPU kernels).")
@click.option("--vendor_name", default="customize", show_default=True,
              help="The package's name: vendors/<vendor_name>/.")
@click.option("--install_path", default=None,
              help="Install into DIR/vendors/<vendor_name> (implies -i, as MindSpore's tool).")
@click.option("-i", "--install", "install", is_flag=True,
              help="Install the package (to --install_path, else $ASCEND_OPP_PATH, else "
                   "~/.local/share/opforge/opp).")
@click.option("-c", "--clear", "clean", is_flag=True,
              help="Delete the log and intermediate files.")
def build(op_host_path, op_kernel_path, soc_version, ascend_cann_package_path, vendor_name,
          install_path, install, clean) -> None:
    """Compile prototypes and kernels into a vendor package (and install it with -i), with
    the options of MindSpore's custom_compiler (python setup.py)."""
    from opforge.mindspore.cann import check_options, install_root, write_install_layout
    from opforge.mindspore.msop import build_vendor_package
    from opforge.mindspore.package import SEARCH_PATH_ENV

    notes = check_options(soc_version, ascend_cann_package_path)
    install = install or bool(install_path)
    root = install_root(install_path) if install else None
    result = build_vendor_package(op_host_path, op_kernel_path, vendor_name=vendor_name,
                                  install_path=root, install=install, clean=clean)
    for note in notes:
        click.echo(f"note: {note}")
    click.echo(f"built vendor package {result.package} ({', '.join(result.ops)})")
    if result.installed is not None:
        config, set_env = write_install_layout(root, vendor_name)
        click.echo(f"installed to {result.installed} (load_priority in {config}); find it "
                   f"with `source {set_env}`, or {SEARCH_PATH_ENV}={result.installed}:"
                   f"${SEARCH_PATH_ENV}")


@msop.command("check")
@click.argument("op")
@click.option("--reference", default=None,
              help="module:function computing the op on tensors (default: the Custom's own).")
@click.option("--seed", default=0, show_default=True, help="Seed of the sample values.")
def check(op, reference, seed) -> None:
    """opcheck a MindSpore-style op: OP is module:attr naming a Custom (or a function
    returning one); fake vs real shapes, kernel vs reference, eager vs the lean runtime."""
    from opforge.manifest import resolve_reference
    from opforge.mindspore import Custom, check as check_custom

    target = resolve_reference(op, what="Custom op", source="opforge msop check") \
        if ":" in op else None
    if target is None:
        raise click.ClickException(f"{op!r}: expected module:attr naming a Custom")
    custom = target if isinstance(target, Custom) else target()
    if not isinstance(custom, Custom):
        raise click.ClickException(f"{op!r}: gave {type(custom).__name__}, not a Custom")
    ref = resolve_reference(reference, what="reference", source="--reference") if reference else None
    report = check_custom(custom, ref, seed=seed)
    click.echo(f"{report.key}: {report.samples} sample(s), dtypes {', '.join(report.dtypes) or '-'}")
    for name, message in report.failures.items():
        click.echo(f"  FAIL {name}: {message}")
    if not report.ok:
        raise click.ClickException(f"{report.key} failed the check")
    click.echo("check: passed")
