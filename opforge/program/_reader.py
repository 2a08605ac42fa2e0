"""A bounds-checked little-endian reader over the metadata section.

Every read checks the remaining length first, and every count is checked against the bytes
that remain *before* anything is allocated for it: a hostile length of 2**32-1 elements is
refused in O(1) (each element takes at least one byte), so decoding never allocates more
than the file's own size and never loops longer than its length.

Errors carry the file offset; the decoder adds which field it was reading (only on the
error path, so the hot loops format no strings).
"""

from __future__ import annotations

import functools
import struct

from opforge.program._errors import program_error

U32 = struct.Struct("<I")
I64 = struct.Struct("<q")
F64 = struct.Struct("<d")


@functools.lru_cache(maxsize=512)
def array_struct(fmt: str) -> struct.Struct:
    """A cached ``struct.Struct("<" + fmt)``."""
    return struct.Struct("<" + fmt)


class Reader:
    """Reads fields from ``view`` (a byte memoryview); ``base`` is its offset in the file."""

    __slots__ = ("view", "pos", "end", "base")

    def __init__(self, view: memoryview, base: int) -> None:
        self.view = view
        self.pos = 0
        self.end = len(view)
        self.base = base

    def _short(self, n: int) -> Exception:
        return program_error(
            f"metadata at file offset {self.base + self.pos}",
            f"{n} bytes needed but only {self.end - self.pos} left in the metadata section",
            "a complete metadata section", "the file is truncated or corrupt; re-export it")

    def unpack(self, st: struct.Struct) -> tuple:
        """The fields of ``st`` at the current position."""
        pos = self.pos
        if st.size > self.end - pos:
            raise self._short(st.size)
        self.pos = pos + st.size
        return st.unpack_from(self.view, pos)

    def u8(self) -> int:
        pos = self.pos
        if pos >= self.end:
            raise self._short(1)
        self.pos = pos + 1
        return self.view[pos]

    def u32(self) -> int:
        return self.unpack(U32)[0]

    def i64(self) -> int:
        return self.unpack(I64)[0]

    def f64(self) -> float:
        return self.unpack(F64)[0]

    def count(self, min_item_bytes: int) -> int:
        """A u32 element count, refused if its elements cannot fit in the bytes left."""
        n = self.unpack(U32)[0]
        if n * min_item_bytes > self.end - self.pos:
            raise program_error(
                f"metadata at file offset {self.base + self.pos - 4}",
                f"count {n} (≥ {n * min_item_bytes} bytes) but only {self.end - self.pos} "
                "bytes left in the metadata section",
                "a count whose elements fit in the section", "the file is corrupt; re-export it")
        return n

    def array(self, code: str, n: int) -> tuple:
        """``n`` little-endian items of struct ``code`` ('B', 'I', 'q' or 'd')."""
        if n == 0:
            return ()
        return self.unpack(array_struct(f"{n}{code}") if n <= 64 else
                           struct.Struct(f"<{n}{code}"))

    def counted(self, code: str, item_bytes: int) -> tuple:
        """A u32 count, then that many items of struct ``code``."""
        return self.array(code, self.count(item_bytes))

    def raw(self) -> bytes:
        """A u32 length then that many bytes."""
        n = self.count(1)
        pos = self.pos
        self.pos = pos + n
        return bytes(self.view[pos:pos + n])

    def string(self) -> str:
        """A u32 length then that many bytes of UTF-8."""
        pos = self.pos
        data = self.raw()
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise program_error(
                f"metadata string at file offset {self.base + pos}",
                f"invalid UTF-8 ({e.reason} at byte {e.start})", "a UTF-8 string",
                "the file is corrupt; re-export it") from None

    def expect_end(self) -> None:
        if self.pos != self.end:
            raise program_error(
                f"metadata at file offset {self.base + self.pos}",
                f"{self.end - self.pos} unread bytes after the last table",
                "a metadata section that ends with its last table",
                "the file is corrupt or was written by a different opforge; re-export it")
