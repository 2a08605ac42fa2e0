"""``opforge oppackage build``: a package project → ``libQnn<Package>.so`` for a target.

Only the ``cpu`` target on this machine's platform can be built here: the compiler is the
host's C++ compiler (``opforge.native.toolchain``) and the result goes through opforge's
content-addressed build cache (``opforge.native.cache.BuildCache``), keyed by every source
and header of the project, the ABI header, the flags, the target, the platform and the
compiler's identity: a warm build compiles nothing. The other targets Qualcomm's format
knows are refused with what they would need.

Before compiling, the generated glue (``<Package>Ops.h``, ``<Package>Interface.cpp``) is
rendered again from ``config/<Package>.xml`` into a temporary folder that comes first on the
include path, so an edited OpDef reaches the build (a changed signature then fails to
compile where the op source no longer matches); the project folder is only read.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from opforge.backends.oppackage.model import OpPackage
from opforge.backends.oppackage.platforms import PLATFORMS, TARGETS, host_platform
from opforge.backends.oppackage.skeleton import include_dir, render_glue
from opforge.backends.oppackage.xml_reader import load_opdef_xml
from opforge.errors import BuildError, shown

__all__ = ["TARGETS", "PLATFORMS", "host_platform", "check_target", "build_package",
           "find_opdef", "compile_package"]

FLAGS = ("-std=c++17", "-shared", "-fPIC", "-O2", "-fvisibility=hidden", "-Wl,--no-undefined")
_API = "opforge oppackage build"

_NEEDS = {
    "htp": "Qualcomm's Hexagon SDK (hexagon-clang, HEXAGON_SDK_ROOT) and the QNN SDK's HTP "
           "headers and op-package libraries (QNN_SDK_ROOT), plus a device or simulator with a "
           "Hexagon Tensor Processor to load it",
    "dsp": "Qualcomm's Hexagon SDK (hexagon-clang for the cDSP, HEXAGON_SDK_ROOT) and the QNN "
           "SDK's DSP backend headers (QNN_SDK_ROOT)",
    "gpu": "the QNN SDK's GPU backend headers and an OpenCL toolchain for an Adreno GPU",
    "lpai": "Qualcomm's LPAI toolchain from the QNN SDK",
}
_PLATFORM_NEEDS = {
    "aarch64_android": "the Android NDK (its aarch64-linux-android clang++, ANDROID_NDK_ROOT) "
                       "and an Android device to run it",
    "aarch64": "an aarch64-linux-gnu cross compiler (g++-aarch64-linux-gnu) and an aarch64 machine",
    "x86_64": "an x86_64 machine (or a cross compiler for it)",
}


def check_target(target: str, platform: str | None = None, *, api: str = _API) -> tuple[str, str]:
    """``(target, platform)`` normalised, or a ``BuildError`` saying what would be needed."""
    t = str(target).lower()
    p = (platform or host_platform()).lower()
    if t not in TARGETS:
        raise BuildError(f"`{api}`: --target {shown(target)} — unknown — valid: {', '.join(TARGETS)} "
                         "(only cpu can be built by opforge) — fix: --target cpu")
    if t != "cpu":
        raise BuildError(f"`{api}`: --target {t} — opforge cannot build it on this machine — "
                         f"valid here: cpu — a {t} package needs {_NEEDS[t]}, and its ops written "
                         "against QNN's op-package API (Qualcomm's qnn-op-package-generator makes "
                         "that skeleton from the same XML) — fix: --target cpu to run it in opforge")
    if p not in PLATFORMS:
        raise BuildError(f"`{api}`: --platform {shown(platform)} — unknown — valid: "
                         f"{', '.join(PLATFORMS)} — fix: leave it out for this machine ({host_platform()})")
    if p != host_platform():
        raise BuildError(f"`{api}`: --platform {p} — not this machine's ({host_platform()}); "
                         f"cross-compiling needs {_PLATFORM_NEEDS.get(p, 'a cross compiler')}, which "
                         f"opforge's build does not drive — valid here: {host_platform()} — fix: "
                         "leave --platform out, or build on such a machine")
    return t, p


def find_opdef(project: Path) -> Path:
    """The project's ``config/<Package>.xml`` (exactly one XML file there)."""
    found = sorted((project / "config").glob("*.xml"))
    if len(found) != 1:
        raise BuildError(f"`{_API}`: {project} — {len(found)} XML files in config/ "
                         f"({', '.join(p.name for p in found) or 'none'}) — valid: one OpDef "
                         "file, config/<Package>.xml — fix: is this a folder made by "
                         "`opforge oppackage new`?")
    return found[0]


def _sources(project: Path, package: OpPackage, generated: Path, xml_text: str) -> list[Path]:
    """Render the glue into ``generated``; the sources to compile (the glue and every C++
    file under ``project/src`` but the project's own copy of the glue)."""
    glue = render_glue(package, xml_text)
    for rel, text in glue.items():
        (generated / Path(rel).name).write_text(text, encoding="utf-8")
    missing = [op.name for op in package.ops if not (project / "src" / "ops" / f"{op.name}.cpp").is_file()]
    if missing:
        raise BuildError(f"`{_API}`: {project}: no source for op(s) {', '.join(missing)} — "
                         f"valid: src/ops/<Op>.cpp for every OpDef — fix: write them, or run "
                         f"`opforge oppackage new {project / 'config' / (package.name + '.xml')} "
                         f"-o {project} --force` to add stubs")
    own_glue = {(project / rel).resolve() for rel in glue}
    user = sorted(p for p in (project / "src").rglob("*")
                  if p.suffix in (".cpp", ".cc", ".cxx") and p.resolve() not in own_glue)
    return [generated / f"{package.name}Interface.cpp", *user]


def build_package(project: str | Path, *, target: str = "cpu", platform: str | None = None,
                  output: str | Path | None = None, cache_root: Path | None = None) -> Path:
    """Build the package project ``project`` into ``output`` (default
    ``libQnn<Package>.so`` in the current directory); its path.

    The glue is generated afresh from ``config/<Package>.xml`` into a temporary folder that
    comes first on the include path (the project's own copies, written by ``new``, are for
    a standalone CMake build); the project folder is only read.

    >>> build_package("ExampleOpPackage", target="cpu")     # doctest: +SKIP
    PosixPath('libQnnExampleOpPackage.so')
    """
    import tempfile

    from opforge.native.cache import copy_atomic

    project = Path(project)
    if not project.is_dir():
        raise BuildError(f"`{_API}`: {project} — not a folder — valid: a package project made by "
                         "`opforge oppackage new` — fix: check the path")
    t, p = check_target(target, platform)
    xml_path = find_opdef(project)
    xml_text = xml_path.read_text(encoding="utf-8")
    package = load_opdef_xml(xml_path)
    with tempfile.TemporaryDirectory(prefix="opforge-oppackage-") as tmp:
        generated = Path(tmp)
        sources = _sources(project, package, generated, xml_text)
        library = compile_package(
            sources, package.name,
            include_dirs=[include_dir(), generated, project / "src", project / "include"],
            defines={"OPFORGE_PKG_TARGET": t}, platform=p, cache_root=cache_root,
            roots=[generated, project])
    out = Path(output) if output is not None else Path(f"libQnn{package.name}.so")
    if out.is_dir():
        out = out / f"libQnn{package.name}.so"
    copy_atomic(library, out)
    return out


def compile_package(sources: list[Path], name: str, *, include_dirs: list[Path],
                    defines: dict[str, str] | None = None, platform: str | None = None,
                    cache_root: Path | None = None, roots: list[Path] = ()) -> Path:
    """Compile ``sources`` into ``libQnn<name>.so`` in the build cache; its cached path.

    The key names each source and header by its path relative to the first of ``roots``
    (or of the include dirs) that holds it, so a build from a temporary folder hits the
    cache like one from a fixed place."""
    from opforge.native.shared_library import compile_shared

    bases = [Path(r).resolve() for r in (*roots, *include_dirs)]

    def stable(path: Path) -> str:
        for i, base in enumerate(bases):
            if path.is_relative_to(base):
                return f"{i}:{path.relative_to(base).as_posix()}"
        return str(path)

    paths = [Path(s).resolve() for s in sources]
    headers = []
    for folder in include_dirs:
        for h in sorted(Path(folder).rglob("*")):
            if h.is_file() and h.suffix in (".h", ".hpp", ".hh", ".inc"):
                headers.append((stable(h.resolve()), hashlib.sha256(h.read_bytes()).hexdigest()))
    defines_flags = [f'-D{k}="{v}"' for k, v in sorted((defines or {}).items())]
    return compile_shared(
        paths, name, flags=[*FLAGS, *defines_flags], include_dirs=[Path(d).resolve() for d in include_dirs],
        kind="oppackage", api=_API, cache_root=cache_root, key_path=stable,
        library_name=f"libQnn{name}.so",
        extra={"headers": headers, "platform": platform or host_platform()})
