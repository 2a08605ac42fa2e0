"""Reading and writing the programs ``cpu_blob_mutate.py`` mutates: a seed decoded once
(``ParsedSeed``), a plan written back as blob bytes (``write_blob``, the layout of
``blob.encode``: header, JSON plan, padding, data, CRC-32 recomputed), and a program with one
delegate's blob and compile specs replaced (``program_with_blob``).
"""

from __future__ import annotations

import dataclasses
import json
import zlib

from opforge.backends.cpu import blob as B
from opforge.errors import OpforgeError
from opforge.program import DelegateBlob, Program, Segment, from_bytes, to_bytes
from opforge.program._sample import unverified_bytes


def write_blob(plan: dict, data: bytes, *, version: int | None = None, reserved: int = 0) -> bytes:
    """``plan`` and ``data`` as blob bytes, laid out as ``blob.encode`` writes them (the
    version it would choose unless one is given)."""
    if version is None:
        tensors = plan.get("tensors") if type(plan) is dict else None
        version = B.version_for(tensors if type(tensors) is list else [])
    text = json.dumps(plan, separators=(",", ":"), allow_nan=True).encode()
    head_len = B.HEADER.size + len(text)
    pad = bytes(B._align(head_len) - head_len)
    crc = zlib.crc32(text + bytes(data))
    return B.HEADER.pack(B.MAGIC, version, len(text), len(data), crc, reserved) + text + pad + \
        bytes(data)


@dataclasses.dataclass(frozen=True)
class ParsedSeed:
    """A seed program decoded once: the program and each delegate's parsed plan."""
    name: str
    program: Program
    plans: tuple[tuple[int, dict, bytes], ...]  # (delegate index, plan, data)

    @classmethod
    def of(cls, name: str, data: bytes) -> "ParsedSeed":
        program = from_bytes(data)
        plans = []
        for i, d in enumerate(program.delegates):
            if d.id == "cpu":
                plan, raw = B.parse(program.segments[d.segment].data)
                plans.append((i, plan, bytes(raw)))
        return cls(name, program, tuple(plans))


def program_with_blob(program: Program, index: int, blob_bytes: bytes,
                      specs: list[tuple[str, bytes]]) -> bytes:
    """``program``'s bytes with delegate ``index``'s blob and compile specs replaced (the
    file's header and CRC written afresh)."""
    delegate = program.delegates[index]
    segments = list(program.segments)
    segments[delegate.segment] = Segment(blob_bytes)
    delegates = list(program.delegates)
    delegates[index] = DelegateBlob(delegate.id, delegate.segment, tuple(specs))
    program = dataclasses.replace(program, segments=tuple(segments), delegates=tuple(delegates))
    try:
        return to_bytes(program)
    except OpforgeError:  # a compile spec the program verifier refuses: written unverified
        return unverified_bytes(program)
