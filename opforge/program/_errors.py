"""Builds :class:`ProgramError` messages in opforge's one shape.

``subject — what was found — what is valid — how to fix``; the public entry points
(``load``, ``from_bytes``, ``verify``, ``to_bytes``) prefix the API that was called, so the
same check reads well whether it fired while loading a file or while exporting.
"""

from __future__ import annotations

from opforge.errors import ProgramError


def program_error(subject: str, found: str, valid: str, fix: str | None = None) -> ProgramError:
    """Return (not raise) a ProgramError reading ``subject — found — valid — fix``."""
    parts = [subject, f"found {found}", f"valid: {valid}"]
    if fix:
        parts.append(f"fix: {fix}")
    return ProgramError(" — ".join(parts))


def with_api(api: str, err: ProgramError) -> ProgramError:
    """Prefix ``err`` with the public API call that surfaced it (only once)."""
    message = str(err)
    if message.startswith("`"):
        return err
    return ProgramError(f"`{api}`: {message}")
