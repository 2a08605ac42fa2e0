"""Vendor packages of MindSpore-style AOT operators, the search path, and the lean
runtime's registrar (no torch).

A vendor package (built by ``opforge msop build``, or written with ``write_package``)::

    <install_path>/vendors/<vendor_name>/
        op_info.json              {"format": 1, "vendor": NAME, "ops": [AotOp JSON, ...]}
        lib/lib<vendor_name>_ops.so   kernels, C++ inference and prototypes (OpProto)
        include/custom_aot_extra.h    the header the package was built with

The search path: ``$OPFORGE_CUSTOM_OPP_PATH``, then MindSpore's ``$ASCEND_CUSTOM_OPP_PATH``,
then the default install location (``default_install_path()``); each variable is
colon-separated and earlier entries win. An entry is a vendor package folder (holding
``op_info.json``) or a folder holding ``vendors/<name>/`` packages (taken in the order of
CANN's ``vendors/config.ini`` load_priority, then by name); a CANN package without
``op_info.json`` (Ascend only) is skipped with an ``AscendOnlyPackageWarning``.

Lean mode: ``opforge.runtime.load(program, kernels=["opforge.mindspore:register_vendor_ops"])``
(or ``opforge run --kernels opforge.mindspore:register_vendor_ops``) registers every op of
every package on the search path; ``load_package(path, registry)`` registers one package.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Iterable, Sequence

from opforge._library_paths import inside, world_writable_problem
from opforge.errors import ManifestError, RegistrationError, shown
from opforge.mindspore.op import AotKernel, AotOp
from opforge.mindspore.cann import vendor_folders  # noqa: I001 - apart, for merges

__all__ = ["SEARCH_PATH_ENV", "MINDSPORE_SEARCH_PATH_ENV", "PACKAGE_FORMAT", "search_path",
           "packages", "find_op", "read_package", "write_package", "load_package",
           "register_vendor_ops", "default_install_path"]

SEARCH_PATH_ENV = "OPFORGE_CUSTOM_OPP_PATH"
MINDSPORE_SEARCH_PATH_ENV = "ASCEND_CUSTOM_OPP_PATH"
PACKAGE_FORMAT = 1
OP_INFO = "op_info.json"


def default_install_path() -> Path:
    """Where ``opforge msop build -i`` installs without ``--install_path``:
    ``$XDG_DATA_HOME/opforge/opp`` (default ``~/.local/share/opforge/opp``)."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "opforge" / "opp"


def search_path() -> list[Path]:
    """The search-path entries, earliest (winning) first."""
    entries: list[Path] = []
    for variable in (SEARCH_PATH_ENV, MINDSPORE_SEARCH_PATH_ENV):
        entries += [Path(p) for p in os.environ.get(variable, "").split(":") if p]
    entries.append(default_install_path())
    return entries


def packages() -> list[Path]:
    """Every vendor package folder on the search path, in precedence order. An entry
    that others can write (see ``read_package``) is a ``ManifestError``."""
    found: list[Path] = []
    for entry in search_path():
        for folder in (entry, entry / "vendors"):
            if folder.is_dir():
                _refuse_world_writable(folder, folder, f"search-path entry {entry}")
        if (entry / OP_INFO).is_file():
            candidates = [entry]
        else:  # a folder of vendors/ (in CANN's load_priority order), or an Ascend-only one
            candidates = vendor_folders(entry)
        found += [c.resolve() for c in candidates if c.resolve() not in found]
    return found


def read_package(folder: str | os.PathLike) -> list[AotOp]:
    """The ops of the vendor package in ``folder`` (``ManifestError`` if malformed).

    A package is code found by location, so it is refused (``ManifestError``) when its
    libraries are not inside ``folder`` (``op_info.json`` naming ``../../x.so`` or an
    absolute path, or a symlink leading out), and when ``folder``, a folder between it and a
    library, ``op_info.json`` or a library is world-writable, or a folder above is
    world-writable without the sticky bit: anyone could have put their code there
    (``opforge._library_paths`` says why refusing, not warning).
    """
    folder = Path(folder).resolve()
    path = folder / OP_INFO
    api = f"opforge.mindspore.read_package({str(folder)!r})"
    _refuse_world_writable(path, folder, f"`{api}`: {OP_INFO}")
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ManifestError(f"`{api}`: {path} — cannot be read as JSON ({e}) — valid: the "
                            f"{OP_INFO} that `opforge msop build` writes — fix: rebuild the "
                            "package") from None
    if not isinstance(data, dict) or data.get("format") != PACKAGE_FORMAT:
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise ManifestError(f"`{api}`: {path} — format {found!r} — valid: {PACKAGE_FORMAT} — "
                            "fix: rebuild the package with this opforge (`opforge msop build`)")
    try:
        ops = [AotOp.from_json(op, base=str(folder)) for op in data["ops"]]
    except (KeyError, TypeError) as e:
        raise ManifestError(f"`{api}`: {path} — an op entry lacks {e} — fix: rebuild the "
                            "package") from None
    for op in ops:
        if op.library and not inside(op.library, folder):
            raise ManifestError(
                f"`{api}`: {path} — op {shown(op.name)} names the library "
                f"{shown(op.library)}, which resolves to {shown(os.path.realpath(op.library))}, "
                f"outside the package — valid: a library inside {folder} (lib/, as `opforge "
                "msop build` writes it) — fix: rebuild the package, or copy the library into "
                "its lib/ folder and name it relative to the package")
        if op.library:
            _refuse_world_writable(op.library, folder, f"`{api}`: op {shown(op.name)}'s library")
    return ops


def _refuse_world_writable(path, root, what: str) -> None:
    problem = world_writable_problem(path, root)
    if problem:
        raise ManifestError(
            f"{what} — {problem}: anyone on this machine could put code there, and a vendor "
            "package's libraries run in this process — valid: folders and files only their "
            "owners can write — fix: chmod o-w it, or install the package into a folder of "
            "your own (`opforge msop build -i --install_path DIR`)")


def find_op(name: str) -> tuple[AotOp, Path] | None:
    """The first op called ``name`` on the search path, and its package folder."""
    for folder in packages():
        for op in read_package(folder):
            if op.name == name:
                return op, folder
    return None


def write_package(ops: Sequence[AotOp], folder: str | os.PathLike, *,
                  vendor_name: str = "customize") -> Path:
    """Write ``ops`` as a vendor package into ``folder`` (their libraries copied into
    ``lib/``); returns the folder. Python inference must be importable functions."""
    folder = Path(folder).resolve()
    (folder / "lib").mkdir(parents=True, exist_ok=True)
    entries = []
    copied: dict[str, Path] = {}
    for op in ops:
        if op.library:
            if op.library not in copied:
                target = folder / "lib" / os.path.basename(op.library)
                if target in copied.values():  # two libraries of one name: keep both
                    target = target.with_name(f"{len(copied)}_{target.name}")
                if Path(op.library).resolve() != target:
                    shutil.copy2(op.library, target)
                copied[op.library] = target
            op = AotOp(**{**_fields(op), "library": str(copied[op.library])})
        entries.append(op.to_json(base=str(folder)))
    include = folder / "include"
    include.mkdir(exist_ok=True)
    from opforge.mindspore.compile import include_dir

    shutil.copy2(include_dir() / "custom_aot_extra.h", include / "custom_aot_extra.h")
    text = json.dumps({"format": PACKAGE_FORMAT, "vendor": vendor_name, "ops": entries}, indent=2)
    tmp = folder / f".{OP_INFO}.tmp"
    tmp.write_text(text + "\n")
    os.replace(tmp, folder / OP_INFO)
    return folder


def _fields(op: AotOp) -> dict:
    return {name: getattr(op, name) for name in ("name", "inputs", "outputs", "func_type",
            "library", "symbol", "pyfunc", "dtype_rows", "out_shape", "out_dtype", "attrs",
            "source")}


def load_package(folder: str | os.PathLike, registry, *, skip: Iterable[str] = ()) -> list[str]:
    """Register every op of the package in ``folder`` into ``registry``; their keys."""
    keys = []
    skipped = set(skip)
    for op in read_package(folder):
        if op.key in skipped:
            continue
        served = registry.kernels(op.key)
        if served:
            first = served[0]
            raise RegistrationError(
                f"`opforge.mindspore.load_package({str(folder)!r})`: {op.key} — already "
                f"registered by {first.origin} — valid: one package per op — fix: remove one "
                "of the two from the search path")
        registry.register(op.key, AotKernel(op), origin=f"{folder} ({op.library or op.pyfunc})",
                          target="native")
        keys.append(op.key)
    return keys


def register_vendor_ops(registry) -> list[str]:
    """The lean runtime's registrar: every op of every package on the search path (the
    earliest package wins for an op found twice). Pass it as a kernels spec:
    ``kernels=["opforge.mindspore:register_vendor_ops"]``."""
    keys: list[str] = []
    for folder in packages():
        keys += load_package(folder, registry, skip=keys)
    return keys
