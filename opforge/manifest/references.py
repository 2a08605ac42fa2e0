"""Resolving ``module:function`` references of a manifest (``python:``, ``fake:``)."""

from __future__ import annotations

import importlib
from typing import Callable

from opforge.errors import ManifestError

__all__ = ["resolve_reference"]


def resolve_reference(ref: Callable | str | None, *, what: str, source: str) -> Callable | None:
    """Import ``"pkg.module:function"`` (or pass a callable through)."""
    if ref is None or callable(ref):
        return ref
    module_name, _, attr = ref.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ManifestError(f"`opforge`: {source}: the {what} '{ref}' cannot be imported ({exc}) — "
                            "make the module importable (installed, on PYTHONPATH, or, for "
                            "the opforge command, in the current directory)") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ManifestError(f"`opforge`: {source}: the {what} '{ref}' — module '{module_name}' has "
                            f"no function '{attr}' — check the name")
    return fn
