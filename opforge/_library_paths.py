"""Libraries a file names: opened once and loaded from the open file, confined to their
package, and refused from folders anyone can write. Standard library only.

Used by the op-package loader (``opforge.backends.oppackage.runtime``: library paths from a
program or a compile spec) and the MindSpore vendor packages (``opforge.mindspore.package``:
library paths from ``op_info.json`` on a search path).

# Why open once
#
# A trust check that resolves a path and a load that resolves it again leave a window: a
# symlink (or a folder) flipped in between makes the loader run a library nobody checked,
# and its constructors run inside dlopen. So a library is opened once (``open_library``),
# the check looks at what the kernel says the descriptor is (``/proc/self/fd/N`` read back:
# the real path of the opened file, whatever happens to the name afterwards), and dlopen is
# given ``/proc/self/fd/N``: the same file, not a name looked up again. The descriptor stays
# open for as long as the library is loaded (for the process: opforge never unloads one), so
# its number is never reused for another library: the dynamic loader matches an already
# loaded object by the name it was opened with. The cost: the loader takes /proc/self/fd as
# the library's $ORIGIN, so a dependency found through an rpath of $ORIGIN is not found
# (the op-package loader says so, with the fix: an absolute rpath or LD_LIBRARY_PATH).
#
# Why refuse world-writable folders (not warn)
#
# Anyone on the machine can put a library into a world-writable folder, or, without the
# sticky bit, rename what is there; a library loaded from it runs their code in this
# process. A warning is read after the code has run, so opforge refuses: a library, or a
# folder between the trusted root and the library, that others can write, and any folder
# above it that others can rename entries of (world-writable without the sticky bit, unlike
# /tmp).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__ = ["OpenedLibrary", "open_library", "inside", "world_writable_problem"]

_PROC_FD = "/proc/self/fd"


class OpenedLibrary:
    """A library file opened for reading: ``real`` is its real path as the kernel reports
    it for the open descriptor, ``load_path`` the name to give dlopen (the descriptor)."""

    def __init__(self, fd: int, real: str) -> None:
        self.fd, self.real = fd, real

    @property
    def load_path(self) -> str:
        return f"{_PROC_FD}/{self.fd}"

    def close(self) -> None:
        """Close the descriptor, unless dlopen was given it (see ``loaded``)."""
        if self.fd >= 0 and self not in _held:
            os.close(self.fd)
            self.fd = -1

    def loaded(self) -> bool:
        """Record that dlopen took the descriptor (it then stays open for the process) and
        check that the process maps this very file: had a library opened earlier under the
        same descriptor name stayed loaded, dlopen would have returned that one."""
        _held.append(self)
        st = os.fstat(self.fd)
        want = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}"
        try:
            with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
                for line in maps:
                    fields = line.split(None, 5)
                    if len(fields) >= 5 and fields[4] == str(st.st_ino) and fields[3] == want:
                        return True
        except OSError:
            return True  # no /proc/self/maps to ask: the held descriptor is the guarantee
        return False


_held: list[OpenedLibrary] = []  # descriptors dlopen was given: never closed, never reused


def open_library(path: str | os.PathLike) -> OpenedLibrary:
    """Open ``path`` once (``OSError`` if it cannot be; ``IsADirectoryError``-like
    ``OSError`` if it is not a regular file) and read back what was opened."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | getattr(os, "O_NONBLOCK", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise OSError(f"{os.fspath(path)} is not a regular file")
        try:
            real = os.readlink(f"{_PROC_FD}/{fd}")
        except OSError:
            raise OSError(f"{_PROC_FD} is not available, and opforge loads a library only "
                          "through the descriptor it checked (Linux with /proc mounted)") from None
        return OpenedLibrary(fd, real)
    except BaseException:
        os.close(fd)
        raise


def inside(path: str | os.PathLike, folder: str | os.PathLike) -> bool:
    """Whether the real path of ``path`` lies in the real path of ``folder``."""
    real, root = os.path.realpath(path), os.path.realpath(folder)
    return os.path.commonpath([real, root]) == root


def world_writable_problem(path: str | os.PathLike, root: str | os.PathLike | None = None) -> str | None:
    """None when ``path`` (a real path) is safe from other users; else what is not: ``path``
    itself or a folder from ``root`` (default: the folder of ``path``) down to it is
    world-writable, or a folder above is world-writable without the sticky bit."""
    target = Path(os.path.realpath(path))
    top = Path(os.path.realpath(root)) if root is not None else target.parent
    if top != target and top not in target.parents:
        top = target.parent
    chain = [target, *target.parents]
    for p in chain:
        try:
            mode = os.stat(p).st_mode
        except OSError:
            continue
        if not mode & stat.S_IWOTH:
            continue
        below_root = p == top or top in p.parents
        if below_root or not mode & stat.S_ISVTX:
            return (f"{p} is world-writable (mode {stat.filemode(mode)})"
                    + ("" if below_root else " without the sticky bit"))
    return None
