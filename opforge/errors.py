"""The opforge error hierarchy.

Every error a *user* can cause derives from :class:`OpforgeError`. Internal bugs are
different: they raise :class:`InternalError` (or a plain Python exception) and are never
caught by the CLI's friendly error printer.

Messages follow one shape (STYLE.md 8)::

    `api(...)`: subject — what was found — what is valid — how to fix

with numbered fixes when there are several.
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
    "InternalError",
]


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


class InternalError(Exception):
    """A bug in opforge itself (not derived from OpforgeError on purpose)."""
