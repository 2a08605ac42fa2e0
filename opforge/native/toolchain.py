"""Finding the tools a build runs: CMake, Ninja (from PyPI) and the C++ compiler.

``cmake`` and ``ninja`` are dependencies of opforge (their PyPI wheels ship the
executables): they are looked up through those packages' own helpers, then next to the
running interpreter (``sys.prefix/bin``), then on ``PATH``. The compiler is ``$CXX``, else
``c++``/``g++``/``clang++`` on ``PATH``; its path and ``--version`` are part of the cache key.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from opforge.errors import BuildError

__all__ = ["Toolchain", "find_toolchain"]


@dataclass(frozen=True)
class Toolchain:
    cmake: str
    ninja: str
    cxx: str
    cxx_version: str  # first line of `cxx --version`

    def identity(self) -> dict:
        """What of the toolchain affects the output (for the cache key)."""
        return {"cxx": self.cxx, "cxx_version": self.cxx_version}

    def system_include_dirs(self) -> tuple[str, ...]:
        """The compiler's own ``#include <...>`` search directories (``-E -v``; ``/usr``
        if it does not say): headers under them are the system's, not the user's."""
        return _system_include_dirs(self.cxx)


def _from_package(module: str, attr: str, exe: str) -> str | None:
    try:
        mod = __import__(module)
    except ImportError:
        return None
    folder = getattr(mod, attr, None)
    if folder:
        candidate = Path(folder) / exe
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def _find(exe: str, module: str, attr: str) -> str:
    found = (_from_package(module, attr, exe)
             or next((str(p) for p in [Path(sys.prefix) / "bin" / exe]
                      if p.is_file() and os.access(p, os.X_OK)), None)
             or shutil.which(exe))
    if found is None:
        raise BuildError(f"`opforge build`: no `{exe}` executable — opforge builds with CMake "
                         f"and Ninja from PyPI — fix: `pip install {exe}` in this environment")
    return found


@functools.lru_cache(maxsize=8)
def _compiler_version(cxx: str) -> str:
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise BuildError(f"`opforge build`: C++ compiler {cxx!r} does not run ({e}) — fix: "
                         "install g++ or clang++, or point $CXX at one") from None
    return (out.stdout or out.stderr).splitlines()[0] if (out.stdout or out.stderr) else ""


@functools.lru_cache(maxsize=8)
def _system_include_dirs(cxx: str) -> tuple[str, ...]:
    try:
        out = subprocess.run([cxx, "-x", "c++", "-E", "-v", "-"], input="", capture_output=True,
                             text=True, errors="replace", timeout=30).stderr
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    dirs, inside = [], False
    for line in out.splitlines():
        if line.startswith("#include <...> search starts here"):
            inside = True
        elif line.startswith("End of search list"):
            inside = False
        elif inside and line.strip():
            dirs.append(os.path.normpath(line.strip().removesuffix(" (framework directory)")))
    return tuple(dict.fromkeys(dirs)) or ("/usr",)


def find_toolchain(cxx: str | None = None) -> Toolchain:
    """Locate cmake, ninja and the C++ compiler (``cxx``, ``$CXX``, then PATH)."""
    compiler = cxx or os.environ.get("CXX")
    if compiler:
        resolved = shutil.which(compiler)
    else:
        resolved = next((shutil.which(c) for c in ("c++", "g++", "clang++") if shutil.which(c)), None)
    if resolved is None:
        raise BuildError(f"`opforge build`: no C++ compiler found ({compiler or 'c++, g++, clang++'} "
                         "not on PATH) — fix: install g++ (`apt-get install g++`) or set $CXX")
    resolved = os.path.realpath(resolved)
    return Toolchain(_find("cmake", "cmake", "CMAKE_BIN_DIR"), _find("ninja", "ninja", "BIN_DIR"),
                     resolved, _compiler_version(resolved))
