"""One compiler call, sources → a shared library in opforge's content-addressed build cache.

For builds without generated glue (MindSpore AOT sources, the cpu backend's engine): the
cache key hashes the sources' bytes, the flags, the compiler's identity, opforge's version
and ``extra`` (what else decides the result, e.g. a dependency's version); the headers the
sources include from outside ``include_dirs`` and the system are recorded and re-hashed on
every hit, so editing one rebuilds. A warm call compiles nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Callable, Sequence

from opforge.backends.cpu.engine_build import run_compiler  # (standard library only)
from opforge.errors import BuildError
from opforge.native.cache import RECORD, BuildCache, hash_key, record_files

__all__ = ["compile_shared"]


# Sources edited during the compile. The key hashes the sources' bytes before the compiler
# reads them, and one compiler call reads each translation unit when it gets to it (the
# cpu engine: ~30 of them over 1-3 minutes), so a source or header saved in that window (an
# engineer editing the engine in the checkout another one's tests compile from) gave a
# library of other sources, or of a mix of two versions, published under the key of the
# first. Every source and user header is hashed again after the compile; a build whose
# inputs changed under it is not published, and is made again from the sources as they
# are now (a few times, then a BuildError).
ATTEMPTS = 3


def compile_shared(sources: Sequence[str | os.PathLike], name: str, *, flags: Sequence[str],
                   include_dirs: Sequence[Path] = (), kind: str, api: str,
                   extra: dict | None = None, cache_root: Path | None = None,
                   key_path: Callable[[Path], str] = str, library_name: str | None = None) -> Path:
    """Compile ``sources`` with ``flags`` into ``lib<name>.so`` (or ``library_name``) in the
    build cache; its path. ``key_path`` names a source or include folder in the cache key
    (e.g. relative to a project root, so a build from a temporary folder still hits)."""
    paths = [Path(s).resolve() for s in sources]
    changed: list[str] = []
    for _ in range(ATTEMPTS):
        built, changed = _compile_once(paths, name, flags=flags, include_dirs=include_dirs,
                                       kind=kind, api=api, extra=extra, cache_root=cache_root,
                                       key_path=key_path, library_name=library_name)
        if built is not None:
            return built
    raise BuildError(f"`{api}`: compiling {', '.join(p.name for p in paths)} — the sources "
                     f"changed during each of {ATTEMPTS} compiles ({', '.join(changed[:5])}) — "
                     "valid: sources left as they are while they compile — fix: run again "
                     "once the edits are saved")


def _digests(paths: Sequence[Path], key_path: Callable[[Path], str], api: str) -> list:
    digests = []
    for p in paths:
        try:
            digests.append((key_path(p), hashlib.sha256(p.read_bytes()).hexdigest()))
        except OSError as e:
            raise BuildError(f"`{api}`: source {str(p)!r} — cannot be read ({e.strerror or e}) "
                             "— valid: an existing .cc/.cpp file — fix: check the path") from None
    return digests


def _compile_once(paths: list[Path], name: str, *, flags, include_dirs, kind, api, extra,
                  cache_root, key_path, library_name) -> tuple[Path | None, list[str]]:
    """One try: the cached or newly built library, or None and the inputs that changed
    while it compiled (nothing is published then)."""
    from opforge import __version__
    from opforge.native.toolchain import find_toolchain

    digests = _digests(paths, key_path, api)
    toolchain = find_toolchain()
    command_flags = [*flags, *(f"-I{d}" for d in include_dirs)]
    key_flags = [*flags, *(f"-I{key_path(Path(d).resolve())}" for d in include_dirs)]
    key = hash_key({"sources": digests, "flags": key_flags, "toolchain": toolchain.identity(),
                    "opforge": __version__, "kind": kind, "name": name, "extra": extra or {}})
    cache = BuildCache(cache_root)
    library_name = library_name or f"lib{name}.so"
    found = cache.lookup(key)
    if found is not None:
        return found.library, []
    with cache.locked(key):
        found = cache.lookup(key, evict_invalid=True)  # a corrupt entry is rebuilt
        if found is not None:
            return found.library, []
        cache.sweep_stale(key)
        work = cache.temp_dir(key)
        link = [f for f in command_flags if f.startswith(("-l", "-L", "-Wl,"))]
        # the user headers with their bytes before the compile (recorded, and compared after)
        headers = _user_headers(toolchain, [f for f in command_flags if f not in link], paths,
                                include_dirs)
        command = [toolchain.cxx, *command_flags, "-o", str(work / library_name),
                   *map(str, paths)]
        command = [c for c in command if c not in link] + link  # libraries after the sources
        proc = run_compiler(command)  # the units side by side (the engine's ~40)
        if proc.returncode != 0:
            errors = [line for line in proc.stdout.splitlines() if ": error:" in line]
            shown = "\n".join(errors[:20] or proc.stdout.splitlines()[-20:])
            raise BuildError(f"`{api}`: compiling {', '.join(p.name for p in paths)} — the "
                             f"compiler failed (exit {proc.returncode}):\n{shown}\n— command: "
                             f"{' '.join(command)} — fix: correct the errors above")
        changed = [p.name for p, before, after in zip(paths, digests, _digests(paths, key_path, api))
                   if before != after]
        changed += [Path(h).name for h, digest in headers.items() if _sha256_or_none(h) != digest]
        if changed:
            shutil.rmtree(work, ignore_errors=True)
            return None, changed
        (work / "build.log").write_text(proc.stdout)
        record = {"library_file": library_name, "files": record_files(work), "kernels": [],
                  "command": command, "headers": headers}
        (work / RECORD).write_text(json.dumps(record))
        return cache.commit(key, work) / library_name, []


def _sha256_or_none(path: str) -> str | None:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


def _user_headers(toolchain, flags: list[str], sources: list[Path],
                  include_dirs: Sequence[Path]) -> dict[str, str]:
    """``{user header: SHA-256}`` the sources include (the compiler's ``-M`` rules, without
    the sources, ``include_dirs`` and the compiler's system directories)."""
    skip = {os.path.normpath(str(s)) for s in sources}
    roots = [os.path.normpath(str(d)) + os.sep
             for d in (*include_dirs, *toolchain.system_include_dirs())]
    headers: dict[str, str] = {}
    for source in sources:
        proc = subprocess.run([toolchain.cxx, *flags, "-M", str(source)], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True, errors="replace")
        rule = proc.stdout.replace("\\\n", " ").partition(":")[2]
        for dep in rule.split():
            dep = os.path.normpath(os.path.abspath(dep))
            if dep in skip or any(dep.startswith(root) for root in roots):
                continue
            try:
                headers[dep] = hashlib.sha256(Path(dep).read_bytes()).hexdigest()
            except OSError:
                continue
    return dict(sorted(headers.items()))
