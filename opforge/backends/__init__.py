"""Backends: delegation of subgraphs to compiled engines (see ``base.py`` for the contract).

Backends are found by name: the built-in ones below, ``register_backend`` for one defined
in a running process, and the ``opforge.backends`` entry-point group for packages::

    [project.entry-points."opforge.backends"]
    mybackend = "my_package.backend:MyBackend"

This module imports neither torch nor any backend until one is asked for by name.
"""

from __future__ import annotations

import importlib
import threading
from typing import Any

from opforge.backends.base import Backend, BackendContext, PartitionResult, Rejection
from opforge.backends.compile_specs import (
    SpecDef, decode_specs, encode_specs, parse_spec_args, resolve_specs,
)
from opforge.errors import BackendError, shown

__all__ = [
    "Backend", "BackendContext", "PartitionResult", "PreprocessRefused", "Rejection", "SpecDef",
    "get_backend",
    "backend_names", "register_backend", "resolve_specs", "encode_specs", "decode_specs",
    "parse_spec_args", "ENTRY_POINT_GROUP",
]

ENTRY_POINT_GROUP = "opforge.backends"
_BUILTIN = {"cpu": "opforge.backends.cpu:CpuBackend"}
_registered: dict[str, Backend] = {}
_lock = threading.Lock()


def _entry_points() -> dict[str, Any]:
    # Imported here: importlib.metadata brings email, zipfile and socket (~2 MB resident), and a
    # program that only names built-in backends never needs it.
    import importlib.metadata
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


def backend_names() -> list[str]:
    """Every backend name this process can find (built-in, registered, entry points)."""
    return sorted(set(_BUILTIN) | set(_registered) | set(_entry_points()))


def register_backend(backend: Backend | type[Backend], *, replace: bool = False) -> Backend:
    """Make ``backend`` (an instance or a class) findable by its ``name``.

    A second backend of the same name is an error unless ``replace=True``.
    """
    instance = backend() if isinstance(backend, type) else backend
    if not isinstance(instance, Backend):
        raise BackendError(f"register_backend({shown(backend)}): not an opforge.backends.Backend "
                           "— fix: subclass opforge.backends.Backend")
    name = getattr(instance, "name", None)
    if not isinstance(name, str) or not name.isidentifier():
        raise BackendError(f"register_backend: backend name {shown(name)} — valid: an identifier "
                           "— fix: set the class attribute `name`")
    with _lock:
        if name in _registered and not replace:
            raise BackendError(
                f"register_backend: backend {name!r} is already registered "
                f"({type(_registered[name]).__module__}) — fix: pick another name, or "
                "register_backend(..., replace=True)")
        _registered[name] = instance
    return instance


def _load(name: str, target: str, where: str) -> Backend:
    module, _, attr = target.partition(":")
    try:
        obj = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise BackendError(f"backend {name!r} ({where} {target!r}) cannot be imported: "
                           f"{type(e).__name__}: {e} — fix: reinstall the package that provides it") from e
    instance = obj() if isinstance(obj, type) else obj
    if not isinstance(instance, Backend) or getattr(instance, "name", None) != name:
        raise BackendError(f"backend {name!r} ({where} {target!r}) is not an opforge Backend "
                           f"named {name!r} — fix: the entry point must name a Backend subclass")
    return instance


def get_backend(name: str) -> Backend:
    """The backend called ``name``; ``BackendError`` listing the known ones if none is."""
    with _lock:
        if name in _registered:
            return _registered[name]
    if name in _BUILTIN:
        instance = _load(name, _BUILTIN[name], "built-in")
    else:
        eps = _entry_points()
        if name not in eps:
            raise BackendError(
                f"backend {shown(name)} — unknown — valid: {', '.join(backend_names())} — fix: "
                f"check the spelling, or install the package that adds it (entry-point group "
                f"{ENTRY_POINT_GROUP!r})")
        instance = _load(name, eps[name].value, f"entry point in {ENTRY_POINT_GROUP!r}")
    with _lock:
        return _registered.setdefault(name, instance)
