"""The delegation report a program carries in its user metadata (no torch needed to read it).

Export writes, per method, the delegates it made (backend, node count, ops, blob bytes,
input/output counts, delegate index) and a Rejection for every node a backend left out,
as JSON under ``opforge.delegation``.
"""

from __future__ import annotations

import json
from typing import Any

from opforge.errors import ProgramError

__all__ = ["METADATA_KEY", "delegation_report"]

METADATA_KEY = "opforge.delegation"


def delegation_report(program: Any) -> dict[str, Any]:
    """What delegation did, per method: ``{method: {"delegates": [...], "rejected": [...]}}``
    (read from the program's metadata; ``{}`` for a program exported without backends)."""
    raw = dict(program.user_metadata).get(METADATA_KEY)
    if not raw:
        return {}
    try:
        data = json.loads(raw)
    except ValueError as e:
        raise ProgramError(f"program metadata {METADATA_KEY!r} is not JSON ({e}) — fix: re-export "
                           "the program") from e
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise ProgramError(f"program metadata {METADATA_KEY!r} is not a per-method report — "
                           "fix: re-export the program")
    return data
