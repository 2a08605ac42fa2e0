"""Program state at run time: one live, writable copy of each state tensor per loaded program.

# Design
#
# A state tensor's initial value is a constant of the program (read-only, memory-mapped).
# Its live copy is what every method of the loaded program reads and updates in place
# (``runtime/method.py`` puts it in each value table). Most state is a KV cache, and a
# cache is zeros at first: the exporter stores such a uniform initial value as a splat
# (``PACKING_SPLAT``, one element in the file), and a zero splat's live copy is an
# anonymous memory mapping, which the kernel hands out zero-filled page by page as it is
# first written. So the cache's *capacity* in resident memory follows the positions the
# calls have written, not its logical size: a cache exported for 32k positions that has
# seen 100 costs the pages of 100 positions (reads of untouched pages map the kernel's
# shared zero page, resident nowhere). Resetting such a state gives its pages back
# (``madvise(MADV_DONTNEED)``: the next touch sees zeros again) instead of writing zeros
# over all of them. Any other initial value is copied once, densely, as before.
#
# The logical bytes of all state count against the memory limit at load (``check``): a
# 100-byte file cannot ask for a terabyte of cache, and a cache that may fill up must fit.
# ``resident`` reports, per state tensor, the bytes actually in memory (Linux's pagemap;
# None where the system does not say).
"""

from __future__ import annotations

import mmap

import numpy as np

from opforge.errors import ProgramError
from opforge.program import PACKING_SPLAT, ConstantStorage, Program, constant_array
from opforge.runtime.limits import MAX_MEMORY_ENV, check_memory, human_bytes, max_memory

__all__ = ["LiveState", "initial_value", "state_bytes"]

_PAGE = mmap.PAGESIZE
_ANONYMOUS = hasattr(mmap, "MAP_ANONYMOUS") and hasattr(mmap, "MAP_PRIVATE")


def initial_value(program: Program, name: str) -> np.ndarray:
    """The initial value of state ``name`` (read-only, from the program's constants)."""
    for method in program.methods:
        for slot in method.state:
            if slot.name == name:
                return constant_array(program, method.values[slot.value])
    raise KeyError(name)


def state_bytes(program: Program) -> int:
    """The logical bytes of every state tensor of ``program`` (each name once)."""
    sizes: dict[str, int] = {}
    for method in program.methods:
        for slot in method.state:
            sizes.setdefault(slot.name, method.values[slot.value].nbytes)
    return sum(sizes.values())


class LiveState:
    """The live state tensors of one loaded program, by name (``arrays``)."""

    def __init__(self, api: str, program: Program, limit: int) -> None:
        check_memory(api, "the program's state tensors (one live copy per loaded program)",
                     state_bytes(program), limit=limit,
                     fix="1. check that the file is the program you exported (a corrupt or "
                         "hostile file asks for absurd state); 2. if the model really needs "
                         f"it, raise the limit: load(..., max_memory=N) or {MAX_MEMORY_ENV}=N")
        self._program, self._api, self._limit = program, api, max_memory(limit, api=api)
        self.arrays: dict[str, np.ndarray] = {}
        self._maps: dict[str, mmap.mmap] = {}  # zero-initialised state: lazily committed pages
        for method in program.methods:
            for slot in method.state:
                if slot.name not in self.arrays:
                    self.arrays[slot.name] = self._live(slot.name, method.values[slot.value])

    def _live(self, name: str, value) -> np.ndarray:
        try:
            return self._allocate(name, value)
        except (OSError, MemoryError) as exc:  # within the limit, beyond what the system gives
            raise ProgramError(
                f"`{self._api}`: state {name!r} — needs {value.nbytes} bytes ({human_bytes(value.nbytes)}) "
                f"and the system refused them ({type(exc).__name__}: {exc}) — valid: state that "
                f"fits this machine's memory (the memory limit, {self._limit} bytes, allows more "
                "than it has) — fix: 1. lower the limit to what the machine has "
                f"(load(..., max_memory=N) or {MAX_MEMORY_ENV}=N), so that such a file is refused "
                "plainly; 2. re-export the model with a smaller state (a shorter cache)") from None

    def _allocate(self, name: str, value) -> np.ndarray:
        initial = constant_array(self._program, value)
        storage = value.storage
        if type(storage) is ConstantStorage and storage.packing == PACKING_SPLAT and \
                value.nbytes >= _PAGE and _ANONYMOUS and not initial.reshape(-1)[:1].view(np.uint8).any():
            # private and anonymous: zero-filled, committed page by page on first write
            # (Python's default for -1 is MAP_SHARED, whose pages a read commits)
            pages = mmap.mmap(-1, value.nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            self._maps[name] = pages
            flat = np.frombuffer(pages, dtype=initial.dtype, count=initial.size)
            return flat.reshape(initial.shape)
        return np.array(initial)  # dense and writable, in the tensor's logical layout

    def reset(self, name: str) -> None:
        """Restore state ``name`` to its initial value."""
        pages = self._maps.get(name)
        if pages is not None and hasattr(pages, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
            pages.madvise(mmap.MADV_DONTNEED)  # private anonymous pages: zero on next touch
            return
        np.copyto(self.arrays[name], initial_value(self._program, name))

    def resident(self, name: str) -> int | None:
        """Bytes of state ``name`` in resident memory now (None where unknown)."""
        array = self.arrays[name]
        if name not in self._maps:
            return array.nbytes  # a dense copy: all of it was written at load
        return _resident_bytes(array.ctypes.data, array.nbytes)


def _resident_bytes(address: int, nbytes: int) -> int | None:
    """Bytes of ``[address, address + nbytes)`` in pages this process wrote (Linux's
    ``/proc/self/pagemap``: present and mapped only here; a page that was only read maps
    the shared zero page, which is present but not exclusive, and costs no memory)."""
    if nbytes == 0:
        return 0
    first, last = address // _PAGE, (address + nbytes - 1) // _PAGE
    try:
        with open("/proc/self/pagemap", "rb") as pagemap:
            pagemap.seek(first * 8)
            entries = np.frombuffer(pagemap.read((last - first + 1) * 8), np.uint64)
    except (OSError, ValueError):
        return None
    written = (entries >> np.uint64(63)) & (entries >> np.uint64(56)) & np.uint64(1)
    return min(nbytes, int(written.sum()) * _PAGE)
