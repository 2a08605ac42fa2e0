"""Kernel sets at export time: which operators a target can run, checked before writing.

A kernel set is anything that answers ``"ns::op.overload" in kernels`` — the portable
library's dict, the names a native library registers, or :class:`AtenKernels` (ATen mode:
PyTorch itself runs every ``aten`` op). Names resolve to sets: ``"portable"``, ``"aten"``.
A kernel set that can also be iterated (a dict of kernels) decides what decomposition
keeps: an op torch would decompose stays whole when the set has a kernel for its out
variant (``aten::linear.out`` keeps ``aten.linear``).
"""

from __future__ import annotations

import difflib
import os
import warnings
from collections.abc import Container, Iterable
from typing import Any, Sequence


from opforge.errors import ExportError, MissingKernelError
from opforge.export.out_variants import find_out_variant, is_out_schema, op_key

__all__ = [
    "AtenKernels", "UnionKernels", "ExportMissingKernelError", "resolve_kernels",
    "preserved_by_kernels", "check_kernels",
]


class ExportMissingKernelError(ExportError, MissingKernelError):
    """Operators of an exported program have no kernel in the chosen kernel set."""


class AtenKernels:
    """ATen mode: every ``aten::`` operator torch has runs on PyTorch's own kernel, and so
    do the quantize/dequantize out overloads of quantized programs."""

    name = "aten"

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, str):
            return False
        if not key.startswith("aten::"):
            from opforge.torch_bridge.library_ops import has_library_out

            return has_library_out(key)
        return True

    def __repr__(self) -> str:
        return "AtenKernels()"


class UnionKernels:
    """Several kernel sets; a key is covered when any of them has it."""

    def __init__(self, members: Sequence[Container], names: Sequence[str]) -> None:
        self.members = list(members)
        self.name = "+".join(names)

    def __contains__(self, key: object) -> bool:
        return any(key in member for member in self.members)

    def __iter__(self):
        for member in self.members:
            if isinstance(member, Iterable):
                yield from member


def _resolve_one(kernels: Any) -> tuple[str, Container]:
    if isinstance(kernels, str):
        if kernels == "portable":
            from opforge.kernels.portable import portable_kernels

            return "portable", portable_kernels()
        if kernels == "aten":
            return "aten", AtenKernels()
        if kernels.endswith((".so", ".dylib", ".dll")) or os.path.isfile(kernels):
            # A native library answers for the ops in its (ABI-checked) kernel table.
            from opforge.errors import OpforgeError
            from opforge.runtime.native import NativeLibrary

            if not os.path.isfile(kernels):
                raise ExportError(
                    f"`opforge.export.export(kernels={kernels!r})`: native kernel library — no such "
                    "file — fix: build it first (`opforge build MANIFEST --sources ... -o LIB.so`)"
                )
            try:
                keys = NativeLibrary(kernels).keys()
            except OpforgeError as exc:
                raise ExportError(f"`opforge.export.export(kernels={kernels!r})`: {exc}") from exc
            return os.path.basename(kernels), frozenset(keys)
        raise ExportError(
            f"`opforge.export.export(kernels={kernels!r})`: kernel set — unknown name — valid: 'portable', "
            "'aten', a path to a native library, or a container of 'ns::op.overload' keys — "
            "fix: e.g. kernels='portable'"
        )
    if not isinstance(kernels, Container):
        raise ExportError(
            f"`opforge.export.export(kernels=...)`: kernel set — found {type(kernels).__name__} — "
            "valid: anything answering `'aten::add.out' in kernels` (dict, set) or a name — "
            "fix: pass kernels='portable' or a set of operator keys"
        )
    return getattr(kernels, "name", type(kernels).__name__), kernels


def resolve_kernels(kernels: Any) -> tuple[str, Container] | None:
    """``(name, container)`` for ``export(kernels=...)``; None when no check was asked for.

    A list or tuple of kernel sets (names or containers) is their union.
    """
    if kernels is None:
        return None
    if isinstance(kernels, (list, tuple)):
        resolved = [_resolve_one(k) for k in kernels]
        if len(resolved) == 1:
            return resolved[0]
        return "+".join(n for n, _ in resolved), UnionKernels([c for _, c in resolved], [n for n, _ in resolved])
    return _resolve_one(kernels)


def preserved_by_kernels(kernels: Container | None, decomposable: Iterable[Any]) -> frozenset[str]:
    """Keys of the decomposable ops whose out variant the (iterable) kernel set covers."""
    if kernels is None or not isinstance(kernels, Iterable) or isinstance(kernels, AtenKernels):
        return frozenset()
    keys = {k for k in kernels if isinstance(k, str)}
    packets = {k.split("::", 1)[1].split(".", 1)[0] for k in keys if k.startswith("aten::")}
    kept = set()
    for op in decomposable:
        if op.namespace != "aten" or op._schema.name.split("::", 1)[1] not in packets:
            continue
        if is_out_schema(op._schema):
            continue
        variant = find_out_variant(op)
        if variant is not None and not variant.via_copy and op_key(variant.out) in keys:
            kept.add(op_key(op))
    return frozenset(kept)


def _hint(key: str, kernels: Container, name: str = "") -> str:
    namespace = key.split("::", 1)[0]
    hints = []
    if namespace != "aten":
        hints.append(f"declare `{key.split('.')[0]}` in an op manifest and build its kernels with "
                     "`opforge build MANIFEST.yaml`, then pass the library with --kernels LIB.so")
    elif "portable" not in name.split("+") and _has_portable_kernel(key):
        # a native library alone covers only its own ops; the lean runtime runs the rest on
        # its portable kernels, so the set to check against is both
        hints.append(f"the portable kernel set has it: add it beside {name!r} (--kernels "
                     "portable, or kernels=['portable', ...])")
    else:
        hints.append("run the program in ATen mode (--kernels aten), or add a portable kernel")
    if isinstance(kernels, Iterable):
        near = difflib.get_close_matches(key, [k for k in kernels if isinstance(k, str)], n=2, cutoff=0.75)
        if near:
            hints.append("near names in the kernel set: " + ", ".join(f"`{n}`" for n in near))
    return "; ".join(hints)


def _has_portable_kernel(key: str) -> bool:
    from opforge.kernels.portable import portable_kernels

    return key in portable_kernels()


def check_kernels(operators: dict[str, list[str]], name: str, kernels: Container, *, allow_missing: bool) -> list[str]:
    """Check every ``"ns::op.overload"`` key (mapped to the methods using it) against
    ``kernels``. Raises one error listing every missing op, or warns when
    ``allow_missing``; returns the missing keys."""
    missing = sorted(key for key in operators if key not in kernels)
    if not missing:
        return []
    lines = "\n".join(
        f"  {i}. `{key}` (method {', '.join(repr(m) for m in operators[key])}) — {_hint(key, kernels, name)}"
        for i, key in enumerate(missing, 1)
    )
    message = (
        f"`opforge.export.export(kernels={name!r})`: {len(missing)} operator(s) of the program have no "
        f"kernel in {name!r} — valid: every operator covered by the kernel set — fix each:\n{lines}\n"
        "  (or pass allow_missing=True / --allow-missing to write the program anyway)"
    )
    if allow_missing:
        warnings.warn(message, stacklevel=3)
        return missing
    raise ExportMissingKernelError(message)
