"""One thread setting for every pool a call can touch.

# Design
#
# A call of a method can start threads in four places: NumPy's BLAS (OpenBLAS keeps its
# own pool, sized to the machine, whatever the caller asked), OpenMP in native kernel
# libraries, torch's intra-op pool in ATen mode, and the cpu backend's engine (which sizes
# its own OpenMP regions from its compile spec). ``OPFORGE_NUM_THREADS`` — or
# ``load(..., num_threads=N)`` for one loaded program — is the one setting for all of
# them: unset means one thread, as on the cpu backend, so a service running several
# programs side by side never oversubscribes the machine unless asked to.
#
# BLAS and OpenMP pools are found with threadpoolctl (the library made for this: it knows
# every BLAS build's and OpenMP runtime's get/set functions) once, when a method instance
# is made, after every kernel library of the load is open. Around each call the governor
# reads each pool's size, sets the wanted one where it differs, and puts the old one back
# after the call; a pool already at the wanted size costs one read (~1 µs). Methods that
# cannot reach a pool (lean programs with only elementwise kernels, delegates whose backend
# sizes its own threads: ``Backend.own_threads``, the cpu engine without call-outs) get no
# governor and pay nothing.
"""

from __future__ import annotations

import os

from opforge.errors import ProgramError

__all__ = ["NUM_THREADS_ENV", "resolve_thread_count", "ThreadGovernor", "note_library_loaded"]

NUM_THREADS_ENV = "OPFORGE_NUM_THREADS"
AUTO_MAX = 4  # "auto": the usable cores, at most this many (see kernels/portable/_binding.py)


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def resolve_thread_count(value: int | None = None, *, api: str = "opforge.runtime.load") -> int:
    """The thread count a call may use: ``value`` when given, else ``OPFORGE_NUM_THREADS``
    (a count, or ``auto`` for the usable cores, at most 4), else 1.

    >>> resolve_thread_count(3)
    3
    """
    if value is not None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ProgramError(
                f"`{api}(num_threads=...)`: found {value!r} — valid: an int ≥ 1 — fix: "
                "num_threads=1 (the default), or the cores this program may use")
        return value
    text = os.environ.get(NUM_THREADS_ENV, "").strip()
    if not text:
        return 1
    if text.lower() == "auto":
        return max(1, min(_usable_cores(), AUTO_MAX))
    if text.isdigit() and int(text) > 0:
        return int(text)
    raise ProgramError(
        f"`{api}`: {NUM_THREADS_ENV}={text!r} — valid: a count ≥ 1 or 'auto' — fix: "
        f"unset it (one thread), or e.g. {NUM_THREADS_ENV}=2")


class ThreadGovernor:
    """Holds every BLAS/OpenMP pool (and, in ATen mode, torch's intra-op pool) at ``count``
    threads for the duration of a call, restoring each after.

    >>> governor = ThreadGovernor(1, pools=True, torch_intraop=False)
    >>> saved = governor.enter()
    >>> governor.exit(saved)
    """

    __slots__ = ("count", "_pools", "_torch")

    def __init__(self, count: int, *, pools: bool, torch_intraop: bool) -> None:
        self.count = count
        self._pools = _controllers() if pools else ()
        self._torch = _torch_module() if torch_intraop else None

    def enter(self) -> list:
        """Set each pool to ``count``; return what ``exit`` must put back."""
        saved = []
        count = self.count
        for pool in self._pools:
            before = pool.num_threads
            if before != count:
                pool.set_num_threads(count)
                saved.append((pool, before))
        torch = self._torch
        if torch is not None:
            before = torch.get_num_threads()
            if before != count:
                torch.set_num_threads(count)
                saved.append((None, before))
        return saved

    def exit(self, saved: list) -> None:
        for pool, before in saved:
            if pool is None:
                self._torch.set_num_threads(before)
            else:
                pool.set_num_threads(before)


# threadpoolctl finds the pools by reading /proc/self/maps (~1 ms, and a file a program's
# load would otherwise open every time): the controllers are found once per process and
# again only after opforge has loaded another native library (note_library_loaded)
_generation = 0
_found: tuple[int, tuple] | None = None
_seen: set[str] = set()


def note_library_loaded(path: object) -> None:
    """Called by every loader of native code (kernel libraries, MindSpore AOT libraries, op
    packages, the cpu engine) with the library's path: after a library this process had not
    loaded yet, the next method instance looks for pools again."""
    global _generation
    key = os.fspath(path) if isinstance(path, (str, os.PathLike)) else repr(path)
    if key not in _seen:
        _seen.add(key)
        _generation += 1


def _controllers() -> tuple:
    """threadpoolctl's controllers of every BLAS and OpenMP runtime loaded now."""
    global _found
    found = _found
    if found is not None and found[0] == _generation:
        return found[1]
    from threadpoolctl import ThreadpoolController

    generation = _generation
    controllers = tuple(ThreadpoolController().lib_controllers)
    _found = (generation, controllers)
    return controllers


def _torch_module():
    import torch

    return torch
