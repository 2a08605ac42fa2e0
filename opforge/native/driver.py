"""``build_library``: manifest + C++ sources → one kernel library, through the cache.

The stages, top to bottom (one function each below):

    load + select ops → codegen → find toolchain → cache key
      → verified cache hit? copy out, done
      → lock key → (verified hit after waiting? copy out) → evict a corrupt entry
      → sweep stale temp dirs
      → write project → lock the library's work area → sync the project into it
        → forget objects of changed sources and of changed user headers
        → cmake configure (first time only) → ninja build (only changed sources recompile)
        → user headers each source included (Ninja's deps log) → check every kernel is defined
      → build.json (sizes and SHA-256 of every file and user header) → publish (atomic)
      → copy out (atomic)

An OSError on the way (a cache directory under a regular file, a full disk, an output
directory that cannot be created) is a BuildError naming the path, with a fix.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

from opforge._user_files import os_error_text, regular_file_problem
from opforge.native import incremental
from opforge.native.abi import ABI_VERSION, include_dir
from opforge.native.cache import (BuildCache, CacheEntry, copy_atomic, hash_key, in_progress,
                                 record_files)
from opforge.native.codegen import GeneratedProject, generate_project, target_name
from opforge.native.diagnostics import compile_error, undefined_kernels_error
from opforge.native.selection import select_ops
from opforge.native.toolchain import Toolchain, find_toolchain
from opforge.errors import BuildError
from opforge.manifest import OpDef, load_definitions

__all__ = ["build_library", "BuildResult"]


@dataclass(frozen=True)
class BuildResult:
    """What a build produced.

    ``kernels``: ``(out overload key, dtype key, C++ kernel)`` of every kernel in the
    library; ``cached``: served from the cache without compiling; ``project_dir``: the
    generated CMake project, kept in the cache (build it standalone or cross-compile it);
    ``compiled``: the translation units this build recompiled (source paths, and
    ``"opforge_register.cpp"`` for the glue): empty for a cache hit, only the changed
    sources when an earlier build of the same library left their objects.
    """

    path: Path
    key: str
    cached: bool
    seconds: float
    size: int
    kernels: tuple[tuple[str, str, str], ...]
    selection: str
    project_dir: Path
    unserved: tuple[str, ...] = field(default=())
    compiled: tuple[str, ...] = field(default=())

    @property
    def ops(self) -> list[str]:
        return list(dict.fromkeys(k for k, _, _ in self.kernels))


def build_library(manifest_or_opdefs: str | os.PathLike | Sequence[OpDef],
                  sources: Iterable[str | os.PathLike], output: str | os.PathLike, *,
                  ops: Iterable[str] | None = None, programs: Iterable[str | os.PathLike] = (),
                  dtypes: Iterable[str] | None = None, name: str | None = None,
                  extra_flags: Sequence[str] = (), cxx: str | None = None,
                  cache_root: str | os.PathLike | None = None,
                  progress: bool | None = None, target: str | None = None) -> BuildResult:
    """Compile the kernels of the selected ops into the shared library ``output``.

    ``extra_flags`` are added to ``-O2`` (e.g. ``("-O3", "-march=native")``); ``cxx`` picks
    the compiler (default ``$CXX``, then ``c++``); ``cache_root`` overrides
    ``$OPFORGE_CACHE_DIR``. Raises ``BuildError`` with the author's file:line first.
    ``target`` (e.g. ``"aarch64-linux-gnu"``, opforge/native_runtime/targets.py) cross-compiles
    with that target's toolchain file, after a build for this machine has checked that every
    kernel is defined (a library for another machine cannot be loaded here).

    >>> from opforge.examples.my_ops import manifest_path               # doctest: +SKIP
    >>> r = build_library(manifest_path(), ["mul.cpp"], "libmy_ops.so",   # doctest: +SKIP
    ...                   ops=["my_ops::mul3"])
    >>> r.ops, r.cached                                                 # doctest: +SKIP
    (['my_ops::mul3.out'], False)
    """
    start = time.perf_counter()
    output = Path(output).resolve()
    opdefs = _opdefs(manifest_or_opdefs)
    selection = select_ops(opdefs, ops=ops, programs=programs, dtypes=dtypes)
    if not selection.opdefs:
        raise BuildError(f"`opforge build`: selection ({selection.reason}) — no operator with a "
                         "kernel binding is left — fix: select ops the manifest binds kernels to")
    source_paths = _sources(sources)
    library = name or target_name(output.name)
    project = generate_project(library, list(selection.opdefs), source_paths,
                               output_name=output.name, extra_flags=tuple(extra_flags))
    cross = _cross_target(target, extra_flags, cxx)
    if cross is not None:  # the definitions checked where the library can be loaded
        with tempfile.TemporaryDirectory() as host_dir:
            build_library(opdefs, source_paths, Path(host_dir) / output.name, ops=ops,
                          programs=programs, dtypes=dtypes, name=name, extra_flags=extra_flags,
                          cache_root=cache_root, progress=progress)
    toolchain = find_toolchain(cross.compiler() if cross else cxx)
    key = _cache_key(project, source_paths, extra_flags, toolchain, cross)
    cache = BuildCache(Path(cache_root) if cache_root else None)
    show = sys.stderr.isatty() if progress is None else progress

    compiled: tuple[str, ...] = ()
    try:
        entry, fresh = cache.lookup(key), False
        if entry is None:
            with cache.locked(key):
                # another process may have built it while we waited; a corrupt entry is
                # evicted here, under the lock, and built again
                entry = cache.lookup(key, evict_invalid=True)
                if entry is None:
                    cache.sweep_stale(key)
                    entry, compiled = _build(cache, key, project, source_paths, toolchain,
                                             output.name, extra_flags, show, cross)
                    fresh = True
    except OSError as e:
        raise _cache_error(e, cache) from e
    _copy_out(entry, output)
    return BuildResult(output, key, not fresh, time.perf_counter() - start, output.stat().st_size,
                       tuple(tuple(k) for k in entry.record["kernels"]), selection.reason,
                       entry.path / "project", selection.unserved, compiled)


def _cache_error(e: OSError, cache: BuildCache) -> BuildError:
    path = e.filename or cache.root
    return BuildError(f"`opforge build`: build cache {os_error_text(e, path, 'write')}; or "
                      f"point $OPFORGE_CACHE_DIR (cache_root=) at a directory you can write "
                      f"(the cache is now {cache.root.parent})")


def _copy_out(entry: CacheEntry, output: Path) -> None:
    try:
        copy_atomic(entry.library, output)
    except OSError as e:
        if e.filename == str(entry.library):  # removed between verification and copy
            raise BuildError(f"`opforge build`: cached library {entry.library} — vanished while "
                             "being copied (another process evicted it?) — fix: run the build "
                             "again") from e
        raise BuildError(f"`opforge build`: output {os_error_text(e, output, 'write')}") from e


def _opdefs(source) -> list[OpDef]:
    if isinstance(source, (str, os.PathLike)):  # a YAML manifest, ops.py or a module name
        return load_definitions(source, api="opforge build")
    return list(source)


def _sources(sources: Iterable[str | os.PathLike]) -> list[Path]:
    paths = [Path(s).resolve() for s in sources]
    if not paths:
        raise BuildError("`opforge build`: no sources — fix: pass the C++ files defining the "
                         "kernels with --sources a.cpp b.cpp")
    for p in paths:
        problem = regular_file_problem(p, "a C++ source file", "check the path")
        if problem is not None:
            raise BuildError(f"`opforge build`: source {problem}")
    return paths


def _source_digest(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError as e:
        raise BuildError(f"`opforge build`: source {os_error_text(e, path, 'read')}") from e


def _cross_target(target: str | None, flags: Sequence[str], cxx: str | None):
    if target is None:
        return None
    from opforge.native_runtime.targets import find_target

    cross = find_target(target, "opforge build")
    native = [f for f in flags if f.split("=")[-1] == "native"]
    if native or cxx:
        raise BuildError(f"`opforge build --target {target}`: {', '.join(native) or 'cxx'} — "
                         "describes this machine, not the target — valid: the target's own "
                         "compiler and flags naming a CPU (-mcpu=cortex-a76) — fix: drop them")
    return cross


def _cache_key(project: GeneratedProject, sources: list[Path], flags: Sequence[str],
               toolchain: Toolchain, cross=None) -> str:
    """Everything that affects the library's bytes (STYLE.md 10)."""
    from opforge import __version__

    return hash_key({
        "sources": [(str(p), _source_digest(p)) for p in sources],
        "generated": project.files,  # glue (manifest, selection), CMakeLists, header copies
        "headers": sorted(p.name for p in (include_dir() / "opforge").glob("*.h")),
        "flags": list(flags),
        "toolchain": toolchain.identity(),
        "abi": ABI_VERSION,
        "opforge": __version__,
        **({"target": cross.identity()} if cross is not None else {}),
    })


def _status(show: bool, text: str):
    if not show:
        return nullcontext()
    from rich.console import Console

    return Console(stderr=True).status(text)


def _run(command: list[str], cwd: Path) -> tuple[int, str]:
    try:
        proc = subprocess.run(command, cwd=cwd, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, errors="replace")
    except OSError as e:  # not the cache's fault: say which tool could not be started
        raise BuildError(f"`opforge build`: {command[0]} — cannot run it ({e.strerror or e}) "
                         "— valid: an executable cmake and ninja — fix: install them, or put "
                         "them on PATH") from e
    return proc.returncode, proc.stdout


def _work_name(project: GeneratedProject, toolchain: Toolchain, output_name: str,
               flags: Sequence[str], cross=None) -> str:
    """The work area of a library: one per target, output file, toolchain and flags (CMake
    keeps a configured project's compiler and OPFORGE_EXTRA_FLAGS cache entry even when the
    CMakeLists changes, so an area never sees another toolchain or other flags)."""
    digest = hash_key({"target": target_name(project.library), "output": output_name,
                       "toolchain": toolchain.identity(), "cmake": toolchain.cmake,
                       "flags": list(flags), **({"target": cross.name} if cross else {})})
    return f"{target_name(project.library)}-{digest[:12]}"


def _build(cache: BuildCache, key: str, project: GeneratedProject, sources: list[Path],
           toolchain: Toolchain, output_name: str, flags: Sequence[str],
           show: bool, cross=None) -> tuple[CacheEntry, tuple[str, ...]]:
    started = time.time()
    tmp = cache.temp_dir(key)
    try:
        for rel, text in project.files.items():  # the entry's own copy (standalone builds)
            target = tmp / "project" / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
        with cache.work_area(_work_name(project, toolchain, output_name, flags, cross)) as area:
            built, compiled, headers = _compile(area, project, sources, toolchain, output_name,
                                                show, cross)
            if cross is None:  # a cross build's host twin was checked (build_library)
                _check_defined(built, project, area / "build", sources)
            shutil.copy2(built, tmp / output_name)  # the area keeps its own: Ninja relinks
        record = {
            "key": key, "library": project.library, "started": started,
            "seconds": time.time() - started, "size": (tmp / output_name).stat().st_size,
            "kernels": [[e.key, e.dtype_key, e.sig.qualified] for e in project.entries],
            "library_file": output_name,
            "target": cross.name if cross is not None else None,
            "compiled": list(compiled),
            "files": record_files(tmp),  # verified on every cache hit
            "headers": headers,  # re-hashed on every cache hit: a change is a miss
        }
        (tmp / "build.json").write_text(json.dumps(record, indent=1))
        return CacheEntry(cache.commit(key, tmp), record), compiled
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # a failed or interrupted build leaves nothing
        raise


def _compile(area: Path, project: GeneratedProject, sources: list[Path], toolchain: Toolchain,
             output_name: str, show: bool,
             cross=None) -> tuple[Path, tuple[str, ...], dict[str, str]]:
    """Configure (once) and build in the work area; only what changed recompiles. Returns
    the library, the translation units recompiled and ``{user header: SHA-256}`` of the
    headers the sources included."""
    project_dir, build_dir = area / "project", area / "build"
    incremental.sync_project(project_dir, build_dir, project.files)
    incremental.forget_changed_sources(area, build_dir,
                                       {str(p): _source_digest(p) for p in sources})
    incremental.forget_changed_headers(area, build_dir)
    with in_progress(area):
        if not (build_dir / "build.ninja").is_file():
            configure = [toolchain.cmake, "-S", str(project_dir), "-B", str(build_dir), "-G",
                         "Ninja", f"-DCMAKE_MAKE_PROGRAM={toolchain.ninja}",
                         f"-DCMAKE_CXX_COMPILER={toolchain.cxx}"]
            if cross is not None:
                configure.append(f"-DCMAKE_TOOLCHAIN_FILE={cross.toolchain_file}")
            with _status(show, f"[bold]opforge build[/]: configuring {project.library} (cmake)"):
                code, log = _run(configure, area)
            if code != 0:
                shutil.rmtree(build_dir, ignore_errors=True)  # configure again next time
                raise BuildError(f"`opforge build`: cmake could not configure the project — "
                                 f"log:\n{log[-4000:]}\n— fix: check the compiler "
                                 f"({toolchain.cxx})")
        before = incremental.snapshot(build_dir)
        with _status(show, f"[bold]opforge build[/]: compiling {project.library} "
                     f"({len(sources) + 1} file(s), changed ones only)"):
            code, log = _run([toolchain.cmake, "--build", str(build_dir)], area)
        compiled = incremental.compiled(before, incremental.snapshot(build_dir), build_dir,
                                        sources)
    if code != 0:
        raise compile_error(log, sources, project.library)
    built = build_dir / output_name
    if not built.is_file():
        raise BuildError(f"`opforge build`: the build finished but {built} is missing")
    try:
        included = incremental.included_headers(
            build_dir, toolchain.ninja, sources,
            [include_dir(), area, *map(Path, toolchain.system_include_dirs())])
    except OSError as e:
        raise BuildError(f"`opforge build`: the build finished but the headers the sources "
                         f"included are unknown ({e}) — fix: delete {area} and build "
                         "again") from e
    incremental.record_headers(area, included)
    headers = {h: digest for per_source in included.values() for h, digest in per_source.items()}
    return built, compiled, dict(sorted(headers.items()))


def _check_defined(library: Path, project: GeneratedProject, build_dir: Path,
                   sources: list[Path]) -> None:
    """Every kernel the table lists must resolve to a definition in the sources."""
    from opforge.runtime.native import kernel_table

    rows = kernel_table(library)
    missing = [e for e, row in zip(project.entries, rows) if not row.fn]
    if missing:  # this build's objects only: the work area may hold a dropped source's
        objects = sorted(incremental.objects_of(build_dir, [*sources, incremental.GLUE]).values())
        raise undefined_kernels_error(missing, objects, sources)
