"""The native tools as installed commands: ``opforge-run`` and ``opforge-generate``.

# Design
#
# opforge installs from source (an editable checkout or an sdist), and the C++ tools are
# built by CMake into opforge's build cache, not by the Python package build. So the two
# console scripts pip writes (pyproject.toml [project.scripts]) are small launchers: they
# get the tools from ``build_runtime()`` — a cache hit after the first use (it hashes the
# sources), a CMake + Ninja build with a progress line on stderr the first time — and then
# ``os.execv`` the binary with the same arguments. The process becomes the C++ tool: no
# Python stays in it (its exit status, signals and memory are the tool's own).
#
# A cpu-delegated program needs the cpu backend's engine library (and oneDNN). When
# $OPFORGE_CPU_ENGINE is unset, the launcher points it at the engine installed with the
# package if there is one (never compiling it), with oneDNN's folder on LD_LIBRARY_PATH.
#
# ``install_tools(DIR)`` (``opforge native-tools --install-dir DIR``) copies the tools, the
# runtime libraries, the portable kernel library and the C headers into DIR/bin, DIR/lib
# and DIR/include, for machines or scripts that run them without Python at all.
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from opforge.native_runtime.build import BuiltRuntime, build_runtime, source_dir

__all__ = ["TOOLS", "InstalledTools", "built_tools", "install_tools", "run_main", "generate_main"]

TOOLS = ("opforge-run", "opforge-generate")
_HEADERS = (source_dir() / "include" / "opforge" / "runtime.h",
            source_dir().parent / "native" / "include" / "opforge" / "kernel_abi.h")


def built_tools(*, quiet: bool = False) -> BuiltRuntime:
    """The native runtime build holding the tools: from the cache, or built now (a
    progress line on stderr unless ``quiet``; a cache hit shows nothing)."""
    if quiet:
        return build_runtime()
    from rich.console import Console

    console = Console(stderr=True)
    # transient: the line goes away when the build is done (or never shows on a cache hit
    # that takes milliseconds); a non-terminal stderr gets nothing
    with console.status("opforge: building the native runtime's tools (first use only; "
                        "CMake + Ninja into opforge's build cache)…", spinner="dots"):
        return build_runtime()


def _cpu_engine_environment(env: dict[str, str]) -> dict[str, str]:
    """env with OPFORGE_CPU_ENGINE (and oneDNN on LD_LIBRARY_PATH) when the package has
    an installed engine and the caller named none."""
    if env.get("OPFORGE_CPU_ENGINE"):
        return env
    try:
        from opforge.backends.cpu import engine
        path, prefix = engine.installed_library(), engine.onednn_prefix()
    except Exception:  # noqa: BLE001 - no engine: the tool's own message names the fix
        return env
    if path is None or prefix is None:
        return env
    library_path = [str(prefix / "lib")] + [p for p in env.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p]
    return {**env, "OPFORGE_CPU_ENGINE": str(path), "LD_LIBRARY_PATH": os.pathsep.join(library_path)}


def _exec_tool(name: str) -> None:
    from opforge.errors import OpforgeError

    try:
        tool = built_tools().tool(name)
    except OpforgeError as error:
        print(f"{name}: {error}", file=sys.stderr)
        raise SystemExit(1) from None
    if not tool.is_file():
        print(f"{name}: the native runtime built without {tool.name} (at {tool.parent}) — fix: "
              "this is a bug in opforge's build; report it", file=sys.stderr)
        raise SystemExit(1)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(str(tool), [name, *sys.argv[1:]], _cpu_engine_environment(dict(os.environ)))


def run_main() -> None:
    """The ``opforge-run`` console script."""
    _exec_tool("opforge-run")


def generate_main() -> None:
    """The ``opforge-generate`` console script."""
    _exec_tool("opforge-generate")


@dataclass(frozen=True)
class InstalledTools:
    """What ``install_tools`` wrote."""

    path: Path
    files: tuple[Path, ...]

    def tool(self, name: str) -> Path:
        return self.path / "bin" / name


def install_tools(dest: str | os.PathLike, *, quiet: bool = True) -> InstalledTools:
    """Copy the tools (bin/), libopforge_runtime.so and .a and libopforge_portable.so (lib/)
    and the C headers (include/opforge/) into ``dest``: a folder that runs without Python
    (the tools link the runtime statically; they need only the C++ standard library).

    >>> install_tools("/opt/opforge").tool("opforge-run")   # doctest: +SKIP
    PosixPath('/opt/opforge/bin/opforge-run')
    """
    built = built_tools(quiet=quiet)
    root = Path(dest)
    plan = [(built.tool(name), root / "bin" / name) for name in TOOLS]
    plan += [(lib, root / "lib" / lib.name)
             for lib in (built.runtime_library, built.static_library, built.portable_library)]
    plan += [(header, root / "include" / "opforge" / header.name) for header in _HEADERS]
    written = []
    for src, dst in plan:
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = dst.with_name(f".{dst.name}.tmp{os.getpid()}")
        shutil.copy2(src, tmp)  # then rename: a running tool is never overwritten in place
        os.replace(tmp, dst)
        written.append(dst)
    return InstalledTools(root, tuple(written))
