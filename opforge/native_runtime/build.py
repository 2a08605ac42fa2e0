"""Build the native runtime (libopforge_runtime, libopforge_portable, the tools) with
CMake and Ninja into opforge's build cache, keyed by the hash of every source file, the
toolchain and the options: the first caller builds (under the key's lock, so parallel test
workers build once), later callers get the verified cached folder.

>>> from opforge.native_runtime.build import build_runtime   # doctest: +SKIP
>>> built = build_runtime()                                  # doctest: +SKIP
>>> built.runtime_library.name                               # doctest: +SKIP
'libopforge_runtime.so'
>>> arm = build_runtime(target="aarch64-linux-gnu")          # doctest: +SKIP
>>> print(arm.report.read_text())                            # doctest: +SKIP
target: aarch64-linux-gnu (toolchain file aarch64-linux-gnu.cmake) ...

``target`` cross-compiles (targets.py: the toolchain file, the kernel paths the target takes
instead of x86-64's, written to ``build_report.txt`` beside the libraries).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from opforge.errors import BuildError
from opforge.native.cache import BuildCache, file_sha256, hash_key, record_files
from opforge.native.toolchain import find_toolchain
from opforge.native_runtime.targets import Target, find_target, report_lines

__all__ = ["BuiltRuntime", "build_runtime", "source_dir", "source_files", "work_area_name"]

_HERE = Path(__file__).resolve().parent
_ABI_INCLUDE = _HERE.parent / "native" / "include"
_RECORD_VERSION = 1


def source_dir() -> Path:
    """The CMake project (``opforge/native_runtime``)."""
    return _HERE


def source_files() -> list[Path]:
    """Every file the build reads: the CMake project and the kernel ABI header."""
    files = [p for p in sorted(_HERE.rglob("*"))
             if p.is_file() and p.suffix in (".cpp", ".h", ".in", ".txt", ".c")
             and "__pycache__" not in p.parts]
    files += sorted(p for p in _ABI_INCLUDE.rglob("*.h") if p.is_file())
    return files


@dataclass(frozen=True)
class BuiltRuntime:
    """A finished build: the folder holding the libraries and tools."""

    path: Path
    sanitize: bool
    target: str | None = None  # None: the build machine

    @property
    def runtime_library(self) -> Path:
        return self.path / "libopforge_runtime.so"

    @property
    def static_library(self) -> Path:
        return self.path / "libopforge_runtime.a"

    @property
    def portable_library(self) -> Path:
        return self.path / "libopforge_portable.so"

    @property
    def report(self) -> Path:
        """The build report: the target and the kernel paths it takes (targets.py)."""
        return self.path / "build_report.txt"

    def tool(self, name: str) -> Path:
        """``opforge-run`` or ``opforge-generate``."""
        return self.path / name


def build_runtime(*, sanitize: bool = False, cxx: str | None = None,
                  cache: BuildCache | None = None, target: str | None = None) -> BuiltRuntime:
    """Build (or find in the cache) the native runtime; ``sanitize`` adds ASan + UBSan;
    ``target`` (e.g. ``"aarch64-linux-gnu"``) cross-compiles it."""
    cross = find_target(target, "build_runtime") if target is not None else None
    if cross is not None and (sanitize or cxx):
        raise BuildError("`build_runtime(target=...)`: sanitize or cxx — given with a target — "
                         "valid: the target's own compiler, no sanitizers — fix: drop them")
    toolchain = find_toolchain(cross.compiler() if cross else cxx)
    cache = cache or BuildCache()
    sources = source_files()
    key = "runtime-" + hash_key({
        "record": _RECORD_VERSION, "sanitize": sanitize, "toolchain": toolchain.identity(),
        "sources": {str(p.relative_to(_HERE.parent)): file_sha256(p) for p in sources},
        **({"target": cross.identity()} if cross else {}),
    })
    entry = cache.lookup(key)
    if entry is not None:
        return BuiltRuntime(entry.path, sanitize, target)
    with cache.locked(key):
        entry = cache.lookup(key, evict_invalid=True)
        if entry is not None:
            return BuiltRuntime(entry.path, sanitize, target)
        cache.sweep_stale(key)
        work = cache.temp_dir(key)
        try:
            # one persistent CMake tree per variant and checkout: Ninja rebuilds only what
            # changed (CMake refuses a tree another source folder configured, e.g. a clone's)
            variant = target or ("asan" if sanitize else "release")
            with cache.work_area(work_area_name(variant)) as area:
                finished = _compile(area / "build", work, toolchain, sanitize, cross)
            return BuiltRuntime(cache.commit(key, finished), sanitize, target)
        finally:
            shutil.rmtree(work, ignore_errors=True)


def work_area_name(variant: str, source: Path = _HERE) -> str:
    """The persistent CMake tree of ``variant`` for the runtime sources at ``source``."""
    return f"native-runtime-{variant}-{hash_key({'source': str(source.resolve())})[:10]}"


def _compile(build_dir: Path, work: Path, toolchain, sanitize: bool,
             cross: Target | None) -> Path:
    finished = work / "finished"
    finished.mkdir()
    configure = [toolchain.cmake, "-S", str(_HERE), "-B", str(build_dir), "-G", "Ninja",
                 f"-DCMAKE_MAKE_PROGRAM={toolchain.ninja}", f"-DCMAKE_CXX_COMPILER={toolchain.cxx}",
                 "-DCMAKE_BUILD_TYPE=Release", f"-DOPFORGE_SANITIZE={'ON' if sanitize else 'OFF'}",
                 f"-DOPFORGE_ABI_INCLUDE={_ABI_INCLUDE}"]
    if cross is not None:
        configure.append(f"-DCMAKE_TOOLCHAIN_FILE={cross.toolchain_file}")
    _run(configure, "configure")
    _run([toolchain.cmake, "--build", str(build_dir)], "build")
    for name in ("libopforge_runtime.so", "libopforge_runtime.a", "libopforge_portable.so",
                 "opforge-run", "opforge-generate"):
        built = build_dir / name
        if built.exists():
            shutil.copy2(built, finished / name)
    (finished / "build_report.txt").write_text("\n".join(report_lines(cross)) + "\n")
    record = {"library_file": "libopforge_runtime.so", "files": record_files(finished),
              "headers": {}, "kernels": [], "sanitize": sanitize,
              "target": cross.name if cross else None}
    (finished / "build.json").write_text(json.dumps(record, indent=1))
    return finished


def _run(command: list[str], stage: str) -> None:
    env = dict(os.environ)
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        output = (result.stdout + result.stderr)[-6000:]
        raise BuildError(f"`opforge.native_runtime.build_runtime()`: the native runtime's {stage} "
                         f"failed (exit {result.returncode}) — found:\n{output}\n— fix: this is a "
                         "bug in opforge's runtime sources or a missing compiler; report it")
