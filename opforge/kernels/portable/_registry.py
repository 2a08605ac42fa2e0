"""The per-module kernel table and its ``@kernel`` decorator.

Every op-family module owns one ``KERNELS`` dict, filled at import time by a decorator
bound to that dict and that module only. Nothing is registered into a global table, so
the set of kernels does not depend on which modules happened to be imported first;
``opforge.kernels.portable.portable_kernels()`` merges the family tables explicitly.
"""

from __future__ import annotations

import re
from typing import Callable

from opforge.errors import RegistrationError

__all__ = ["Kernel", "kernel_decorator", "check_registry_key", "binder_for"]

Kernel = Callable[..., None]

# "namespace::name.overload": the overload is always present for an out variant.
_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*::[A-Za-z_][A-Za-z0-9_]*\.[A-Za-z_][A-Za-z0-9_]*$")


def check_registry_key(key: str, where: str) -> None:
    """Raise ``RegistrationError`` unless ``key`` reads ``ns::op.overload``."""
    if not isinstance(key, str) or not _KEY.match(key):
        raise RegistrationError(
            f"`@kernel({key!r})`: {where} — the registry key is malformed — "
            "keys read 'namespace::op.overload', e.g. 'aten::add.out' — "
            "spell the out overload's full name"
        )


def _origin(fn: Kernel) -> str:
    return f"{fn.__module__}.{fn.__qualname__}"


def kernel_decorator(table: dict[str, Kernel]) -> Callable[..., Callable[[Kernel], Kernel]]:
    """Return a ``@kernel(key, ...)`` decorator that registers into ``table`` only.

    A kernel may serve several keys when their out schemas take the same arguments.
    Registering a key twice is an error that names where the first kernel came from.
    """

    def kernel(*keys: str) -> Callable[[Kernel], Kernel]:
        def register(fn: Kernel) -> Kernel:
            for key in keys:
                check_registry_key(key, _origin(fn))
                first = table.get(key)
                if first is not None:
                    raise RegistrationError(
                        f"`@kernel({key!r})`: {_origin(fn)} — {key} already has a kernel, "
                        f"{_origin(first)} — one portable kernel per out overload — "
                        "remove or rename one of the two definitions"
                    )
                table[key] = fn
            return fn

        return register

    return kernel


def binder_for(*kernels: Kernel) -> Callable[[Callable], Callable]:
    """Attach the decorated ``binder(args) -> (callable, args)`` as each kernel's ``bind``.

    The executor calls ``kernel.bind(args)`` once per instruction at load and then runs the
    pair it returns on every call (see ``_binding`` for the contract). The kernel itself is
    unchanged and stays callable on its own.
    """

    def attach(binder: Callable) -> Callable:
        for fn in kernels:
            fn.bind = binder
        return binder

    return attach
