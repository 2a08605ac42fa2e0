"""The opforge error hierarchy.

Every error a *user* can cause derives from :class:`OpforgeError`. Internal bugs are
different: they raise :class:`InternalError` (or a plain Python exception) and are never
caught by the CLI's friendly error printer.

Messages follow one shape::

    `api(...)`: subject — what was found — what is valid — how to fix

with numbered fixes when there are several. A user's value goes into a message through
:func:`shown`, never ``{value!r}``: the value may be megabytes long (a long string, a list
grown from YAML aliases), and the message must stay readable and cheap to build.
"""

from __future__ import annotations

__all__ = [
    "OpforgeError",
    "SchemaError",
    "ManifestError",
    "RegistrationError",
    "BuildError",
    "ExportError",
    "ProgramError",
    "KernelError",
    "MissingKernelError",
    "ConcurrentCallError",
    "GenerationError",
    "InternalError",
    "shown",
]

SHOWN_LIMIT = 200  # characters of a user's value that an error message quotes


class OpforgeError(Exception):
    """Base class of every error a user of opforge can cause."""


class SchemaError(OpforgeError, ValueError):
    """A function-schema string is malformed, or an operation on a schema is impossible."""


class ManifestError(OpforgeError, ValueError):
    """An operator manifest (YAML or Python definition) is invalid."""


class RegistrationError(OpforgeError):
    """An operator could not be registered (e.g. it was registered twice)."""


class BuildError(OpforgeError):
    """A native kernel library could not be generated, compiled or linked."""


class ExportError(OpforgeError):
    """A model could not be exported to a program."""


class ProgramError(OpforgeError, ValueError):
    """A program file is malformed, truncated, hostile or of an unsupported version."""


class KernelError(OpforgeError, RuntimeError):
    """A kernel failed while executing (or could not be bound to its arguments)."""


class MissingKernelError(KernelError):
    """One or more operators of a program have no kernel in the chosen registry."""


class ConcurrentCallError(OpforgeError, RuntimeError):
    """One method instance was entered by a second thread while a call was running."""


class GenerationError(OpforgeError, ValueError):
    """Text generation cannot run as asked: a prompt or option is invalid, or the program
    is not a decoder the generation runner can drive (``opforge.runtime.generate``)."""


class InternalError(Exception):
    """A bug in opforge itself (not derived from OpforgeError on purpose)."""


def shown(value: object, limit: int = SHOWN_LIMIT) -> str:
    """``repr(value)`` for an error message, cut to ``limit`` characters with "…".

    Only the shown part is ever formatted, so a huge or deeply nested (even recursive)
    value costs no more than ``limit`` characters of work.

    >>> shown(["Float"] * 1000, limit=30)
    "['Float', 'Float', 'Float', '…"
    """
    parts: list[str] = []
    room = limit + 1  # one character more than shown tells whether to cut

    def emit(text: str) -> None:
        nonlocal room
        parts.append(text[:room])
        room -= len(parts[-1])

    def walk(v: object, depth: int) -> None:
        if room <= 0:
            return
        if depth > 16:
            emit("…")
        elif isinstance(v, dict):
            emit("{")
            for i, (k, item) in enumerate(v.items()):
                if room <= 0:
                    return
                emit(", " if i else "")
                walk(k, depth + 1)
                emit(": ")
                walk(item, depth + 1)
            emit("}")
        elif isinstance(v, (list, tuple)):
            emit("[" if isinstance(v, list) else "(")
            for i, item in enumerate(v):
                if room <= 0:
                    return
                emit(", " if i else "")
                walk(item, depth + 1)
            emit("]" if isinstance(v, list) else ("," if len(v) == 1 else "") + ")")
        elif isinstance(v, str):
            emit(repr(v[:room]))
        elif isinstance(v, int) and not isinstance(v, bool) and v.bit_length() > 1000:
            # repr would cost quadratic time (and Python refuses past 4300 digits)
            emit(f"<an integer of {v.bit_length()} bits>")
        else:
            emit(repr(v))

    walk(value, 0)
    text = "".join(parts)
    return text if len(text) <= limit else text[: limit - 1] + "…"


class BackendError(OpforgeError):
    """A backend is unknown or unusable here, a compile spec is wrong, or a delegate blob
    is refused (by its backend's parser, at load)."""
