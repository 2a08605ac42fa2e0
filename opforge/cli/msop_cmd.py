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
@click.option("--vendor_name", default="customize", show_default=True,
              help="The package's name: vendors/<vendor_name>/.")
@click.option("--install_path", default=None,
              help="Where -i installs (default: ~/.local/share/opforge/opp).")
@click.option("-i", "install", is_flag=True, help="Install the package after building it.")
@click.option("-c", "clean", is_flag=True, help="Delete the log and intermediate files.")
def build(op_host_path, op_kernel_path, vendor_name, install_path, install, clean) -> None:
    """Compile prototypes and kernels into a vendor package (and install it with -i)."""
    from opforge.mindspore.msop import build_vendor_package
    from opforge.mindspore.package import SEARCH_PATH_ENV

    result = build_vendor_package(op_host_path, op_kernel_path, vendor_name=vendor_name,
                                  install_path=install_path, install=install, clean=clean)
    click.echo(f"built vendor package {result.package} ({', '.join(result.ops)})")
    if result.installed is not None:
        click.echo(f"installed to {result.installed}; find it with "
                   f"{SEARCH_PATH_ENV}={result.installed}:${SEARCH_PATH_ENV}")
