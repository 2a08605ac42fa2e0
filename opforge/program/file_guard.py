"""A loaded program file that changes on disk: noticed, refused, never a crash.

# Policy
#
# ``opforge.program.load`` maps the file and reads constants (and named data, and delegate
# blobs) through the mapping, never copied. Another process may still change the file:
#
# - truncated in place (``cp new.opf old.opf`` over a served file truncates, then writes):
#   a read past the new end is SIGBUS, in NumPy or in the cpu engine, in any thread. The
#   guard (``file_guard.cpp``, a SIGBUS handler) turns such a fault inside a guarded mapping
#   into zero pages over the rest of it and a flag; the call's results are discarded and it
#   raises ``ProgramError``, as does every later call of the program;
# - rewritten in place, same size or not: the mapping shows the new bytes (silently wrong
#   numbers, or a fault). A call on the Python paths compares the file's ``fstat`` (size
#   and modification time) with the one taken at load, at most every ``FSTAT_EVERY_NS`` (one
#   fstat is ~1 µs in a VM: an eighth of a small lean call), and refuses a changed file
#   before it reads it; ``LoadedProgram.method()`` always does; the cpu backend's native
#   call path (``_fastcall``, ~0.5 µs a call) checks the guard's flag only;
# - replaced by rename (``opforge.program.save``, ``mv``): the mapping keeps the old file's
#   pages, unchanged. This is the safe way to update a served program.
#
# The error names the file and says what to do: load it again; write new files beside the
# old one and rename them over it. The guard is built when opforge is installed (setup.py,
# into ``_guard/``), else compiled on first use into opforge's cache folder; where neither
# is possible (``problem()`` says why) only the fstat check runs: a file truncated during a
# call then still ends the process with SIGBUS.
#
# Standard library only at import: setup.py loads this file by path to build the guard.
"""

from __future__ import annotations

import ctypes
import os
import threading
import weakref
from pathlib import Path
from time import perf_counter_ns
from typing import Any

__all__ = ["FileWatch", "watch_of", "problem", "build", "installed_name", "DISABLE_ENV"]

SOURCE = Path(__file__).resolve().parent / "file_guard.cpp"
FLAGS = ("-std=c++17", "-shared", "-fPIC", "-O2", "-fvisibility=hidden")
DISABLE_ENV = "OPFORGE_FILE_GUARD"  # =0: no SIGBUS guard (the fstat check only)
# where the package build (setup.py) puts the guard built for SOURCE
INSTALL_DIR = Path(__file__).resolve().parent / "_guard"
# a call's check runs fstat at most this often: ~1 µs in a VM, an eighth of a small lean call
FSTAT_EVERY_NS = 5_000_000

_lock = threading.Lock()
_guard_lock = threading.Lock()
_state: dict = {}  # "lib" and "problem" once decided


class GuardBuildError(Exception):
    """The guard could not be built here (no compiler, a failed compile)."""


def _sha256(data: bytes) -> str:
    try:  # not hashlib: a deploy process does not load OpenSSL to find its libraries
        from _sha256 import sha256
    except ImportError:
        from hashlib import sha256
    return sha256(data).hexdigest()


def installed_name() -> str:
    """The guard library's file name for ``SOURCE`` built with ``FLAGS``."""
    return f"opforge_file_guard.{_sha256(SOURCE.read_bytes() + ' '.join(FLAGS).encode())[:16]}.so"


def build(out_dir: Path, cxx: str | None = None) -> Path:
    """Compile the guard into ``out_dir/installed_name()`` (written whole, then renamed)
    and remove older builds there: the package build's step (standard library only, as
    ``setup.py`` loads this file by path)."""
    import importlib.util

    path = SOURCE.parents[1] / "backends" / "cpu" / "engine_build.py"  # its build helpers
    spec = importlib.util.spec_from_file_location("_opforge_engine_build", path)
    engine_build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(engine_build)
    compiler = engine_build.find_compiler(cxx, GuardBuildError)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / installed_name()
    if target.is_file():
        return target
    return engine_build.compile_into(target, lambda tmp: [compiler, *FLAGS, "-o", tmp, str(SOURCE)],
                                     GuardBuildError, "opforge_file_guard.*.so")


def _built() -> Path:
    """The guard library for ``SOURCE``: the installed one (``setup.py``), else a verified
    copy under opforge's cache folder, else compiled now (the development fallback, which
    needs a compiler) into that folder. Neither lookup imports the toolchain or OpenSSL."""
    import shutil

    installed = INSTALL_DIR / installed_name()
    if installed.is_file():
        return installed
    root = os.environ.get("OPFORGE_CACHE_DIR")  # opforge.native.cache.cache_dir()
    folder = (Path(root) if root else Path.home() / ".cache" / "opforge") / "file-guard"
    copy = folder / installed_name()
    digest = copy.with_suffix(".sha256")
    try:
        if _sha256(copy.read_bytes()) == digest.read_text().strip():
            return copy
    except OSError:
        pass
    if not any(shutil.which(c) for c in (os.environ.get("CXX") or "c++", "g++", "clang++")):
        raise GuardBuildError("not installed, and no C++ compiler to build it (c++, g++, "
                              "clang++ not on PATH) — fix: reinstall opforge (pip install "
                              "opforge, or pip install -e . in a checkout), which builds it")
    folder.mkdir(parents=True, exist_ok=True)
    built = build(folder)
    tmp = digest.with_name(f".{digest.name}.{os.getpid()}.tmp")
    tmp.write_text(_sha256(built.read_bytes()))
    os.replace(tmp, digest)
    return built


def _library():
    """The guard library with its handler installed, or None (``problem()`` says why)."""
    if "lib" in _state:
        return _state["lib"]
    with _lock:
        if "lib" not in _state:
            _state["lib"], _state["problem"] = _load()
    return _state["lib"]


def _load():
    if os.environ.get(DISABLE_ENV) == "0":
        return None, f"disabled by {DISABLE_ENV}=0"
    try:
        lib = ctypes.CDLL(str(_built()))
        lib.ofg_install.restype = ctypes.c_int32
        lib.ofg_add.argtypes = [ctypes.c_size_t, ctypes.c_uint64]
        lib.ofg_add.restype = ctypes.c_int32
        lib.ofg_remove.argtypes = [ctypes.c_int32]
        lib.ofg_flag.argtypes = [ctypes.c_int32]
        lib.ofg_flag.restype = ctypes.c_void_p
        if lib.ofg_install() != 0:
            return None, "sigaction(SIGBUS) failed"
        return lib, None
    except Exception as e:  # noqa: BLE001 - no guard: the fstat check still runs
        return None, f"{type(e).__name__}: {e}"


def problem() -> str | None:
    """Why the SIGBUS guard is not in use, or None when it is."""
    _library()
    return _state["problem"]


class FileWatch:
    """One mapped program file: what it was at load (``fstat``), and its guard slot."""

    def __init__(self, mapping: Any, fd: int, path: str) -> None:
        st = os.fstat(fd)
        self.path, self.fd = path, fd
        # what a write in place changes (not the change time: a rename over the file, the
        # safe update, changes the old file's link count and so its ctime)
        self.size, self._mtime = st.st_size, st.st_mtime_ns
        self._mapping = weakref.ref(mapping)
        self._flag: ctypes.c_int32 | None = None  # the guard's flag: 1 once a read faulted
        self._checked = 0  # perf_counter_ns() of the last fstat of a call's check
        self._guarded = False

    def guard(self) -> None:
        """Put the mapping under the SIGBUS guard (once; a no-op without one)."""
        if self._guarded:
            return
        with _guard_lock:  # methods made in two threads at once: one slot, set when seen
            if not self._guarded:
                self._add()
                self._guarded = True

    def _add(self) -> None:
        mapping = self._mapping()
        lib = _library()
        if lib is None or mapping is None or len(mapping) == 0:
            return
        import numpy as np

        whole = memoryview(mapping)
        try:
            address = np.frombuffer(whole, np.uint8).ctypes.data
        finally:
            whole.release()
        slot = lib.ofg_add(address, len(mapping))
        if slot < 0:
            return  # every slot taken: unguarded (the fstat check still runs)
        self._flag = ctypes.c_int32.from_address(lib.ofg_flag(slot))
        # the slot is freed with the mapping (a finalizer of the mapping runs after
        # munmap; the guard then maps nothing over an address no mapping of ours holds)
        # not at exit: the mapping outlives the finalizers there, for a daemon thread's call
        weakref.finalize(mapping, lib.ofg_remove, slot).atexit = False

    def faulted(self) -> bool:
        """A read of the mapping faulted: the file was truncated under it."""
        flag = self._flag
        return flag is not None and flag.value != 0

    def changed(self) -> str | None:
        """What changed since load, or None."""
        if self.faulted():
            return "truncated in place (a read past its new end was stopped)"
        try:
            st = os.fstat(self.fd)
        except OSError as e:
            return f"no longer readable ({e.strerror or e})"
        if st.st_mtime_ns == self._mtime and st.st_size == self.size:
            return None
        if st.st_size != self.size:
            return f"truncated or rewritten in place ({self.size} bytes at load, {st.st_size} now)"
        return "rewritten in place (modified since load)"

    def check(self, api: str, doing: str = "no call can run", *, now: bool = True) -> None:
        """Raise ``ProgramError`` if the file changed since load: the guard's flag, and one
        ``fstat`` (``now=False``: only if ``FSTAT_EVERY_NS`` passed since the last one)."""
        flag = self._flag
        if flag is None or not flag.value:
            if not now:
                t = perf_counter_ns()
                if t - self._checked < FSTAT_EVERY_NS:
                    return
                self._checked = t
            try:
                st = os.fstat(self.fd)
            except OSError:
                st = None  # (changed() says why)
            if st is not None and st.st_mtime_ns == self._mtime and st.st_size == self.size:
                return
        raise self.error(api, self.changed() or "changed", doing)

    def check_faulted(self, api: str) -> None:
        """After a call: raise ``ProgramError`` if a read during it faulted."""
        flag = self._flag
        if flag is not None and flag.value:
            raise self.error(api, "truncated in place (a read past its new end was stopped)",
                             "this call's results are discarded")

    def error(self, api: str, what: str, doing: str):
        from opforge.errors import ProgramError

        return ProgramError(
            f"`{api}`: program file {self.path} — {what} after it was loaded; its constants "
            f"are read from the file, so {doing} — valid: a loaded program's file stays as "
            "it was — fix: 1. load the program again; 2. to update a program that is being "
            "served, write the new file beside it and rename it over the old one "
            "(opforge.program.save does; `cp new.opf old.opf` rewrites the loaded file in place)")


def watch_of(program: Any) -> FileWatch | None:
    """The ``FileWatch`` of the file ``program`` was loaded from (its segments are views of
    the mapping), or None for a program from bytes or built in memory."""
    for segment in getattr(program, "segments", ()):
        watch = getattr(getattr(segment.data, "obj", None), "watch", None)
        if watch is not None:
            return watch
    return None
