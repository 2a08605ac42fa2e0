"""The kernel registry: one table from ``"ns::op.overload"`` to the callable that runs it.

# Design
#
# A registry holds ``Kernel`` records. Each is keyed by the out overload's registry key
# (``"aten::add.out"``, ``"my_ops::mul3.out"``) and a *dtype key*: ``"default"`` for a kernel
# that serves every dtype, or a ScalarType name in lower case (``"float32"``, ``"int64"``) for
# one specialised to the dtype of the instruction's first tensor argument.
#
# Precedence (what ``lookup`` returns), highest first:
#
#   1. an overriding kernel (``override=True``) for the exact dtype key,
#   2. an overriding kernel for ``"default"``,
#   3. a base kernel for the exact dtype key,
#   4. a base kernel for ``"default"``,
#   5. the registry's fallback (ATen mode: PyTorch's own kernel for an op torch knows and
#      the ATen-mode allow-list admits, ``opforge.kernels.aten_allowlist``).
#
# Overriding kernels are how a native library replaces a built-in: a user's compiled
# ``aten::add.out`` registered with ``override=True`` wins over the portable one without
# anyone unregistering anything. Within one level a key+dtype key has exactly one kernel:
# a second registration is a ``RegistrationError`` naming both origins, so two
# libraries that both override the same op is an error, not a silent last-one-wins.
#
# Registration is explicit: nothing registers at import time. ``KernelRegistry.portable()``
# and ``KernelRegistry.aten()`` build fresh registries; callers add to them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Mapping

from opforge.errors import KernelError, RegistrationError

__all__ = ["Kernel", "KernelRegistry", "DEFAULT_DTYPE", "check_key", "registry_from"]

DEFAULT_DTYPE = "default"

_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*::[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)?\Z")
_DTYPE_KEY = re.compile(r"[a-z][a-z0-9_]*\Z")


def check_key(key: object, api: str) -> None:
    """Raise ``RegistrationError`` unless ``key`` reads ``"ns::op.overload"``."""
    if type(key) is not str or not _KEY.match(key):
        raise RegistrationError(
            f"`{api}`: key {key!r} — not a registry key — valid: 'namespace::op.overload', "
            "e.g. 'aten::add.out' or 'my_ops::mul3.out' — fix: spell the out overload's full name"
        )


@dataclass(frozen=True, slots=True)
class Kernel:
    """A callable bound to one operator overload, a target and a dtype key.

    ``fn`` follows the portable calling convention (``opforge.kernels.portable``): called
    positionally with the out overload's arguments in schema order, outs included, it
    writes into the out arrays and returns None. ``origin`` says where it came from (a
    module path, a library file) for error messages; ``target`` is ``"portable"``,
    ``"aten"``, ``"native"`` or a backend name.

    ``fn`` may carry a ``bind(args) -> (callable, args)`` attribute: the executor then calls
    it once per instruction at load and runs what it returns (ATen mode converts the NumPy
    views to tensors there, once, instead of on every call).

    >>> Kernel("my_ops::mul3.out", print, origin="doc", target="portable").dtype_key
    'default'
    """

    key: str
    fn: Callable[..., None]
    origin: str
    target: str
    dtype_key: str = DEFAULT_DTYPE
    override: bool = False

    def __post_init__(self) -> None:
        check_key(self.key, "Kernel")
        if not callable(self.fn):
            raise RegistrationError(
                f"`Kernel({self.key!r})`: fn — found {type(self.fn).__name__} — "
                "valid: a callable — fix: pass the kernel function itself"
            )
        if type(self.dtype_key) is not str or not _DTYPE_KEY.match(self.dtype_key):
            raise RegistrationError(
                f"`Kernel({self.key!r})`: dtype_key {self.dtype_key!r} — valid: 'default' or a "
                "lower-case ScalarType name such as 'float32' — "
                "fix: use ScalarType.X.name.lower()"
            )


class KernelRegistry:
    """Kernels keyed ``"ns::op.overload"`` (and a dtype key), with override precedence.

    >>> import numpy as np
    >>> registry = KernelRegistry()
    >>> def mul3(input, output): np.multiply(input, 3, out=output)
    >>> registry.register("my_ops::mul3.out", mul3, origin="doc", target="portable")
    >>> "my_ops::mul3.out" in registry, registry.lookup("my_ops::mul3.out").origin
    (True, 'doc')
    >>> registry.register("my_ops::mul3.out", mul3, origin="lib.so", target="native",
    ...                   override=True)
    >>> registry.lookup("my_ops::mul3.out", "float32").origin
    'lib.so'
    """

    def __init__(self, *, name: str = "custom",
                 fallback: Callable[[str], Kernel | None] | None = None) -> None:
        self.name = name
        self._fallback = fallback
        # (key, dtype_key, override) -> Kernel
        self._kernels: dict[tuple[str, str, bool], Kernel] = {}
        self._keys: dict[str, None] = {}  # insertion-ordered set of keys

    # --- constructors -------------------------------------------------------------------

    @classmethod
    def portable(cls) -> KernelRegistry:
        """A fresh registry holding every portable NumPy kernel (lean mode; no torch)."""
        from opforge.kernels.portable import portable_kernels

        registry = cls(name="portable")
        for key, fn in portable_kernels().items():
            registry.register(key, fn, origin=f"{fn.__module__}.{fn.__qualname__}",
                              target="portable")
        return registry

    @classmethod
    def aten(cls, *, allow_ops: Iterable[str] = ()) -> KernelRegistry:
        """A fresh ATen-mode registry: ops on the allow-list run on PyTorch's own kernel.

        The allow-list (``opforge.kernels.aten_allowlist``) admits core ATen out variants,
        what opforge's export emits, custom ops registered through ``opforge.torch_bridge``
        and ``allow_ops`` (see ``allow_ops``); never a deny-listed op (files, processes,
        network). Imports torch (only here and when a kernel is first resolved). Kernels
        registered into it explicitly (e.g. native overrides) still take precedence.
        """
        try:
            import torch  # noqa: F401  (fail here, clearly, rather than at the first op)
        except ImportError as e:
            raise KernelError(
                f"`KernelRegistry.aten()`: ATen mode — torch is not importable ({e}) — valid: "
                "ATen mode needs PyTorch; lean mode needs only NumPy — fix: 1. use --mode lean "
                "/ mode='lean'; 2. or install torch (pip install 'opforge[torch]')"
            ) from e
        from opforge.kernels.aten_allowlist import AtenOps

        return cls(name="aten", fallback=AtenOps(allow_ops))

    # --- registration -------------------------------------------------------------------

    def register(self, key: str, fn: Callable[..., None], *, origin: str | None = None,
                 target: str | None = None, dtype_key: str = DEFAULT_DTYPE,
                 override: bool = False) -> None:
        """Add one kernel; ``RegistrationError`` naming both origins on a duplicate.

        ``origin`` (where the kernel comes from, for messages) and ``target`` (``"portable"``
        for a NumPy kernel, ``"native"``, ``"aten"`` or a backend name) are required.
        """
        if origin is None or target is None:
            missing = " and ".join(n for n, v in (("origin", origin), ("target", target))
                                   if v is None)
            raise RegistrationError(
                f"`KernelRegistry.register({key!r}, ...)`: {missing} — not given — valid: "
                "origin= where the kernel comes from (a module or library, shown in errors), "
                "target= 'portable' (a NumPy kernel), 'native', 'aten' or a backend name — "
                f"fix: e.g. registry.register({key!r}, fn, origin=__name__, target='portable')"
            )
        self.add(Kernel(key, fn, origin, target, dtype_key, bool(override)))

    def add(self, kernel: Kernel) -> None:
        """Add a ``Kernel`` record (``register`` without building it)."""
        slot = (kernel.key, kernel.dtype_key, kernel.override)
        first = self._kernels.get(slot)
        if first is not None:
            level = "overriding kernel" if kernel.override else "kernel"
            fix = ("load only one of the two libraries, or drop the op from one of them"
                   if kernel.override else
                   "register the new one with override=True to replace the first, or "
                   "remove one of the two")
            raise RegistrationError(
                f"`KernelRegistry.register({kernel.key!r}, dtype_key={kernel.dtype_key!r})`: "
                f"{kernel.origin} ({kernel.target}) — {kernel.key} already has a {level}, "
                f"registered by {first.origin} ({first.target}) — valid: one {level} per key "
                f"and dtype key — fix: {fix}"
            )
        self._kernels[slot] = kernel
        self._keys[kernel.key] = None

    def register_all(self, kernels: Mapping[str, Callable[..., None]], *, origin: str,
                     target: str, override: bool = False) -> None:
        """Register every ``key -> fn`` of ``kernels`` (dtype key ``"default"``)."""
        for key, fn in kernels.items():
            self.register(key, fn, origin=origin, target=target, override=override)

    def allow_ops(self, keys: Iterable[str]) -> None:
        """Let the fallback run each of ``keys`` (ATen mode: your own torch ops, an exact
        ``"ns::op.overload"`` or ``"ns::op"`` for every overload). A deny-listed key is a
        ``RegistrationError``; so is a registry without an allow-list (lean mode runs only
        the kernels registered into it: register one instead)."""
        allow = getattr(self._fallback, "allow", None)
        if allow is None:
            raise RegistrationError(
                f"`KernelRegistry.allow_ops()`: registry {self.name!r} — has no fallback with an "
                "allow-list — valid: an ATen-mode registry (KernelRegistry.aten()) — fix: "
                "register a kernel for the op with registry.register(...) instead")
        allow(keys, api=f"KernelRegistry({self.name!r}).allow_ops()")

    def refusal(self, key: str) -> str | None:
        """Why the fallback refuses to serve ``key`` (an ATen-mode registry refuses ops off
        its allow-list), or None."""
        refusal = getattr(self._fallback, "refusal", None)
        return None if refusal is None else refusal(key)

    # --- queries ------------------------------------------------------------------------

    def lookup(self, key: str, dtype_key: str | None = None) -> Kernel | None:
        """The kernel that runs ``key`` for ``dtype_key`` (see the precedence above)."""
        table = self._kernels
        for override in (True, False):
            if dtype_key is not None and dtype_key != DEFAULT_DTYPE:
                kernel = table.get((key, dtype_key, override))
                if kernel is not None:
                    return kernel
            kernel = table.get((key, DEFAULT_DTYPE, override))
            if kernel is not None:
                return kernel
        if self._fallback is not None:
            return self._fallback(key)
        return None

    def kernels(self, key: str) -> list[Kernel]:
        """Every kernel registered for ``key`` (all dtype keys and levels), in order."""
        return [k for (k_key, _, _), k in self._kernels.items() if k_key == key]

    def __contains__(self, key: object) -> bool:
        if type(key) is not str:
            return False
        return key in self._keys or (self._fallback is not None
                                     and _KEY.match(key) is not None
                                     and self._fallback(key) is not None)

    def keys(self) -> list[str]:
        """The explicitly registered keys (not those a fallback such as ATen would serve)."""
        return list(self._keys)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._keys))

    def __len__(self) -> int:
        return len(self._keys)

    def __repr__(self) -> str:
        extra = ", with fallback" if self._fallback is not None else ""
        return f"KernelRegistry({self.name!r}, {len(self._keys)} keys{extra})"


def registry_from(kernels: Iterable[Kernel], *, name: str = "custom") -> KernelRegistry:
    """A registry holding ``kernels`` (a convenience for tests and tools)."""
    registry = KernelRegistry(name=name)
    for kernel in kernels:
        registry.add(kernel)
    return registry
