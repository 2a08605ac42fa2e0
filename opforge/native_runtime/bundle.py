"""``opforge bundle``: what an app needs to run programs with the native runtime.

    programs → the operator keys they call → the kernels that serve them (portable rows,
    native libraries, custom kernel sources compiled for the target) → a copy of the
    runtime's sources with only those kernel rows → cpu delegates: the engine and oneDNN in
    lib/ (bundle_cpu.py) → CMakeLists.txt + main.c + README.md + build_report.txt

The output builds with CMake alone: no Python in the build or in the process. With a
``target`` (targets.py, e.g. ``aarch64-linux-gnu``) the CMakeLists names the target's
toolchain file, so the same two cmake commands cross-compile the app (docs/arm.md).

# Selective build
#
# ExecuTorch selects kernels with a YAML list fed to its codegen. Here every portable
# kernel family is one C++ file ending in a table of rows ``{"aten::add.out", "T T S T!",
# fn}``; the bundle's copy of each family keeps only the rows of the keys its programs
# call (a family with none is left out), so the compiler never emits the others (they are
# static functions nobody references) and `--gc-sections` drops whatever is left. The
# rows are found by a pattern, and the keys found must be exactly the keys the built
# portable library registers: a row the pattern missed is an error here, not a kernel
# silently missing from an app.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import jinja2

from opforge.errors import BuildError, ProgramError
from opforge.native_runtime.build import source_dir
from opforge.native_runtime.bundle_cpu import CpuLibraries, check_delegates, copy_cpu_libraries
from opforge.native_runtime.targets import find_target, report_lines

__all__ = ["Bundle", "KernelSources", "bundle", "family_rows"]

# one table row: {"ns::op.overload", "kinds", function}, possibly over several lines
_ROW = re.compile(r'\{\s*"(?P<key>[A-Za-z_][A-Za-z0-9_]*::[A-Za-z0-9_.]+)"\s*,\s*"[^"\n]*"\s*,'
                  r'[^{};"]*\}\s*,?')
_API = "`opforge bundle`"
_SOURCE_PARTS = ("CMakeLists.txt", "include", "src", "kernels", "cmake")


@dataclass(frozen=True)
class Bundle:
    """What ``bundle`` wrote: the folder, the app's name and the kernel keys it selected."""

    path: Path
    app: str
    programs: tuple[str, ...]
    selected: tuple[str, ...]
    libraries: tuple[str, ...]
    cpu: CpuLibraries | None = None  # the engine and oneDNN, for programs with cpu delegates
    target: str | None = None  # None: the build machine

    @property
    def report(self) -> Path:
        """The build report: the target and the kernel paths it takes (targets.py)."""
        return self.path / "build_report.txt"


@dataclass(frozen=True)
class KernelSources:
    """A custom kernel library the bundle compiles for its target: what ``opforge build``
    takes (a YAML manifest, an ops.py or a module name, and the C++ sources, manifest-style
    or ExecuTorch-style); only the ops the programs call are built."""

    manifest: str | Path
    sources: tuple[str | Path, ...]


def family_rows(path: Path) -> list[tuple[tuple[int, int], str]]:
    """``((start, end), key)``: the character span and key of each kernel row in a family
    source file."""
    return [(m.span(), m.group("key")) for m in _ROW.finditer(path.read_text())]


def bundle(programs: Sequence[str | Path], out_dir: str | Path, *,
           kernels: Iterable[str | Path] = (), method: str = "forward",
           app: str = "opforge_app", portable_keys: Iterable[str] | None = None,
           kernel_sources: Iterable[KernelSources] = (), target: str | None = None) -> Bundle:
    """Write a self-contained app folder for ``programs`` into ``out_dir``.

    ``kernels`` are native kernel libraries (``opforge build`` outputs) for the operators
    the portable kernels do not serve; they are copied into ``kernels/`` and loaded by the
    app. ``portable_keys`` is the set of keys the built portable library registers (the
    check that every kernel row was found); default: build the runtime and ask it.
    ``kernel_sources`` are compiled here (``opforge build``, cached) into ``kernels/``;
    ``target`` cross-compiles them and makes the app's CMakeLists cross-compile the rest
    (prebuilt ``kernels`` are for this machine and refused with a target).

    >>> bundle(["model.opf"], "app")                          # doctest: +SKIP
    Bundle(path=PosixPath('app'), app='opforge_app', ...)
    >>> bundle(["model.opf"], "app-arm", target="aarch64-linux-gnu",   # doctest: +SKIP
    ...        kernel_sources=[KernelSources("my_ops.yaml", ("mul.cpp",))])
    """
    if not programs:
        raise BuildError(f"{_API}: no program given — valid: one or more .opf files — "
                         "fix: name the program files to bundle")
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        raise BuildError(f"{_API}: {out} — exists and is not empty — valid: a new or empty "
                         "folder — fix: remove it or choose another -o")
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]*", app):
        raise BuildError(f"{_API}: app name {app!r} — valid: letters, digits, '_' and '-' — "
                         "fix: choose another --app")
    cross = find_target(target, "opforge bundle") if target is not None else None
    kernels, kernel_sources = list(kernels), list(kernel_sources)
    if cross is not None and kernels:
        raise BuildError(f"{_API}: --kernels {', '.join(map(str, kernels))} — libraries built for "
                         f"this machine — valid with --target {target}: kernel sources the "
                         "bundle compiles for it — fix: pass each library's manifest and sources "
                         "with --kernel-sources MANIFEST SOURCE[,SOURCE...]")
    needed, delegated = _operator_keys(programs, method)
    if delegated and cross is not None:
        raise BuildError(
            f"{_API}: --target {target} — the programs hold cpu delegates, whose engine and "
            "oneDNN are built for this machine — valid: programs without delegates — fix: export "
            f"for this target with `opforge export --backend cpu --target {target}` "
            "(CpuBackend(target=...)): the cpu backend then delegates nothing and says why "
            "(docs/backend-cpu.md#aarch64)")
    library_keys = {Path(lib): _library_keys(Path(lib)) for lib in kernels}
    staging = Path(tempfile.mkdtemp(prefix="opforge-bundle-"))
    try:
        library_keys.update(_build_kernel_sources(kernel_sources, programs, target, staging))
        return _write(programs, out, method, app, portable_keys, library_keys, delegated, needed,
                      cross)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _build_kernel_sources(specs: list[KernelSources], programs: Sequence[str | Path],
                          target: str | None, staging: Path) -> dict[Path, set[str]]:
    """Compile each custom kernel library (the programs' ops only) into ``staging``; its
    kernel keys from the build (a library for another machine cannot be asked)."""
    from opforge.native import build_library

    built: dict[Path, set[str]] = {}
    for spec in specs:
        name = f"lib{re.sub(r'[^A-Za-z0-9_]', '_', Path(str(spec.manifest)).stem)}.so"
        if staging / name in built:
            raise BuildError(f"{_API}: --kernel-sources {spec.manifest} — a second library named "
                             f"{name} — valid: manifests with different names — fix: rename one")
        result = build_library(spec.manifest, spec.sources, staging / name, programs=programs,
                               target=target, progress=False)
        built[staging / name] = {key for key, _, _ in result.kernels}
    return built


def _write(programs, out: Path, method: str, app: str, portable_keys, library_keys, delegated,
           needed, cross) -> Bundle:
    families = sorted((source_dir() / "kernels" / "ops").glob("*.cpp"))
    rows = {f: family_rows(f) for f in families}
    found = {key for f in families for _, key in rows[f]}
    known = set(portable_keys) if portable_keys is not None else _built_portable_keys()
    if found != known:
        raise BuildError(
            f"{_API}: the kernel rows found in kernels/ops/*.cpp differ from the keys the "
            f"portable library registers — only in the sources: {sorted(found - known)[:8]}; "
            f"only in the library: {sorted(known - found)[:8]} — fix: this is a bug in "
            "opforge (a kernel row written across lines?); report it")
    served_by_library = set().union(*library_keys.values()) if library_keys else set()
    missing = sorted(k for k in needed if k not in found and k not in served_by_library)
    if missing:
        raise BuildError(
            f"{_API}: {len(missing)} operator(s) without a kernel — " + "; ".join(missing)
            + " — fix: 1. build the custom operators' kernels with `opforge build` and pass the "
            "library with --kernels (or its sources with --kernel-sources); 2. export with kernels "
            "the portable library has")
    # a native library's kernel wins at load (override), so its keys need no portable row
    selected = sorted(k for k in needed if k in found and k not in served_by_library)

    out.mkdir(parents=True, exist_ok=True)
    _write_runtime(out / "runtime", rows, set(selected))
    (out / "programs").mkdir()
    program_names = []
    for p in programs:
        shutil.copy2(p, out / "programs" / Path(p).name)
        program_names.append(f"programs/{Path(p).name}")
    library_names = []
    if library_keys:
        (out / "kernels").mkdir()
        for lib in library_keys:
            shutil.copy2(lib, out / "kernels" / lib.name)
            library_names.append(f"kernels/{lib.name}")
    cpu = copy_cpu_libraries(out / "lib") if delegated else None
    (out / "selected_kernels.txt").write_text("".join(k + "\n" for k in selected))
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(source_dir() / "templates"),
                             keep_trailing_newline=True, undefined=jinja2.StrictUndefined)
    report = report_lines(cross)
    (out / "build_report.txt").write_text("\n".join(report) + "\n")
    context = dict(app=app, program=program_names[0], programs=program_names, method=method,
                   libraries=library_names, cpu_backend=cpu is not None, cpu=cpu,
                   target=cross.name if cross else None, report=report)
    (out / "main.c").write_text(env.get_template("main.c.j2").render(context))
    (out / "CMakeLists.txt").write_text(env.get_template("CMakeLists.txt.j2").render(context))
    (out / "README.md").write_text(env.get_template("README.md.j2").render(
        context, selected=selected))
    return Bundle(out, app, tuple(program_names), tuple(selected), tuple(library_names), cpu,
                  cross.name if cross else None)


def _operator_keys(programs: Sequence[str | Path], method: str) -> tuple[set[str], bool]:
    """The operator keys the programs call, and whether any has cpu delegates."""
    from opforge.program import load

    keys: set[str] = set()
    delegated = False
    for path in programs:
        program = load(path)
        delegated = check_delegates(program, path) or delegated
        if method not in [m.name for m in program.methods]:
            raise ProgramError(f"{_API}: {path} — has no method {method!r} — valid: "
                               f"{', '.join(m.name for m in program.methods)} — fix: pass --method")
        for m in program.methods:
            keys.update(op.key for op in m.operators)
    return keys, delegated


def _library_keys(path: Path) -> set[str]:
    from opforge.runtime.native import NativeLibrary

    return set(NativeLibrary(path).keys())


def _built_portable_keys() -> set[str]:
    from opforge.native_runtime.build import build_runtime
    from opforge.runtime.native import NativeLibrary

    return set(NativeLibrary(build_runtime().portable_library).keys())


def _write_runtime(dst: Path, rows: dict[Path, list[tuple[tuple[int, int], str]]],
                   selected: set[str]) -> None:
    src = source_dir()
    dst.mkdir()
    for part in _SOURCE_PARTS:
        if (src / part).is_dir():
            shutil.copytree(src / part, dst / part,
                            ignore=shutil.ignore_patterns("ops", "__pycache__"))
        else:
            shutil.copy2(src / part, dst / part)
    abi = src.parent / "native" / "include" / "opforge" / "kernel_abi.h"
    (dst / "abi" / "opforge").mkdir(parents=True)
    shutil.copy2(abi, dst / "abi" / "opforge" / "kernel_abi.h")
    (dst / "kernels" / "ops").mkdir(parents=True)
    for family, family_rows_ in rows.items():
        if not any(key in selected for _, key in family_rows_):
            continue  # nothing of this family is called: leave the file out
        text = family.read_text()
        for (start, end), key in reversed(family_rows_):  # from the end: spans stay valid
            if key not in selected:
                text = text[:start] + f"/* not selected: {key} */" + text[end:]
        (dst / "kernels" / "ops" / family.name).write_text(text)
