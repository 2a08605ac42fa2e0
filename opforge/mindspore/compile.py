"""Compiling MindSpore AOT sources (``func="file.cc:Name"``, vendor packages) into a
shared library, through opforge's content-addressed build cache.

MindSpore compiles such a file with one compiler call (``g++ -std=c++17 --shared -fPIC``
and its include directory); so does opforge, with ``opforge/mindspore/include`` (the
``custom_aot_extra.h`` authors include) on the include path. No CMake project: there is no
generated glue to build, and one call is the whole build. The cache key hashes the
sources' bytes, the header, the flags and the compiler's identity, so a warm call copies
nothing and compiles nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path
from typing import Sequence

from opforge.native.cache import RECORD, BuildCache, hash_key, record_files
from opforge.errors import BuildError

__all__ = ["include_dir", "compile_library"]

FLAGS = ("-std=c++17", "-shared", "-fPIC", "-O2", "-Wl,--no-undefined")


def include_dir() -> Path:
    """The folder holding ``custom_aot_extra.h`` (add it with ``-I`` to build by hand)."""
    return Path(__file__).resolve().parent / "include"


def compile_library(sources: Sequence[str | os.PathLike], name: str, *,
                    flags: Sequence[str] = (), cache_root: Path | None = None,
                    api: str = "opforge.mindspore") -> Path:
    """Compile ``sources`` into ``lib<name>.so`` in the build cache; its path.

    >>> compile_library(["add_custom.cc"], "add_custom")      # doctest: +SKIP
    PosixPath('~/.cache/opforge/native/libs/3f.../libadd_custom.so')
    """
    from opforge import __version__
    from opforge.native.toolchain import find_toolchain

    paths = [Path(s).resolve() for s in sources]
    digests = []
    for p in paths:
        try:
            digests.append((str(p), hashlib.sha256(p.read_bytes()).hexdigest()))
        except OSError as e:
            raise BuildError(f"`{api}`: source {str(p)!r} — cannot be read ({e.strerror or e}) "
                             "— valid: an existing .cc/.cpp file — fix: check the path") from None
    toolchain = find_toolchain()
    header = (include_dir() / "custom_aot_extra.h").read_bytes()
    command_flags = [*FLAGS, f"-I{include_dir()}", *flags]
    key = hash_key({"sources": digests, "header": header, "flags": command_flags,
                    "toolchain": toolchain.identity(), "opforge": __version__,
                    "kind": "mindspore-aot", "name": name})
    cache = BuildCache(cache_root)
    library_name = f"lib{name}.so"
    found = cache.lookup(key)
    if found is not None:
        return found.library
    with cache.locked(key):
        found = cache.lookup(key, evict_invalid=True)  # a corrupt entry is rebuilt
        if found is not None:
            return found.library
        cache.sweep_stale(key)
        work = cache.temp_dir(key)
        command = [toolchain.cxx, *command_flags, "-o", str(work / library_name),
                   *map(str, paths)]
        proc = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, errors="replace")
        if proc.returncode != 0:
            errors = [line for line in proc.stdout.splitlines() if ": error:" in line]
            shown = "\n".join(errors[:20] or proc.stdout.splitlines()[-20:])
            raise BuildError(f"`{api}`: compiling {', '.join(p.name for p in paths)} — the "
                             f"compiler failed (exit {proc.returncode}):\n{shown}\n— command: "
                             f"{' '.join(command)} — fix: correct the errors above")
        (work / "build.log").write_text(proc.stdout)
        headers = _user_headers(toolchain, command_flags, paths)
        record = {"library_file": library_name, "files": record_files(work), "kernels": [],
                  "command": command, "headers": headers}
        (work / RECORD).write_text(json.dumps(record))
        return cache.commit(key, work) / library_name


def _user_headers(toolchain, flags: list[str], sources: list[Path]) -> dict[str, str]:
    """``{user header: SHA-256}`` the sources include (the compiler's ``-M`` rules, without
    the sources, opforge's header folder and the compiler's system directories): the cache
    re-hashes them on every hit, so editing one rebuilds the library."""
    skip = {os.path.normpath(str(s)) for s in sources}
    roots = [os.path.normpath(str(d)) + os.sep
             for d in (include_dir(), *toolchain.system_include_dirs())]
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
