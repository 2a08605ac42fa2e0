"""Incremental compilation in a library's persistent work area (``BuildCache.work_area``).

The driver builds in a work area that outlives each build, so Ninja recompiles only what
changed. Three things make its reuse exact, not just fast:

    sync_project(...)              rewrite only the generated files whose text changed, so
                                   unchanged ones keep their mtimes (and their objects)
    forget_changed_sources(...)    delete the object of every source whose bytes differ from
                                   those it was compiled from: Ninja compares mtimes only,
                                   and a source restored with an older mtime (``cp -p``, a
                                   checkout, an editor's backup) must still be recompiled
    snapshot / compiled(...)       which objects this build wrote: the build report's
                                   ``compiled`` (the translation units recompiled)
    included_headers(...)          the user headers each source included (Ninja's deps log,
                                   from the compiler's -MD output) and their SHA-256: kept in
                                   build.json (re-hashed on every cache hit) and here, where
    forget_changed_headers(...)    deletes the object of every source one of whose headers'
                                   bytes changed or vanished (same reason as for sources)

Objects are found by CMake's naming: ``CMakeFiles/<target>.dir/<path>.o``, where <path>
is a source's absolute path without its leading "/" (the glue: ``opforge_register.cpp``).
A changed source that build.ninja compiles to an object not named that way makes every
object go (a cold build: slower, never wrong).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

__all__ = ["sync_project", "forget_changed_sources", "snapshot", "compiled", "objects_of",
           "included_headers", "record_headers", "forget_changed_headers", "GLUE"]

GLUE = "opforge_register.cpp"
_DIGESTS = "sources.json"  # {source path: SHA-256 its object (if any) was compiled from}
_HEADERS = "headers.json"  # {source path: {user header: SHA-256 its object was compiled with}}


def sync_project(project_dir: Path, build_dir: Path, files: dict[str, str]) -> list[str]:
    """Make ``project_dir`` hold exactly ``files``, touching only what differs; returns the
    files rewritten. Objects that depend on a rewritten file are deleted too: a file
    rewritten within the filesystem's timestamp granularity of its object's last compile
    would look older than that object to Ninja (the glue's object for the glue, every
    object for a header)."""
    changed = []
    for rel, text in files.items():
        target = project_dir / rel
        data = text.encode("utf-8")
        try:
            if target.read_bytes() == data:
                continue
        except OSError:
            pass
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        changed.append(rel)
    wanted = {project_dir / rel for rel in files}
    for path in project_dir.rglob("*"):
        if path.is_file() and path not in wanted:
            path.unlink()
    if any(rel.endswith(".h") for rel in changed):
        doomed = list((build_dir / "CMakeFiles").glob("*.dir/**/*.o"))
    elif GLUE in changed:
        doomed = [d / _object_name(GLUE) for d in (build_dir / "CMakeFiles").glob("*.dir")]
    else:
        doomed = []
    for obj in doomed:
        obj.unlink(missing_ok=True)
    return changed


def _object_name(source: Path | str) -> str:
    return (GLUE if str(source) == GLUE else Path(source).as_posix().lstrip("/")) + ".o"


def _ninja_escape(path: str) -> str:
    return path.replace("$", "$$").replace(" ", "$ ").replace(":", "$:")


def objects_of(build_dir: Path, sources: list[Path | str]) -> dict[str, Path]:
    """``{source: its object}`` for the sources (or ``GLUE``) that have one."""
    objects = list((build_dir / "CMakeFiles").glob("*.dir/**/*.o"))
    found = {}
    for source in sources:
        suffix = _object_name(source)
        for obj in objects:
            rel = obj.relative_to(build_dir / "CMakeFiles").as_posix().partition("/")[2]
            if rel == suffix:
                found[str(source)] = obj
    return found


def forget_changed_sources(area: Path, build_dir: Path, digests: dict[str, str]) -> list[str]:
    """Delete the objects of sources whose digest changed since they were compiled, and
    record the new digests (before building: an object that exists afterwards was compiled
    from the recorded bytes, even if the build fails half-way). Returns the sources."""
    record = area / _DIGESTS
    try:
        known = json.loads(record.read_text())
        known = known if isinstance(known, dict) else {}
    except (OSError, ValueError):
        known = {}
    changed = [s for s, digest in digests.items() if known.get(s) != digest]
    ninja_file = build_dir / "build.ninja"
    rules = ninja_file.read_text(errors="replace") if ninja_file.is_file() else ""
    doomed = []
    for source in changed:
        if f"/{_ninja_escape(_object_name(source))}:" in rules:  # named as we expect
            doomed += [d / _object_name(source) for d in (build_dir / "CMakeFiles").glob("*.dir")]
        elif _ninja_escape(source) in rules:  # compiled to an object we cannot place: all go
            doomed = list((build_dir / "CMakeFiles").glob("*.dir/**/*.o"))
            break
        # else: a source new to this area has no object yet
    for obj in doomed:
        obj.unlink(missing_ok=True)
    known.update(digests)
    tmp = record.with_suffix(".tmp")
    tmp.write_text(json.dumps(known, indent=1, sort_keys=True))
    os.replace(tmp, record)
    return changed


def snapshot(build_dir: Path) -> dict[str, tuple[int, int, int]]:
    """Every object file's identity (mtime, inode, size), to see which a build rewrote."""
    found = {}
    for obj in (build_dir / "CMakeFiles").glob("*.dir/**/*.o"):
        st = obj.stat()
        found[obj.as_posix()] = (st.st_mtime_ns, st.st_ino, st.st_size)
    return found


def compiled(before: dict, after: dict, build_dir: Path, sources: list[Path]) -> tuple[str, ...]:
    """The translation units whose objects the build wrote: source paths, and ``GLUE``."""
    objects = objects_of(build_dir, [*sources, GLUE])
    return tuple(source for source, obj in objects.items()
                 if before.get(obj.as_posix()) != after.get(obj.as_posix()))


def _sha256(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()
    except OSError:
        return None


def included_headers(build_dir: Path, ninja: str, sources: list[Path],
                     ignore: list[Path]) -> dict[str, dict[str, str]]:
    """``{source: {user header it included: SHA-256}}`` after a successful build, from
    Ninja's deps log (``ninja -t deps``: the compiler's -MD output, which CMake's Ninja
    generator asks for). A user header is any dependency that is not a source itself and not
    under one of the ``ignore`` directories (opforge's headers, the generated project, the
    compiler's system include directories). Raises ``OSError`` if Ninja cannot say."""
    proc = subprocess.run([ninja, "-C", str(build_dir), "-t", "deps"], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, errors="replace")
    if proc.returncode != 0:
        raise OSError(f"ninja -t deps failed in {build_dir}: {proc.stdout[-2000:]}")
    deps: dict[str, list[str]] = {}
    current = None
    for line in proc.stdout.splitlines():
        if not line.strip():
            current = None
        elif not line[0].isspace() and ": #deps" in line:
            current = os.path.normpath(os.path.join(build_dir, line.partition(": #deps")[0]))
            deps[current] = []
        elif current is not None:
            deps[current].append(os.path.normpath(os.path.join(build_dir, line.strip())))
    skip = {os.path.normpath(str(s)) for s in sources}
    roots = [os.path.normpath(str(d)) + os.sep for d in ignore]
    found = {}
    for source, obj in objects_of(build_dir, list(sources)).items():
        headers = {}
        for dep in deps.get(os.path.normpath(str(obj)), []):
            if dep in skip or any(dep.startswith(root) for root in roots):
                continue
            digest = _sha256(dep)
            if digest is not None:
                headers[dep] = digest
        found[source] = dict(sorted(headers.items()))
    return found


def record_headers(area: Path, headers: dict[str, dict[str, str]]) -> None:
    """Remember which headers (and bytes) each source's object was compiled with."""
    record = area / _HEADERS
    tmp = record.with_suffix(".tmp")
    tmp.write_text(json.dumps(headers, indent=1, sort_keys=True))
    os.replace(tmp, record)


def forget_changed_headers(area: Path, build_dir: Path) -> list[str]:
    """Delete the objects of sources one of whose recorded user headers changed or is
    gone since they were compiled (Ninja compares mtimes only). Returns the sources."""
    try:
        known = json.loads((area / _HEADERS).read_text())
        known = known if isinstance(known, dict) else {}
    except (OSError, ValueError):
        known = {}
    changed = [source for source, headers in known.items() if isinstance(headers, dict)
               and any(_sha256(h) != digest for h, digest in headers.items())]
    for obj in objects_of(build_dir, changed).values():
        obj.unlink(missing_ok=True)
    return changed
