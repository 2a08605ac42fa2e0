"""CANN's side of vendor packages: what MindSpore's ``custom_compiler`` (``python setup.py``)
takes and installs, and how the search path reads CANN's folders (no torch).

    SOC_VERSIONS                 the --soc_version values the real tool accepts
    check_options(...)           --soc_version / --ascend_cann_package_path, checked as it does
    install_root(install_path)   --install_path, else $ASCEND_OPP_PATH, else opforge's default
    write_install_layout(...)    vendors/config.ini (load_priority) and bin/set_env.bash
    vendor_folders(entry)        a search-path entry's packages, in CANN's load_priority order

# Design
#
# An installed CANN custom-op package is ``<install_path>/vendors/<vendor>/`` (op_api,
# op_impl, op_proto, framework, bin/set_env.bash) and ``<install_path>/vendors/config.ini``
# lists the vendors in load order (``load_priority=a,b``; the first wins). opforge's
# package is the same folder with its own op_info.json, lib/ and include/ inside, so one
# install path serves both. opforge builds CPU kernels: it does not compile Ascend C device
# code, so --soc_version and --ascend_cann_package_path are checked and recorded, and the
# build says that no device code was built. A CANN package without op_info.json (Ascend
# only) on the search path is skipped with a warning naming it, never silently.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

from opforge.errors import BuildError

__all__ = ["SOC_VERSIONS", "AscendOnlyPackageWarning", "check_options", "install_root",
           "write_install_layout", "vendor_folders", "CONFIG_INI", "SET_ENV"]

SOC_VERSIONS = ("ascend310p", "ascend310b", "ascend910", "ascend910b", "ascend910_93", "ascend950")
CONFIG_INI = "config.ini"
SET_ENV = Path("bin") / "set_env.bash"
OP_INFO = "op_info.json"
_CANN_PARTS = ("op_impl", "op_proto", "op_api", "framework")
API = "opforge msop build"


class AscendOnlyPackageWarning(UserWarning):
    """A CANN vendor package on the search path holds no opforge op_info.json: its ops run
    on Ascend devices only, and opforge skips it."""


def check_options(soc_version: str = "", ascend_cann_package_path: str = "") -> list[str]:
    """Check the two CANN options as the real tool does; the notes to print (what opforge
    does not do with them)."""
    notes = []
    if soc_version:
        socs = soc_version.split(";")
        bad = [s for s in socs if s not in SOC_VERSIONS]
        if bad:
            raise BuildError(f"`{API}`: --soc_version {soc_version!r} — unsupported "
                             f"{', '.join(map(repr, bad))} — valid: {', '.join(SOC_VERSIONS)}, "
                             "';'-separated (as MindSpore's custom_compiler) — fix: e.g. "
                             "--soc_version 'ascend910b;ascend310p'")
        notes.append(f"--soc_version {soc_version}: recorded; opforge builds the CPU kernels "
                     "only and compiles no Ascend C device code for these SoCs (use "
                     "MindSpore's custom_compiler with CANN for that)")
    if ascend_cann_package_path:
        if not Path(ascend_cann_package_path).is_dir():
            raise BuildError(f"`{API}`: --ascend_cann_package_path "
                             f"{ascend_cann_package_path!r} — not a folder — valid: the CANN "
                             "install (e.g. /usr/local/Ascend/latest) — fix: check the path")
        notes.append("--ascend_cann_package_path: checked; opforge needs no CANN to build "
                     "CPU kernels and does not use it")
    return notes


def install_root(install_path) -> Path:
    """Where an install goes, as the real tool: --install_path, else $ASCEND_OPP_PATH,
    else opforge's default install location (on opforge's search path)."""
    if install_path:
        return Path(install_path)
    if os.environ.get("ASCEND_OPP_PATH"):
        return Path(os.environ["ASCEND_OPP_PATH"])
    from opforge.mindspore.package import default_install_path

    return default_install_path()


def _priority(vendors: Path) -> list[str]:
    try:
        text = (vendors / CONFIG_INI).read_text()
    except OSError:
        return []
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() == "load_priority":
            return [v.strip() for v in value.split(",") if v.strip()]
    return []


def write_install_layout(root: Path, vendor_name: str) -> tuple[Path, Path]:
    """After installing ``<root>/vendors/<vendor_name>``: put it first in
    ``vendors/config.ini``'s load_priority (the others keep their order) and write its
    ``bin/set_env.bash``. Returns both paths."""
    vendors = Path(root) / "vendors"
    order = [vendor_name] + [v for v in _priority(vendors) if v != vendor_name]
    config = vendors / CONFIG_INI
    config.write_text(f"load_priority={','.join(order)}\n")
    package = vendors / vendor_name
    set_env = package / SET_ENV
    set_env.parent.mkdir(parents=True, exist_ok=True)
    set_env.write_text(
        "#!/bin/bash\n"
        f"# written by `opforge msop build`: makes vendor package {vendor_name} visible\n"
        f"export ASCEND_CUSTOM_OPP_PATH={package.resolve()}:${{ASCEND_CUSTOM_OPP_PATH}}\n"
        f"export OPFORGE_CUSTOM_OPP_PATH={package.resolve()}:${{OPFORGE_CUSTOM_OPP_PATH}}\n")
    return config, set_env


_warned: set[Path] = set()


def _skip(folder: Path) -> None:
    if folder not in _warned:
        _warned.add(folder)
        warnings.warn(f"vendor package {folder}: a CANN package without {OP_INFO} (its ops "
                      "run on Ascend devices only); opforge skips it — fix: build the CPU "
                      "kernels with `opforge msop build` into the same vendor folder, or "
                      "remove it from the search path", AscendOnlyPackageWarning, stacklevel=4)


def vendor_folders(entry: Path) -> list[Path]:
    """The packages a search-path entry that holds no op_info.json gives: its ``vendors/``
    children in ``config.ini``'s load_priority order (the rest in name order), or nothing
    (an Ascend-only CANN package, warned about)."""
    vendors = entry / "vendors"
    if not vendors.is_dir():
        if any((entry / part).is_dir() for part in _CANN_PARTS):
            _skip(entry)
        return []
    rank = {name: i for i, name in enumerate(_priority(vendors))}
    children = sorted((p for p in vendors.iterdir() if p.is_dir()),
                      key=lambda p: (rank.get(p.name, len(rank)), p.name))
    found = []
    for child in children:
        if (child / OP_INFO).is_file():
            found.append(child)
        elif any((child / part).is_dir() for part in _CANN_PARTS):
            _skip(child)
    return found
