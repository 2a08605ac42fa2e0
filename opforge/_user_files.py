"""Files a user names: atomic writes, the regular-file check, and OSError messages.

Used by ``opforge.program.save`` (the program file), ``opforge.program.load`` and the
build's copy-out of a library to ``-o``. Standard library only (the lean runtime imports it).

# Atomic writes and their temp files
#
# A file is written to a temp file beside it and renamed over the target (os.replace), so a
# reader sees the old file or the complete new one. The temp file is named
#
#     .<target name>.<pid>.<random>.opforge-tmp
#
# so that a writer killed with SIGKILL (no `finally` runs) leaves a file that says whose it
# was: the next write of the same target in that directory removes every such file whose
# pid is no longer alive. A live pid's file is never touched (it may be being written now),
# so a reused pid only delays the sweep. We chose this over O_TMPFILE + linkat (Linux only,
# and linkat cannot replace an existing file, so a named temp file is still needed).
#
# The temp file is created with mode 0o666 (0o777 for a library) and the kernel applies the
# umask, which is exactly what open(path, "w") gives a new file; when the target exists, its
# permission bits are copied (fchmod ignores the umask), so a save keeps a 0644 file 0644.
# (tempfile.mkstemp creates 0600 files, which os.replace would then make the target's mode.)
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Iterable

__all__ = ["write_atomic", "sweep_stale_temps", "require_regular_file", "regular_file_problem",
           "file_kind",
           "os_error_text", "TEMP_SUFFIX"]

TEMP_SUFFIX = ".opforge-tmp"
_NAME_ROOM = 160  # characters of the target's name kept in a temp name (NAME_MAX is 255)


def _temp_prefix(name: str) -> str:
    return f".{name[:_NAME_ROOM]}."


def _pid_alive(pid: int) -> bool:
    if pid <= 0:  # os.kill(0, ...) would signal our own process group
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def sweep_stale_temps(directory: Path, name: str) -> list[Path]:
    """Remove the temp files of target ``name`` in ``directory`` whose writer is dead."""
    prefix = _temp_prefix(name)
    removed = []
    try:
        entries = os.listdir(directory)
    except OSError:
        return removed  # the write itself will report the directory's problem
    for entry in entries:
        if not (entry.startswith(prefix) and entry.endswith(TEMP_SUFFIX)):
            continue
        pid, _, _ = entry[len(prefix):-len(TEMP_SUFFIX)].partition(".")
        if not pid.isdigit() or _pid_alive(int(pid)):
            continue
        try:
            os.unlink(directory / entry)
            removed.append(directory / entry)
        except OSError:
            pass  # another writer swept it first, or we may not: not this write's problem
    return removed


def _existing_mode(path: Path) -> int | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return stat.S_IMODE(st.st_mode) if stat.S_ISREG(st.st_mode) else None


def write_atomic(path: Path, chunks: Iterable[bytes], *, new_mode: int = 0o666,
                 durable: bool = True) -> None:
    """Write ``chunks`` to ``path`` atomically (see the block comment above).

    A new file gets ``new_mode & ~umask``; an existing regular file keeps its mode.
    ``durable`` fsyncs the file and the directory before returning. Raises the OSError of
    whatever failed; the temp file is removed on any failure.
    """
    path = Path(path)
    directory = path.parent
    sweep_stale_temps(directory, path.name)
    mode = _existing_mode(path)
    tmp = directory / f"{_temp_prefix(path.name)}{os.getpid()}.{os.urandom(4).hex()}{TEMP_SUFFIX}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0),
                 new_mode)
    try:
        with os.fdopen(fd, "wb") as f:
            if mode is not None:
                os.fchmod(f.fileno(), mode)
            for chunk in chunks:
                f.write(chunk)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if durable:
        _fsync_directory(directory)


def _fsync_directory(directory: Path) -> None:
    """Make the rename itself durable (POSIX); a no-op where directories cannot be opened."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"))


def file_kind(mode: int) -> str:
    """What a non-regular file is, in words ("a FIFO (named pipe)", ...)."""
    return next((words for test, words in _KINDS if test(mode)), "not a regular file")


def require_regular_file(path: str | os.PathLike) -> str | None:
    """None if ``path`` is a regular file (symlinks followed); else what it is, in words.

    Checked with os.stat before anything opens the path: opening a FIFO blocks until a
    writer appears, and opening a device can have side effects. Raises the stat's OSError.
    """
    mode = os.stat(path).st_mode
    return None if stat.S_ISREG(mode) else file_kind(mode)


def regular_file_problem(path: str | os.PathLike, valid: str, fix: str) -> str | None:
    """None if ``path`` is a regular file to read; else the message body naming it, for the
    caller's error class: ``"<path> — cannot read it (...) — ..."`` when os.stat fails, or
    ``"'<path>' — is a FIFO (named pipe) — valid: <valid> — fix: <fix>"``."""
    try:
        kind = require_regular_file(path)
    except OSError as e:
        return os_error_text(e, path, "read")
    if kind is None:
        return None
    return f"{os.fspath(path)!r} — is {kind} — valid: {valid} — fix: {fix}"


def os_error_text(exc: OSError, path: str | os.PathLike, action: str) -> str:
    """``"<path> — cannot <action> it (<errno text>, <ERRNO>) — valid: ... — fix: ..."``.

    The path named is the user's (never a temp file's), with the errno's own words and an
    advice that depends on the errno.

    >>> os_error_text(FileNotFoundError(errno.ENOENT, "No such file or directory"),
    ...               "out/x.opf", "write")  # doctest: +ELLIPSIS
    'out/x.opf — cannot write it (No such file or directory, ENOENT) — valid: ...(mkdir -p out)...'
    """
    path = Path(path)
    code = errno.errorcode.get(exc.errno, "") if exc.errno else ""
    why = exc.strerror or str(exc)
    valid = ("a readable regular file" if action == "read" else
             "a path in an existing directory you can write, on a filesystem with free space")
    return (f"{path} — cannot {action} it ({why}{', ' + code if code else ''}) — valid: "
            f"{valid} — fix: {_advice(exc.errno, path, action)}")


def _advice(code: int | None, path: Path, action: str) -> str:
    parent = path.parent
    writing = action != "read"
    if code == errno.ENOENT:
        if writing:
            return (f"create the directory first (mkdir -p {parent}), or choose a path in an "
                    "existing directory")
        return "check the path (the file does not exist)"
    if code == errno.ENOTDIR:
        return (f"a component of {parent} is a regular file, not a directory; choose a path "
                "under a directory")
    if code == errno.EISDIR:
        return f"{path} is a directory; name a file inside it"
    if code in (errno.EACCES, errno.EPERM):
        return ("choose a location you can write, or fix the permissions" if writing else
                "fix the file's permissions, or copy it somewhere readable")
    if code == errno.EROFS:
        return "the filesystem is read-only; write somewhere else"
    if code in (errno.ENOSPC, errno.EDQUOT):
        return f"free disk space (or quota) on the filesystem of {parent}, or write elsewhere"
    if code == errno.ENAMETOOLONG:
        return "use a shorter file name"
    return "check the path and the filesystem it is on"
