"""What ``opforge bundle`` adds for programs with cpu delegates: the cpu engine library and
oneDNN, copied into the app folder's ``lib/``.

    delegates checked (cpu only, no op-package ops) → the engine this opforge runs
    (``libopforge_cpu.<hash>.so``) → oneDNN's ``libdnnl.so.3`` from the onednn-cpu-gomp
    wheel, its license files → ``lib/`` (+ ``lib/onednn/`` for the licenses)

How the app finds them (templates/CMakeLists.txt.j2, main.c.j2): the app links
``lib/libdnnl.so.3`` itself (``--no-as-needed``, an rpath to ``lib/``), so oneDNN is loaded
at start from the bundle; main.c names the engine with ``opf_backend_set_library``, and
when the runtime dlopen()s it, the engine's own need of ``libdnnl.so.3`` is met by the
library already loaded (the dynamic loader matches it by soname before searching any
path). OpenMP: oneDNN and the engine need ``libgomp.so.1``, GCC's runtime, which the
wheel does not ship (it comes with the compiler, like libstdc++); a wheel that does ship
one beside ``libdnnl.so.3`` has it copied too.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from opforge.errors import BuildError

__all__ = ["CpuLibraries", "check_delegates", "copy_cpu_libraries"]

_API = "`opforge bundle`"
_OPENMP = ("libgomp.so.1", "libiomp5.so")
_LICENSES = ("LICENSE", "THIRD-PARTY-PROGRAMS")


@dataclass(frozen=True)
class CpuLibraries:
    """Paths relative to the bundle folder."""

    engine: str
    onednn: str
    openmp: tuple[str, ...]


def check_delegates(program, path) -> bool:
    """True when ``program`` has delegates the bundle can carry (cpu, without op-package
    ops); False when it has none; ``BuildError`` for any other."""
    if not program.delegates:
        return False
    ids = sorted({d.id for d in program.delegates})
    if ids != ["cpu"]:
        raise BuildError(
            f"{_API}: {path} — holds delegates of backend(s) {', '.join(ids)} — valid: cpu "
            "delegates (the bundle carries the cpu engine and oneDNN) — fix: export with "
            "backends=['cpu'] or without delegation")
    from opforge.backends.cpu import blob as B

    for k, d in enumerate(program.delegates):
        plan, _ = B.parse(program.segments[d.segment].data)
        packages = sorted({op["name"] for op in plan["ops"] if op["kind"] == "package"})
        if packages:
            raise BuildError(
                f"{_API}: {path} — delegates[{k}] runs op-package ops ({', '.join(packages)}), "
                "whose libraries the program names by their path on this machine — valid: cpu "
                "delegates without op packages — fix: run it with opforge-run and "
                "OPFORGE_OP_PACKAGES (or the C API's opf_op_package_trust), or export without "
                "op_packages")
    return True


def copy_cpu_libraries(lib_dir: Path) -> CpuLibraries:
    """Copy the engine, ``libdnnl.so.3`` (and an OpenMP runtime the wheel ships beside it)
    and oneDNN's license files into ``lib_dir``; names relative to its parent."""
    from opforge.backends.cpu import engine
    from opforge.backends.cpu.engine_build import find_onednn

    try:
        engine_path = Path(engine.library()._name)  # builds it into the cache if needed
    except Exception as e:  # noqa: BLE001 - any reason the engine is not here
        raise BuildError(f"{_API}: the cpu engine library — cannot be loaded here ({e}) — valid: "
                         "opforge installed with its cpu extra (oneDNN) — fix: pip install "
                         "'opforge[cpu]'") from None
    prefix = find_onednn(headers=False)
    if prefix is None:
        raise BuildError(f"{_API}: oneDNN's libdnnl.so.3 — not found — valid: the "
                         "onednn-cpu-gomp wheel installed — fix: pip install onednn-cpu-gomp")
    lib_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy2(engine_path, lib_dir / engine_path.name)
    shutil.copy2(prefix / "lib" / "libdnnl.so.3", lib_dir / "libdnnl.so.3")  # the file, not a link
    openmp = []
    for name in _OPENMP:
        if (prefix / "lib" / name).exists():
            shutil.copy2(prefix / "lib" / name, lib_dir / name)
            openmp.append(f"{lib_dir.name}/{name}")
    docs = prefix / "share" / "doc" / "onednn"
    for name in _LICENSES:  # Apache-2.0: the license goes with the binary
        if (docs / name).exists():
            (lib_dir / "onednn").mkdir(exist_ok=True)
            shutil.copy2(docs / name, lib_dir / "onednn" / name)
    return CpuLibraries(f"{lib_dir.name}/{engine_path.name}", f"{lib_dir.name}/libdnnl.so.3",
                        tuple(openmp))
