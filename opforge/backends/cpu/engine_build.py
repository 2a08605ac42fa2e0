"""How the cpu backend's engine library is built: its sources, its flags, the name that
says which sources it was built from, and one compile-and-link call (its translation units
compiled side by side by ``run_compiler``, OPFORGE_BUILD_JOBS at once). Standard library only:
``setup.py`` loads this file by path to build the engine when opforge is installed (the
build environment has no numpy), and ``engine.library()`` uses the same sources and flags
for its development fallback (a build on first use, in opforge's build cache).

# Installed, then fallback
#
# A deploy machine has no compiler, so the engine is compiled by the package build
# (``setup.py``'s ``build_ext``, for a wheel, ``pip install .`` and ``pip install -e .``)
# into ``opforge/backends/cpu/_engine/libopforge_cpu.<hash>.so``. ``<hash>`` is
# ``source_hash()``: the SHA-256 of every source and header the engine is compiled from and
# of the flags. ``library()`` computes it from the sources beside it and loads the installed
# library of that name: in an editable checkout whose engine sources changed since the
# last ``pip install -e .``, the installed library has another name, so it is not used
# (a warning says so) and the engine is compiled on first use, as before. The library is
# linked against oneDNN's ``libdnnl.so.3`` with an rpath to the wheel's lib folder of a
# standard environment layout; ``library()`` also loads libdnnl.so.3 from the
# ``onednn-cpu-gomp`` wheel before the engine, so other layouts work too.
#
# We chose a setuptools ``build_ext`` over scikit-build-core: the engine is one compiler
# call with no configure step, the project already builds with setuptools, and the call
# is the same one the development fallback makes (scikit-build-core would add CMake to
# the build requirements and a second description of the same flags).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["ENGINE_NAME", "INSTALL_FOLDER", "EngineBuildError", "source_files", "source_hash",
           "installed_name", "compile_flags", "find_onednn", "build", "compile_into", "install_file",
           "run_compiler"]

ENGINE_NAME = "libopforge_cpu"
INSTALL_FOLDER = "_engine"  # beside this file: opforge/backends/cpu/_engine/
# The flags that decide the result (paths are added by compile_flags and left out of the hash)
FLAGS = ("-std=c++17", "-shared", "-fPIC", "-O3", "-fopenmp", "-Wl,--no-undefined")
# lib/pythonX.Y/site-packages/opforge/backends/cpu/_engine → lib/ (where the oneDNN wheel
# puts libdnnl.so.3)
RPATH = "$ORIGIN/../../../../../.."

_CPU = Path(__file__).resolve().parent

# CPython's own SHA-256 (the same digest): hashlib would load OpenSSL's libcrypto, ~3.4 MB
# resident in every process that runs a cpu delegate, only to hash the sources at load.
try:
    from _sha256 import sha256 as _sha256  # CPython 3.11
except ImportError:
    try:
        from _sha2 import sha256 as _sha256  # CPython 3.12 and later
    except ImportError:
        from hashlib import sha256 as _sha256
_OPFORGE = _CPU.parents[1]


class EngineBuildError(Exception):
    """The engine could not be built here (no compiler, no oneDNN headers, a failed compile)."""


def source_files(cpu_dir: Path = _CPU) -> list[Path]:
    """The engine's sources and every header it may include, in a fixed order."""
    opforge_dir = cpu_dir.parents[1]
    files = sorted((cpu_dir / "native").glob("*.cpp"))
    files += sorted((cpu_dir / "native").glob("*.h"))  # the engine's own headers, beside it
    files += sorted((cpu_dir / "include").rglob("*.h"))
    files += sorted((opforge_dir / "native" / "include").rglob("*.h"))
    return files


_hash_cache: dict[Path, str] = {}


def source_hash(cpu_dir: Path = _CPU) -> str:
    """SHA-256 (hex, first 16 characters) of the engine's sources, headers and flags."""
    cached = _hash_cache.get(cpu_dir)
    if cached is not None:
        return cached
    opforge_dir = cpu_dir.parents[1]
    digest = _sha256()
    digest.update(" ".join(FLAGS).encode() + b"\0")
    for path in source_files(cpu_dir):
        data = path.read_bytes()
        digest.update(f"{path.relative_to(opforge_dir).as_posix()}\0{len(data)}\0".encode())
        digest.update(data)
    _hash_cache[cpu_dir] = value = digest.hexdigest()[:16]
    return value


def installed_name(cpu_dir: Path = _CPU) -> str:
    """The installed engine's file name for the sources in ``cpu_dir``."""
    return f"{ENGINE_NAME}.{source_hash(cpu_dir)}.so"


def find_onednn(*, headers: bool) -> Path | None:
    """The prefix holding ``lib/libdnnl.so.3`` (and ``include/oneapi/dnnl/dnnl.hpp`` when
    ``headers``): ``sys.prefix`` (where the wheels put them in a virtual environment), else
    from the oneDNN wheels' file lists (a user or relocated install)."""
    def holds(prefix: Path) -> bool:
        return (prefix / "lib" / "libdnnl.so.3").exists() and (
            not headers or (prefix / "include" / "oneapi" / "dnnl" / "dnnl.hpp").exists())

    # sys.prefix first: reading the wheels' file lists costs importlib.metadata (email,
    # zipfile, socket: ~2 MB resident) and a parse of each RECORD on every load
    if holds(Path(sys.prefix)):
        return Path(sys.prefix)
    import importlib.metadata as md

    candidates = []
    for dist in ("onednn-devel-cpu-gomp", "onednn-cpu-gomp"):
        try:
            files = md.distribution(dist).files or []
        except md.PackageNotFoundError:
            continue
        for f in files:
            if str(f).endswith("libdnnl.so.3") or str(f).endswith("oneapi/dnnl/dnnl.hpp"):
                path = Path(f.locate()).resolve()
                candidates.append(path.parents[1] if path.name == "libdnnl.so.3" else path.parents[3])
    return next((prefix for prefix in candidates if holds(prefix)), None)


def compile_flags(prefix: Path, *, installed: bool = False) -> list[str]:
    """``FLAGS`` with oneDNN's include and lib folders, the library and the rpath (an
    installed engine's is relative only: the build environment's prefix is temporary)."""
    rpath = RPATH if installed else f"{RPATH}:{prefix / 'lib'}"
    return [*FLAGS, f"-I{prefix / 'include'}", f"-L{prefix / 'lib'}", "-ldnnl",
            f"-Wl,-rpath,{rpath}"]


def include_dirs(cpu_dir: Path = _CPU) -> list[Path]:
    return [cpu_dir / "include", cpu_dir.parents[1] / "native" / "include"]


def find_compiler(cxx: str | None, error: type[Exception]) -> str:
    """The C++ compiler for a package build step: ``cxx``, else ``$CXX``, else the first of
    c++, g++, clang++ on PATH; ``error`` (the caller's build error) when there is none."""
    import shutil

    compiler = cxx or os.environ.get("CXX") or next(
        (c for c in ("c++", "g++", "clang++") if shutil.which(c)), None)
    if compiler is None or shutil.which(compiler) is None:
        raise error(f"no C++ compiler ({compiler or 'c++, g++, clang++'} not on PATH)")
    return compiler


def build(out_dir: Path, *, cpu_dir: Path = _CPU, cxx: str | None = None) -> Path:
    """Compile the engine into ``out_dir/installed_name()`` (written whole, then renamed);
    remove older engines there. ``EngineBuildError`` says what is missing."""
    prefix = find_onednn(headers=True)
    if prefix is None:
        raise EngineBuildError("oneDNN's headers and libdnnl.so.3 were not found (the wheels "
                               "onednn-devel-cpu-gomp==2023.2.0 and onednn-cpu-gomp==2023.2.0)")
    compiler = find_compiler(cxx, EngineBuildError)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    flags = compile_flags(prefix, installed=True)
    link = [f for f in flags if f.startswith(("-l", "-L", "-Wl,"))]
    # the name hashes the sources before the compiler reads them (one call, ~30 translation
    # units over minutes): one saved meanwhile would install a library of other sources, or
    # of a mix of two versions, under the name of these; such a build is not installed but
    # made again (as compile_shared does for the build on first use)
    for _ in range(3):
        _hash_cache.pop(cpu_dir, None)
        name = installed_name(cpu_dir)
        target = out_dir / name
        if target.is_file():  # built from these very sources and flags already
            return target
        sources = [p for p in source_files(cpu_dir) if p.suffix == ".cpp"]

        def unchanged() -> bool:
            _hash_cache.pop(cpu_dir, None)
            return installed_name(cpu_dir) == name

        built = compile_into(target, lambda tmp: [
            compiler, *[f for f in flags if f not in link], *(f"-I{d}" for d in include_dirs(cpu_dir)),
            "-o", tmp, *map(str, sources), *link], EngineBuildError, f"{ENGINE_NAME}.*.so",
            unchanged=unchanged)
        if built is not None:
            return built
    raise EngineBuildError("the engine's sources changed during each of 3 compiles — fix: "
                           "install again once the edits are saved")


def install_file(src: Path, dst: Path) -> None:
    """Copy ``src`` to ``dst`` the way every library here is published: written whole to a
    temporary file beside ``dst`` and renamed over it, so that ``dst`` is always either the
    old file or the new one. setup.py installs the engine, the call extension and the file
    guard into a checkout with this (``pip install -e .``): setuptools' own copy unlinks
    ``dst`` and rewrites it in 16 KiB pieces, and a process loading the engine in that
    window maps a library shorter than its segments: measured with copies of the engine cut
    short, any cut before the end of its last loaded segment ended the process with SIGBUS
    (a cut past it loaded and ran: only the symbol tables were missing)."""
    src, dst = Path(src), Path(dst)
    fd, tmp = tempfile.mkstemp(prefix=f".{dst.name}.", suffix=".tmp", dir=dst.parent)
    os.close(fd)
    try:
        with open(tmp, "wb") as out, open(src, "rb") as inp:
            while True:
                chunk = inp.read(1 << 20)
                if not chunk:
                    break
                out.write(chunk)
        os.chmod(tmp, os.stat(src).st_mode & 0o7777)
        os.replace(tmp, dst)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def compile_into(target: Path, command, error: type[Exception], stale: str, *,
                 unchanged=None) -> Path | None:
    """Run ``command(output path)`` (a compiler call) into ``target``, written whole to a
    temporary file beside it and then renamed; remove the other files matching ``stale``
    there (builds from older sources). A failed compile raises ``error`` with its output;
    when ``unchanged()`` is false after the compile (its sources changed under it), nothing
    is installed and the result is None."""
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    call = command(tmp)
    try:
        proc = run_compiler(call)
        if proc.returncode != 0:
            raise error(f"the compiler failed (exit {proc.returncode}):\n"
                        + "\n".join(proc.stdout.splitlines()[-20:]) + f"\ncommand: {' '.join(call)}")
        if unchanged is not None and not unchanged():
            return None
        os.chmod(tmp, 0o755)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    for old in target.parent.glob(stale):
        if old != target:
            old.unlink()
    return target


SOURCE_SUFFIXES = (".cpp", ".cc", ".cxx", ".c")
_LINK_ONLY = ("-l", "-L", "-Wl,")


def run_compiler(call: list[str]) -> subprocess.CompletedProcess:
    """Run one compile-and-link call (``cxx flags... -o out sources... libraries...``) with
    its translation units compiled side by side: each source ``-c`` into an object in a
    temporary folder beside ``out`` (at most ``build_jobs()`` compilers at once), then one
    link of the objects with the call's flags. The same objects and library as the single
    call (the same flags reach every unit), in a fraction of its time on several cores: the
    engine is ~40 units, one call compiled them one after another (~2.5 minutes on 2 cores).
    A call of one source runs as it is. Returns the failed step's process (its output; the
    other units finish first) or the link's."""
    sources = [a for i, a in enumerate(call) if i and a.endswith(SOURCE_SUFFIXES) and call[i - 1] != "-o"]
    if len(sources) < 2 or "-o" not in call:
        return subprocess.run(call, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              errors="replace")
    from concurrent.futures import ThreadPoolExecutor

    out = call[call.index("-o") + 1]
    flags = [a for i, a in enumerate(call[1:], 1)
             if a not in sources and a != "-o" and call[i - 1] != "-o"]
    link = [a for a in flags if a.startswith(_LINK_ONLY)]
    compile_flags = [a for a in flags if a not in link and a != "-shared"]
    work = tempfile.mkdtemp(prefix=".objects.", dir=os.path.dirname(os.path.abspath(out)))
    try:
        def compile_one(i: int) -> subprocess.CompletedProcess:
            obj = os.path.join(work, f"{i}.o")
            return subprocess.run([call[0], *compile_flags, "-c", sources[i], "-o", obj],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  errors="replace")

        with ThreadPoolExecutor(max_workers=min(build_jobs(), len(sources))) as pool:
            units = list(pool.map(compile_one, range(len(sources))))
        failed = [u for u in units if u.returncode != 0]
        if failed:
            return subprocess.CompletedProcess(
                call, failed[0].returncode, "\n".join(u.stdout for u in failed))
        objects = [os.path.join(work, f"{i}.o") for i in range(len(sources))]
        linked = subprocess.run([call[0], *[a for a in flags if a not in link], "-o", out, *objects, *link],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                errors="replace")
        return subprocess.CompletedProcess(call, linked.returncode,
                                           "".join(u.stdout for u in units) + linked.stdout)
    finally:
        for name in os.listdir(work):
            os.unlink(os.path.join(work, name))
        os.rmdir(work)


def build_jobs() -> int:
    """Compilers run at once: OPFORGE_BUILD_JOBS, else the CPUs this process may use, at
    most 8 (an optimised engine unit takes up to ~1 GB of the compiler's memory)."""
    value = os.environ.get("OPFORGE_BUILD_JOBS", "")
    if value.strip():
        try:
            return max(1, int(value))
        except ValueError:
            raise EngineBuildError(f"OPFORGE_BUILD_JOBS={value!r} is not a number — fix: a "
                                   "positive integer, e.g. 2") from None
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(8, cpus))
