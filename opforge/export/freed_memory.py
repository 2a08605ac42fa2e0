"""Giving memory back between the stages of a large export.

A delegate's lowering makes and drops copies of its weights (transposed, dequantized,
packed), one or more per weight. Two things keep the dropped ones resident after the
lowering is done, so that the next method's delegate adds its own copies on top:

- reference cycles (frames of caught exceptions, graph modules and their nodes) that hold
  tensors until the cyclic garbage collector runs;
- glibc's allocator, which serves blocks under its dynamic mmap threshold (up to 32 MB,
  raised by every large block freed: a 768 x 2048 float32 weight is 6 MB) from its heap
  and keeps them there when they are freed.

``release`` runs the collector and asks glibc (where it is the C library) to return its
free pages (``malloc_trim``). Export calls it after a delegate whose constants are large
(``LARGE_BYTES``): on the 125M decoder with int4 weights it lowers the next delegate's
peak by ~0.5 GB; on small models it is not called (a collection costs ~0.1 s).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import sys

__all__ = ["LARGE_BYTES", "release", "trim"]

LARGE_BYTES = 64 << 20
_trim = None


def release() -> None:
    """Collect cyclic garbage, then return the C heap's free pages to the system."""
    gc.collect()
    trim()


def trim() -> None:
    """Return the C heap's free pages to the system (no collection: a few milliseconds).
    The cpu lowering calls it as it drops a weight's folded float copy: freed blocks of
    a few MB stay in glibc's heap, and the next weight's copies are made beside them
    rather than in them (a delegate of four 32 MB weights grew by 8 of them)."""
    global _trim
    if _trim is None:
        _trim = _malloc_trim()
    if _trim:
        _trim(0)


def _malloc_trim():
    """glibc's ``malloc_trim``, or False (another C library, another system)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim
