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

Keys are content addresses (``sha256:`` and the hex digest of the bytes, after their
layout when the backend gives one: ``float32[64,48]``): equal tensors get one key whichever
method, delegate or parameter name they came from, a key never names two different
contents, and equal bytes read as two dtypes or shapes get two keys. So every reader of one
key reads one tensor: export checks that the blobs agree on each key's layout
(``check_layouts``), and at load ``get(key, layout)`` refuses a reader whose layout differs
from the first one's (a file altered to share a key between two layouts; the bytes' size
alone matched before). A blob is untrusted: a key it names may be missing from the
program, which ``get`` answers with ``None`` for the backend to refuse.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

__all__ = ["NamedDataStore", "NamedDataPool", "NamedDataMap", "SharedResources", "KEY_PREFIX", "aligned", "layout",
           "check_layouts"]

KEY_PREFIX = "sha256:"


class NamedDataPool:
    """The named bytes of one export, shared by every delegate's store: a constant two
    delegates make (the same weight transposed for a prefill and for a decode method) is
    held once, from the moment the second one is made (``NamedDataStore.share``), not once
    per delegate until emission merges them. Holds views, not copies: the bytes must not
    change while the export lasts (a lowering's fresh constants, or the model's weights,
    which the program then shares as ``torch.export``'s state dict does)."""

    def __init__(self) -> None:
        self.data: dict[str, memoryview] = {}  # key → the bytes first stored under it
        self.known: dict[tuple[int, str | None], str] = {}  # (id(view in data), layout) → key


class NamedDataStore:
    """What one delegate's ``preprocess`` stored by name (export merges the stores)."""

    def __init__(self, pool: NamedDataPool | None = None) -> None:
        self.entries: dict[str, memoryview] = {}
        self.layouts: dict[str, str] = {}  # key → the layout it was stored with, if given
        self.pool = NamedDataPool() if pool is None else pool

    def add(self, data: bytes | bytearray | memoryview, layout: str | None = None) -> str:
        """Store ``data`` (once per content and ``layout``, e.g. ``layout("float32",
        (64, 48))``) and return its key. The store keeps a read-only view of ``data``
        (no copy): its bytes must not change afterwards."""
        key, view = self._pooled(data, layout)
        if key not in self.entries:
            self.entries[key] = view
            if layout is not None:
                self.layouts[key] = layout
        return key

    def share(self, data: bytes | bytearray | memoryview, layout: str | None = None) -> memoryview:
        """The pool's view of bytes equal to ``data`` (``data`` itself the first time): a
        backend that holds it instead of ``data`` lets a duplicate go at once. Nothing is
        stored for the program until ``add``; a later ``add`` of the returned view does
        not hash it again."""
        return self._pooled(data, layout)[1]

    def share_chunks(self, chunks, layout: str | None, make) -> memoryview:
        """``share`` of the bytes that ``chunks`` (bytes-like) join into, hashed chunk by
        chunk: ``make()`` builds them (contiguous) only when the pool has no equal bytes."""
        digest = self._digest(layout)
        for chunk in chunks:
            digest.update(chunk)
        key = KEY_PREFIX + digest.hexdigest()
        stored = self.pool.data.get(key)
        if stored is None:
            stored = self.pool.data[key] = memoryview(make()).cast("B").toreadonly()
            self.pool.known[(id(stored), layout)] = key
        return stored

    @staticmethod
    def _digest(layout: str | None):
        import hashlib  # export only: a loaded program never hashes (and never loads libcrypto)

        digest = hashlib.sha256()
        if layout is not None:
            digest.update(layout.encode() + b"\0")
        return digest

    def _pooled(self, data, layout: str | None) -> tuple[str, memoryview]:
        key = self.pool.known.get((id(data), layout))
        if key is not None:
            return key, self.pool.data[key]
        view = memoryview(data).cast("B").toreadonly()
        digest = self._digest(layout)
        digest.update(view)
        key = KEY_PREFIX + digest.hexdigest()
        stored = self.pool.data.setdefault(key, view)
        self.pool.known[(id(stored), layout)] = key
        return key, stored


def layout(dtype: str, shape) -> str:
    """How a tensor's bytes are read: ``float32[64,48]`` (a scalar: ``float32[]``)."""
    return f"{dtype}[{','.join(str(int(d)) for d in shape)}]"


def check_layouts(readers) -> None:
    """Export's check across every delegate's ``NamedDataStore.layouts`` (``(what,
    layouts)`` pairs): one layout per key, so that the delegates sharing a key read one
    tensor."""
    from opforge.errors import ExportError

    seen: dict[str, tuple[str, str]] = {}
    for what, layouts in readers:
        for key, found in layouts.items():
            first = seen.setdefault(key, (found, what))
            if first[0] != found:
                raise ExportError(
                    f"`opforge.export`: named data {key[:80]!r} — {what} stores it as {found}, "
                    f"{first[1]} as {first[0]} — valid: one dtype and shape per key — fix: this "
                    "is a backend bug (its preprocess must pass each tensor's layout to "
                    "NamedDataStore.add); report it with the model")


class NamedDataMap:
    """The named data of one loaded program: key → a read-only, 64-byte-aligned view."""

    ALIGNMENT = 64

    def __init__(self, program: Any) -> None:
        self._segments = {n.key: program.segments[n.segment].data for n in program.named_data}
        self._views: dict[str, memoryview] = {}
        self._layouts: dict[str, tuple[str, str]] = {}  # key → (layout, its first reader)
        self._lock = threading.Lock()
        self.reader = "a delegate"  # who reads through this map (``for_reader``)

    def __len__(self) -> int:
        return len(self._segments)

    def for_reader(self, reader: str) -> "NamedDataMap":
        """This map (the same views and layouts) as ``reader`` reads it: what its error
        messages call the delegate reading through it (e.g. ``delegates[1] ('cpu')``)."""
        import copy

        view = copy.copy(self)  # shares the tables and the lock
        view.reader = reader
        return view

    def get(self, key: str, layout: str | None = None, where: str = "") -> memoryview | None:
        """The bytes named ``key``, or None when the program has no such key. A segment of
        a mapped file is aligned already; one that is not (a program built in memory) is
        copied once, so every caller gets the same aligned view.

        ``layout`` (``layout(dtype, shape)``): how the caller reads them; a key read with
        another layout than its first reader's is refused with ``BackendError`` (``where``
        names the caller's tensor in the message)."""
        with self._lock:
            view = self._views.get(key)
            if view is None:
                data = self._segments.get(key) if type(key) is str else None
                if data is None:
                    return None
                view = self._views[key] = aligned(data, self.ALIGNMENT)
            if layout is not None:
                reader = f"{self.reader}{' ' + where if where else ''}"
                first = self._layouts.setdefault(key, (layout, reader))
                if first[0] != layout:
                    from opforge.errors import BackendError

                    raise BackendError(
                        f"named data {key[:80]!r} — {reader} reads it as {layout}, {first[1]} "
                        f"as {first[0]} — valid: one dtype and shape per key (export stores "
                        "a key per layout) — fix: re-export the program; this one was altered "
                        "or corrupted")
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
