"""The build cache: content-addressed, atomic, crash-safe, verified, shared between processes.

    <root>/libs/<key>/        a finished build: the library, the project and build.json,
                              which records every file's size and SHA-256 (never partial)
    <root>/tmp/<key>.<pid>.*  a build in progress, or an evicted entry being removed
                              (removed when it fails; stale ones are swept by the next
                              builder of the same key)
    <root>/locks/<key>.lock   flock'ed while building or evicting <key>
    <root>/work/<name>/       a library's persistent work area (its CMake project and Ninja
                              build directory), reused by its next build so that only the
                              changed sources are recompiled; never part of an entry
    <root>/locks/work-<name>.lock  flock'ed while a build uses that work area

# Design
#
# The key is a SHA-256 over everything that affects the output (the caller assembles it:
# sources' bytes, headers, generated glue, flags, compiler identity, ABI and opforge
# versions). A finished build appears by os.replace of its whole directory, so a reader
# sees all of it or nothing. Builders of the same key serialise on an flock: the kernel
# releases it when the owner dies, so a crashed builder never blocks anyone, and whatever
# temp directory it left behind is stale by definition once we hold the lock. A failed
# build raises before the replace, so failures are never cached.
#
# An entry can still rot after it was published: a disk error, a full disk under an
# earlier tool, a user's cleanup script. So every hit is verified against build.json: each
# recorded file must exist with its recorded size and SHA-256. That is cheap: SHA-256 runs
# at about 1.6 GB/s here, so the example's 36 kB library hashes in ~30 µs and its whole
# entry (library + 5 project files) verifies in ~0.2 ms, next to ~15 ms for a warm
# build_library and ~1 s for a compile. An entry that fails (or that records no hashes:
# written by an older opforge) is evicted under the key's lock, by one os.replace into
# tmp/ (so a reader sees the whole entry or none), logged on the "opforge.native" logger,
# and built again.
#
# User headers. A header a source includes ("my_helpers.h" beside it) is not known before
# the compile, so it cannot be in the key. The builder records the ones each source did
# include (from Ninja's deps log, opforge's and the system's headers left out) with their
# SHA-256 in build.json, and every hit re-hashes them: a header changed or gone since makes
# the entry outdated, not corrupt, so it is evicted (logged at INFO) and built again under
# the same key; the work area recompiles only the sources that include it.
#
# Incremental builds. The key covers every source, so editing one source is a new key; to
# avoid recompiling the others, a library (by name, output file and toolchain) keeps a
# work area whose Ninja build directory outlives each build: Ninja recompiles what changed
# and relinks, and the new library is then published under its own key like any other.
# The work area is only a scratch space, never served: builders of one work area serialise
# on its flock, and a builder that dies while Ninja runs leaves an IN_PROGRESS marker, so
# the next one wipes the area and starts cold instead of trusting a half-written object.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from opforge._user_files import write_atomic

__all__ = ["cache_dir", "BuildCache", "CacheEntry", "hash_key", "copy_atomic", "in_progress"]

log = logging.getLogger("opforge.native")

RECORD = "build.json"
IN_PROGRESS = "in-progress"  # in a work area while Ninja runs in it


def cache_dir() -> Path:
    """``$OPFORGE_CACHE_DIR``, else ``~/.cache/opforge`` (the build cache lives in ``build/``)."""
    root = os.environ.get("OPFORGE_CACHE_DIR")
    return Path(root) if root else Path.home() / ".cache" / "opforge"


def hash_key(parts: dict) -> str:
    """SHA-256 of a JSON-able description (bytes values hashed separately)."""
    digest = hashlib.sha256()
    for name in sorted(parts):
        value = parts[name]
        digest.update(name.encode() + b"\0")
        if isinstance(value, bytes):
            digest.update(hashlib.sha256(value).digest())
        else:
            digest.update(json.dumps(value, sort_keys=True, default=str).encode())
        digest.update(b"\1")
    return digest.hexdigest()[:32]


def file_sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def record_files(directory: Path) -> dict[str, dict]:
    """``{relative path: {"size", "sha256"}}`` of every file under ``directory`` but
    build.json: what ``BuildCache.lookup`` verifies on every hit."""
    files = {}
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        rel = path.relative_to(directory).as_posix()
        if rel != RECORD:
            files[rel] = {"size": path.stat().st_size, "sha256": file_sha256(path)}
    return files


@dataclass(frozen=True)
class CacheEntry:
    """A verified finished build: its directory and its build.json (``record``)."""

    path: Path
    record: dict

    @property
    def library(self) -> Path:
        return self.path / self.record["library_file"]


class BuildCache:
    def __init__(self, root: Path | None = None) -> None:
        # absolute: the build runs cmake in a temp dir, where a relative root means nothing
        self.root = Path(os.path.abspath(root or cache_dir())) / "build"

    def entry(self, key: str) -> Path:
        return self.root / "libs" / key

    def lookup(self, key: str, *, evict_invalid: bool = False) -> CacheEntry | None:
        """The verified finished build of ``key``, or None.

        An entry that fails verification is None; with ``evict_invalid`` (call with the
        key's lock held) it is also evicted, with a warning on the "opforge.native" logger.
        An entry built from a user header that has changed or gone since is None too (and
        evicted, logged at INFO: editing a header is no corruption).
        """
        path = self.entry(key)
        if not path.exists():
            return None
        record, problem = _verify(path)
        stale = _changed_header(record) if problem is None else None
        if problem is None and stale is None:
            return CacheEntry(path, record)
        if evict_invalid:
            self.evict(key, problem or stale, corrupt=problem is not None)
        return None

    def evict(self, key: str, why: str, *, corrupt: bool = True) -> None:
        """Remove the entry of ``key`` atomically (call with the key's lock held)."""
        path = self.entry(key)
        grave = self.temp_dir(key)
        try:
            os.replace(path, grave / "evicted")
        except FileNotFoundError:
            pass  # already gone
        finally:
            shutil.rmtree(grave, ignore_errors=True)
        if corrupt:
            log.warning("opforge build: evicted a corrupt or outdated cache entry %s (%s); "
                        "rebuilding it", path, why)
        else:
            log.info("opforge build: evicted an outdated cache entry %s (%s); rebuilding it",
                     path, why)

    @contextlib.contextmanager
    def locked(self, key: str) -> Iterator[None]:
        """Hold the lock of ``key`` (blocks while another process builds it)."""
        with _flock(self.root / "locks" / f"{key}.lock"):
            yield

    @contextlib.contextmanager
    def work_area(self, name: str) -> Iterator[Path]:
        """Hold the persistent work area ``name`` (a directory; blocks while another build
        uses it). An area its last user left mid-build (``IN_PROGRESS``) is wiped first."""
        area = self.root / "work" / name
        with _flock(self.root / "locks" / f"work-{name}.lock"):
            if (area / IN_PROGRESS).exists():
                log.warning("opforge build: work area %s was left mid-build (a killed build?); "
                            "starting it over", area)
                shutil.rmtree(area, ignore_errors=True)
            area.mkdir(parents=True, exist_ok=True)
            yield area

    def sweep_stale(self, key: str) -> list[Path]:
        """Remove temp dirs of ``key`` left by dead builders (call with the lock held)."""
        tmp = self.root / "tmp"
        removed = []
        if tmp.is_dir():
            for stale in tmp.glob(f"{key}.*"):
                shutil.rmtree(stale, ignore_errors=True)
                removed.append(stale)
        return removed

    def temp_dir(self, key: str) -> Path:
        tmp = self.root / "tmp"
        tmp.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=f"{key}.{os.getpid()}.", dir=tmp))

    def commit(self, key: str, finished: Path) -> Path:
        """Publish ``finished`` (a temp dir holding build.json) as the entry of ``key``."""
        entry = self.entry(key)
        entry.parent.mkdir(parents=True, exist_ok=True)
        if entry.exists():  # only after a crash between replace and cleanup; same content
            shutil.rmtree(entry, ignore_errors=True)
        os.replace(finished, entry)
        return entry


@contextlib.contextmanager
def in_progress(area: Path) -> Iterator[None]:
    """Mark ``area`` as being written for the duration (see ``BuildCache.work_area``): the
    marker stays only if the process dies or is interrupted inside."""
    marker = area / IN_PROGRESS
    marker.touch()
    try:
        yield
    except Exception:  # the tools finished (or never started): the area is consistent
        marker.unlink(missing_ok=True)
        raise
    marker.unlink(missing_ok=True)


@contextlib.contextmanager
def _flock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def copy_atomic(src: Path, dst: Path) -> None:
    """Copy a file so that ``dst`` is either the old file or the complete new one.

    ``dst`` keeps its mode if it exists, else gets ``0o777 & ~umask`` (a linker's default
    for a shared library); see opforge/_user_files.py for the temp files and their sweep.
    """
    try:
        dst.parent.mkdir(parents=True, exist_ok=True)
    except FileExistsError:  # the parent exists as a regular file: say what it is
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR),
                                 str(dst.parent)) from None
    with open(src, "rb") as inp:
        write_atomic(dst, iter(lambda: inp.read(1 << 20), b""), new_mode=0o777, durable=False)


def _verify(entry: Path) -> tuple[dict | None, str | None]:
    """``(build.json, None)`` if every file it records is intact, else ``(None, why)``."""
    try:
        record = json.loads((entry / RECORD).read_bytes())
    except FileNotFoundError:
        return None, f"no {RECORD}"
    except (OSError, ValueError) as e:
        return None, f"{RECORD} is unreadable or not JSON ({type(e).__name__})"
    files = record.get("files") if isinstance(record, dict) else None
    if not isinstance(files, dict) or record.get("library_file") not in files:
        return None, f"{RECORD} records no file hashes (written by an older opforge?)"
    headers = record.get("headers")
    if not (isinstance(headers, dict) and all(
            isinstance(h, str) and isinstance(d, str) for h, d in headers.items())):
        return None, f"{RECORD} records no user headers (written by an older opforge?)"
    kernels = record.get("kernels")
    if not (isinstance(kernels, list) and all(
            isinstance(k, list) and len(k) == 3 and all(isinstance(x, str) for x in k)
            for k in kernels)):
        return None, f"{RECORD} has no valid kernel list"
    for rel, want in files.items():
        if not isinstance(want, dict) or ".." in Path(rel).parts or Path(rel).is_absolute():
            return None, f"{RECORD} has a malformed record for {rel!r}"
        path = entry / rel
        try:
            size = path.stat().st_size
            if size != want.get("size"):
                return None, f"{rel} has {size} bytes, {want.get('size')} recorded"
            if file_sha256(path) != want.get("sha256"):
                return None, f"{rel} does not match its recorded SHA-256"
        except FileNotFoundError:
            return None, f"{rel} is missing"
        except OSError as e:
            return None, f"{rel} is unreadable ({e.strerror or e})"
    return record, None


def _changed_header(record: dict) -> str | None:
    """Why the user headers the entry was built from (paths outside it, recorded with their
    SHA-256 in build.json; validated by ``_verify``) no longer match, or None if they do."""
    for header, digest in record["headers"].items():
        try:
            if file_sha256(Path(header)) != digest:
                return f"user header {header} changed since the build"
        except OSError as e:
            return f"user header {header} is gone or unreadable ({e.strerror or e})"
    return None
