"""Named data: bytes stored once in a program for every delegate blob that refers to them.

A language model exported with a ``prefill`` and a ``decode`` method hands the same weights
to two delegates. Baked into each blob they are stored twice in the file and, at run time,
read and reordered twice. Instead (ExecuTorch's named data map does the same):

    ahead of time  preprocess → ``subgraph.named_data.add(bytes)`` → a key, written in
                   the blob instead of the bytes (``NamedDataStore``)
    export         each distinct key stored once: one segment each, the program's
                   ``named_data`` table (key → segment; format version 6)
    run time       ``context.named_data.get(key)`` → the bytes, a read-only view of the
                   program (a memory-mapped file: nothing copied), 64-byte aligned; one
                   view per key, so every delegate reading a key sees the same address
                   (what lets a backend share work per weight, e.g. reordered layouts)

Keys are content addresses (``sha256:`` and the bytes' hex digest): equal bytes get one key
whichever method, delegate or parameter name they came from, and a key never names two
different contents. A blob is untrusted: a key it names may be missing from the program,
which ``get`` answers with ``None`` for the backend to refuse.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

__all__ = ["NamedDataStore", "NamedDataMap", "SharedResources", "KEY_PREFIX", "aligned"]

KEY_PREFIX = "sha256:"


class NamedDataStore:
    """What one delegate's ``preprocess`` stored by name (export merges the stores)."""

    def __init__(self) -> None:
        self.entries: dict[str, bytes] = {}

    def add(self, data: bytes | bytearray | memoryview) -> str:
        """Store ``data`` (once per content) and return its key."""
        import hashlib  # export only: a loaded program never hashes (and never loads libcrypto)

        view = memoryview(data).cast("B")
        key = KEY_PREFIX + hashlib.sha256(view).hexdigest()
        if key not in self.entries:
            self.entries[key] = bytes(view)
        return key


class NamedDataMap:
    """The named data of one loaded program: key → a read-only, 64-byte-aligned view."""

    ALIGNMENT = 64

    def __init__(self, program: Any) -> None:
        self._segments = {n.key: program.segments[n.segment].data for n in program.named_data}
        self._views: dict[str, memoryview] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._segments)

    def get(self, key: str) -> memoryview | None:
        """The bytes named ``key``, or None when the program has no such key. A segment of
        a mapped file is aligned already; one that is not (a program built in memory) is
        copied once, so every caller gets the same aligned view."""
        with self._lock:
            view = self._views.get(key)
            if view is None:
                data = self._segments.get(key) if type(key) is str else None
                if data is None:
                    return None
                view = self._views[key] = aligned(data, self.ALIGNMENT)
            return view


def aligned(data: memoryview, alignment: int = 64) -> memoryview:
    """``data`` itself when it starts ``alignment``-aligned (a program file's mapped
    segment), else one aligned read-only copy (what a backend can read in place)."""
    import numpy as np

    raw = np.frombuffer(data, np.uint8)
    if raw.ctypes.data % alignment == 0:
        return data
    buffer = np.empty(raw.nbytes + alignment, np.uint8)
    start = -buffer.ctypes.data % alignment
    copy = buffer[start:start + raw.nbytes]
    copy[:] = raw
    copy.flags.writeable = False
    return memoryview(copy).cast("B")


class SharedResources:
    """Objects the delegates of one loaded program share (a backend's cache of reordered
    weights): made by the first ``get`` of a key, closed after every delegate handle of the
    program is destroyed, in the reverse order of their making."""

    def __init__(self) -> None:
        self._items: dict[str, Any] = {}
        self._closers: list[tuple[Callable[[Any], None], Any]] = []
        self._lock = threading.Lock()
        self.closed = False

    def get(self, key: str, make: Callable[[], Any],
            close: Callable[[Any], None] | None = None) -> Any:
        with self._lock:
            if self.closed:
                raise RuntimeError(f"shared resource {key!r} requested after the program's "
                                   "delegates were closed")
            if key not in self._items:
                item = make()
                self._items[key] = item
                if close is not None:
                    self._closers.append((close, item))
            return self._items[key]

    def close(self) -> None:
        with self._lock:
            closers, self._closers = self._closers, []
            self._items.clear()
            self.closed = True
        for close, item in reversed(closers):
            close(item)
