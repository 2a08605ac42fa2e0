"""Memory limits: how much one method instance may allocate for a program's sake.

A program file is untrusted data, and its numbers decide allocations: arena sizes (the
verifier admits up to 2**48 bytes), and the workspaces the portable convolution and
pooling kernels size from padding, dilation and stride. Every such allocation is checked
against one limit *before* it is made, so a hostile or corrupt file gets a clear
``ProgramError`` / ``KernelError`` instead of a raw ``MemoryError`` or a machine that
swaps itself to death.

The limit, first found wins:

1. ``load(..., max_memory=N)`` — for the methods of that ``LoadedProgram`` (their arenas
   and the workspaces their kernels allocate when bound);
2. inside ``with memory_limit(N):`` — for whatever is allocated in the block;
3. the environment variable ``OPFORGE_MAX_MEMORY`` — bytes, or a number with a binary
   suffix: ``"512M"``, ``"16G"``, ``"16GiB"``, ``"1T"``;
4. ``DEFAULT_MAX_MEMORY``: 8 GiB.

>>> with memory_limit(1 << 20):
...     max_memory()
1048576
>>> parse_size("16GiB") == 16 << 30
True
"""

from __future__ import annotations

import os
import re
from contextvars import ContextVar

from opforge.errors import OpforgeError, ProgramError, shown

__all__ = [
    "DEFAULT_MAX_MEMORY", "MAX_MEMORY_ENV", "check_memory", "human_bytes", "max_memory",
    "memory_limit", "parse_size",
]

DEFAULT_MAX_MEMORY = 8 << 30
MAX_MEMORY_ENV = "OPFORGE_MAX_MEMORY"

_limit: ContextVar[int | None] = ContextVar("opforge_max_memory", default=None)
_SIZE = re.compile(r"\s*(\d+)\s*(?:([KMGT])(?:I?B)?|B)?\s*\Z", re.IGNORECASE)
_SHIFT = {None: 0, "K": 10, "M": 20, "G": 30, "T": 40}


def parse_size(text: str) -> int:
    """Bytes from ``"123"``, ``"512K"``, ``"16G"``, ``"16GiB"`` (binary suffixes);
    ``ValueError`` otherwise."""
    match = _SIZE.match(text)
    if match is None:
        raise ValueError(f"not a size: {text!r}")
    suffix = match.group(2)
    return int(match.group(1)) << _SHIFT[suffix.upper() if suffix else None]


def _checked(value: object, api: str, where: str) -> int:
    if type(value) is not int or value <= 0:
        raise ProgramError(
            f"`{api}`: {where} — found {shown(value)} — valid: a positive number of bytes "
            f"(default {DEFAULT_MAX_MEMORY} = 8 GiB) — fix: pass e.g. 16 << 30 for 16 GiB")
    return value


def max_memory(value: int | None = None, *, api: str = "opforge.runtime.max_memory()") -> int:
    """The limit in bytes: ``value`` if given, else the innermost ``memory_limit`` block,
    else ``OPFORGE_MAX_MEMORY``, else ``DEFAULT_MAX_MEMORY``."""
    if value is not None:
        return _checked(value, api, "max_memory")
    scoped = _limit.get()
    if scoped is not None:
        return scoped
    text = os.environ.get(MAX_MEMORY_ENV, "").strip()
    if not text:
        return DEFAULT_MAX_MEMORY
    try:
        size = parse_size(text)
    except ValueError:
        size = 0
    if size <= 0:
        raise ProgramError(
            f"`{api}`: environment variable {MAX_MEMORY_ENV} — found {shown(text)} — valid: "
            "a positive number of bytes, optionally with K, M, G or T (binary: 16G = 16 GiB) "
            f"— fix: export {MAX_MEMORY_ENV}=16G, or unset it for the 8 GiB default")
    return size


class memory_limit:  # noqa: N801 (used like a function: ``with memory_limit(N):``)
    """Within the block, allocations made for a program are limited to ``nbytes``.

    A class rather than a ``contextlib`` generator: a dynamic method enters one per new
    input shape, and this costs ~0.4 instead of ~2.8 us."""

    __slots__ = ("nbytes", "_token")

    def __init__(self, nbytes: int) -> None:
        self.nbytes = _checked(nbytes, "opforge.runtime.memory_limit()", "nbytes")

    def __enter__(self) -> int:
        self._token = _limit.set(self.nbytes)
        return self.nbytes

    def __exit__(self, *exc) -> None:
        _limit.reset(self._token)


def check_memory(api: str, subject: str, nbytes: int, *, limit: int | None = None,
                 error: type[OpforgeError] = ProgramError, fix: str = "") -> None:
    """Raise ``error`` unless ``nbytes`` (a Python int: never overflows) fits the limit."""
    limit = max_memory(limit, api=api)
    if nbytes > limit:
        raise error(
            f"`{api}`: {subject} — needs {nbytes} bytes ({human_bytes(nbytes)}) — valid: at most "
            f"the memory limit, {limit} bytes ({human_bytes(limit)}) — fix: "
            + (fix or "1. check that the program file is the one exported (a corrupt or hostile "
                      "file asks for absurd sizes); 2. if the model really needs it, raise the "
                      f"limit: load(..., max_memory=N) or {MAX_MEMORY_ENV}=N"))


def human_bytes(nbytes: int) -> str:
    """``"4.0 GiB"``: a byte count for a message."""
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift:
            return f"{nbytes / (1 << shift):.1f} {unit}"
    return f"{nbytes} B"
