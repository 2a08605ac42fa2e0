"""Reading operator definitions from what a user names: a manifest or a Python module.

Every verb that takes a MANIFEST (``opforge manifest``, ``build``, ``check``) accepts three
forms, and they all end as a list of :class:`OpDef`:

- a YAML manifest (``my_ops.yaml``), read by :func:`load_manifest`;
- a Python file (``path/to/ops.py``), executed as a module named after the file;
- an importable module (``pkg.ops``), imported with the ordinary module search path (the
  CLI puts the current directory first on it, see ``opforge.cli``).

From a Python module, the definitions are its module-level ``@opforge.op`` operators
(:class:`CustomOp`) and bare :class:`OpDef` values, in the order the module defines them.

>>> from opforge.manifest import load_definitions
>>> [d.name for d in load_definitions("my_ops.yaml")][:1]     # doctest: +SKIP
['my_ops::mul3']
>>> [d.name for d in load_definitions("my_py_ops.py")]        # doctest: +SKIP
['my_py_ops::twice']
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import sys
from pathlib import Path
from types import ModuleType

from opforge.errors import ManifestError
from opforge.manifest.model import OpDef
from opforge.manifest.python_api import CustomOp
from opforge.manifest.yaml_manifest import load_manifest

__all__ = ["load_definitions", "is_module_name"]

_MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*\Z")


def is_module_name(source: str) -> bool:
    """Whether ``source`` reads as a dotted module name rather than a file (``pkg.ops``).

    A name that ends in ``.yaml``/``.yml``/``.py`` or exists as a file is a file.
    """
    if os.path.exists(source) or source.endswith((".yaml", ".yml", ".py")):
        return False
    return bool(_MODULE_NAME.match(source))


def load_definitions(source: str | os.PathLike, *, api: str = "opforge manifest") -> list[OpDef]:
    """The :class:`OpDef` values of a manifest file, a ``.py`` file or a module name.

    ``api`` names the command or function in error messages (``"opforge build"``).
    """
    text = os.fspath(source)
    if text.endswith(".py"):
        module = _exec_file(Path(text), api)
    elif is_module_name(text):
        module = _import(text, api)
    else:
        return load_manifest(text, api=api)
    return _collect(module, text, api)


def _exec_file(path: Path, api: str) -> ModuleType:
    if not path.is_file():
        raise ManifestError(f"`{api}`: {path} — no such Python file — valid: a YAML manifest, a "
                            "path/to/ops.py file or an importable module name — fix: check the path")
    name = path.stem
    resolved = path.resolve()
    loaded = sys.modules.get(name)
    if loaded is not None and getattr(loaded, "__file__", None) and \
            Path(loaded.__file__).resolve() == resolved:
        return loaded  # already imported (e.g. by the factory of an export): one definition
    spec = importlib.util.spec_from_file_location(name, resolved)
    if spec is None or spec.loader is None:
        raise ManifestError(f"`{api}`: {path} — cannot be loaded as a Python module — fix: name "
                            "a .py file")
    module = importlib.util.module_from_spec(spec)
    # registered before it runs, so that references back to it ("ops:mul3_ref") resolve to
    # this module instead of executing the file a second time
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def _import(name: str, api: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name is None or not name.startswith(exc.name):
            raise  # the module itself imports something missing: its traceback helps
        raise ManifestError(
            f"`{api}`: {name!r} — no such file, and no module of that name can be imported "
            f"({exc}) — valid: a YAML manifest path, a path/to/ops.py file, or a module importable "
            "from the current directory or PYTHONPATH — fix: check the spelling, or run from the "
            "directory that holds the module") from None


def _collect(module: ModuleType, source: str, api: str) -> list[OpDef]:
    defs: list[OpDef] = []
    seen: set[str] = set()
    for value in list(vars(module).values()):
        opdef = value.opdef if isinstance(value, CustomOp) else value
        if isinstance(opdef, OpDef) and opdef.out_key not in seen:
            seen.add(opdef.out_key)
            defs.append(opdef)
    if not defs:
        raise ManifestError(
            f"`{api}`: {source} — the module defines no operator — valid: module-level "
            "`@opforge.op(\"ns::name(Tensor x) -> Tensor\")` functions or OpDef values — fix: "
            "define an op in it, or name the YAML manifest instead")
    return defs
