"""Building a bundle folder (``opforge bundle --build``) and measuring what it produced.

    bundle folder → cmake configure (the folder's CMakeLists names a target's toolchain
    file itself) → cmake --build → the app → stripped sizes (the target's own ``strip``)

The folder needs nothing of this module: its README gives the same two cmake commands.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Sequence

from opforge.errors import BuildError
from opforge.native.toolchain import find_toolchain
from opforge.native_runtime.bundle import Bundle
from opforge.native_runtime.targets import find_target

__all__ = ["build_bundle", "stripped_size"]

_API = "`opforge bundle --build`"


def build_bundle(written: Bundle, build_type: str = "MinSizeRel",
                 build_dir: str | Path | None = None, options: Sequence[str] = ()) -> Path:
    """Configure and build ``written`` (default: into ``<folder>/build``) and return the
    app. ``MinSizeRel`` is the size-first build (link-time optimization where the toolchain
    has it); ``Release`` the speed-first one. ``options`` are more ``-D`` settings for the
    configure step (e.g. ``-DOPFORGE_MAX_PAGE_SIZE=4096`` for aarch64, docs/arm.md).

    >>> app = build_bundle(bundle(["model.opf"], "app", target="aarch64-linux-gnu"))  # doctest: +SKIP
    """
    tools = find_toolchain(find_target(written.target).compiler() if written.target else None)
    build = Path(build_dir) if build_dir else written.path / "build"
    configure = [tools.cmake, "-S", str(written.path), "-B", str(build), "-G", "Ninja",
                 f"-DCMAKE_MAKE_PROGRAM={tools.ninja}", f"-DCMAKE_BUILD_TYPE={build_type}",
                 *options]
    if written.target is None:
        configure.append(f"-DCMAKE_CXX_COMPILER={tools.cxx}")
    for stage, command in (("configure", configure), ("build", [tools.cmake, "--build", str(build)])):
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            log = (done.stdout + done.stderr)[-5000:]
            raise BuildError(f"{_API}: {written.path} — the {stage} step failed (exit "
                             f"{done.returncode}) — log:\n{log}\n— fix: check the compiler "
                             f"({tools.cxx}) and the kernel sources named in the log")
    return build / written.app


def stripped_size(path: str | Path, target: str | None = None) -> int:
    """The size in bytes of ``path`` with its symbols stripped (``strip`` of the target's
    binutils; the file itself is left as it is)."""
    strip = find_target(target).tool("strip") if target else shutil.which("strip")
    if strip is None:
        raise BuildError(f"{_API}: no strip program for {target or 'this machine'} — fix: "
                         "install binutils (scripts/setup-cross.sh for a cross target)")
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / Path(path).name
        done = subprocess.run([strip, "-o", str(copy), str(path)], capture_output=True, text=True)
        if done.returncode != 0:
            raise BuildError(f"{_API}: {strip} {path} — failed: {done.stderr.strip()} — fix: "
                             "strip with the binutils of the file's own machine")
        return os.path.getsize(copy)
