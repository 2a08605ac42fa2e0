"""The lowering's refusal: a node the cpu backend does not take, and why."""

from __future__ import annotations

__all__ = ["Unsupported"]


class Unsupported(Exception):
    """A node the backend does not take: ``kind`` and a reason a user can act on."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason
