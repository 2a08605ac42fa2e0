"""The build cache: content-addressed, atomic, crash-safe, shared between processes.

    <root>/libs/<key>/        a finished build: the library and build.json (never partial)
    <root>/tmp/<key>.<pid>.*  a build in progress (removed when it fails; stale ones are
                              swept by the next builder of the same key)
    <root>/locks/<key>.lock   flock'ed while building <key>

# Design
#
# The key is a SHA-256 over everything that affects the output (the caller assembles it:
# sources' bytes, headers, generated glue, flags, compiler identity, ABI and opforge
# versions). A finished build appears by os.replace of its whole directory, so a reader
# sees all of it or nothing. Builders of the same key serialise on an flock: the kernel
# releases it when the owner dies, so a crashed builder never blocks anyone, and whatever
# temp directory it left behind is stale by definition once we hold the lock. A failed
# build raises before the replace, so failures are never cached.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

__all__ = ["cache_dir", "BuildCache", "hash_key"]


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


class BuildCache:
    def __init__(self, root: Path | None = None) -> None:
        self.root = (root or cache_dir()) / "build"

    def entry(self, key: str) -> Path:
        return self.root / "libs" / key

    def lookup(self, key: str) -> Path | None:
        """The finished build directory of ``key``, or None."""
        entry = self.entry(key)
        return entry if (entry / "build.json").is_file() else None

    @contextlib.contextmanager
    def locked(self, key: str) -> Iterator[None]:
        """Hold the lock of ``key`` (blocks while another process builds it)."""
        locks = self.root / "locks"
        locks.mkdir(parents=True, exist_ok=True)
        with open(locks / f"{key}.lock", "a+") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

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


def copy_atomic(src: Path, dst: Path) -> None:
    """Copy a file so that ``dst`` is either the old file or the complete new one."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dst.name}.", dir=dst.parent)
    try:
        with os.fdopen(fd, "wb") as out, open(src, "rb") as inp:
            shutil.copyfileobj(inp, out)
        os.chmod(tmp, 0o755)
        os.replace(tmp, dst)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
