"""The cpu backend's call path without ctypes: ``pycall/fastcall.cpp``, a CPython extension
that runs one delegate call on a method's inputs with no Python per argument (its header
says what it checks). A small model's call was ~2 µs of Python and ctypes around ~2 µs of
engine work; this path makes it ~0.5 µs.

It is optional: the runtime's ctypes path does the same work (``binding.Binding``) and is
what runs when this module cannot be built or loaded, when ``OPFORGE_CPU_FASTCALL=0``, or
for inputs the extension does not take. ``problem()`` says why it is not in use, and the
engine's profile (``OPFORGE_CPU_PROFILE=1``) prints which path calls it.

Built like the engine: by the package build (``setup.py``) into ``_engine/`` under a name
that says which source, Python and NumPy it was built for, else on first use into opforge's
build cache. Standard library only at import: ``setup.py`` loads this file by path.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import threading
from pathlib import Path

__all__ = ["module", "problem", "build", "installed_name", "DISABLE_ENV"]

DISABLE_ENV = "OPFORGE_CPU_FASTCALL"  # =0: the ctypes path only
MODULE = "opforge.backends.cpu._fastcall"
FLAGS = ("-std=c++17", "-shared", "-fPIC", "-O2", "-fvisibility=hidden")
_CPU = Path(__file__).resolve().parent
SOURCE = _CPU / "pycall" / "fastcall.cpp"

_lock = threading.Lock()
_state: dict = {}  # "module" and "problem" once decided


class FastcallBuildError(Exception):
    """The extension could not be built here (no Python headers, no compiler, a failed compile)."""


def _numpy_major(version: str) -> str:
    return version.split(".", 1)[0]


def installed_name(numpy_version: str) -> str:
    """The file name of the extension built from ``SOURCE`` with ``FLAGS`` for this Python
    and NumPy's major version ``numpy_version`` (its C API differs between majors)."""
    try:
        from _sha256 import sha256
    except ImportError:
        from hashlib import sha256
    digest = sha256(SOURCE.read_bytes() + " ".join(FLAGS).encode()
                    + f"\0numpy{_numpy_major(numpy_version)}".encode())
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    return f"_fastcall.{digest.hexdigest()[:16]}{suffix}"


def _include_dirs(numpy_include: str) -> list[str]:
    python = sysconfig.get_paths()["include"]
    if not (Path(python) / "Python.h").is_file():
        raise FastcallBuildError(f"Python's headers are not installed (no {python}/Python.h; "
                                 "e.g. the python3-dev package)")
    return [python, numpy_include]


def build(out_dir: Path, numpy_include: str, numpy_version: str, cxx: str | None = None) -> Path:
    """Compile the extension into ``out_dir/installed_name(numpy_version)`` (written whole,
    then renamed) and remove older builds there; the package build's step."""
    includes = _include_dirs(numpy_include)
    compiler = _engine_build().find_compiler(cxx, FastcallBuildError)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / installed_name(numpy_version)
    if target.is_file():
        return target
    return _engine_build().compile_into(
        target, lambda tmp: [compiler, *FLAGS, *(f"-I{d}" for d in includes), "-o", tmp, str(SOURCE)],
        FastcallBuildError, "_fastcall.*")


def _engine_build():
    """engine_build.py beside this file, loaded by path as ``setup.py`` loads both (the
    package build's environment cannot import opforge)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_opforge_engine_build", _CPU / "engine_build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _compile_on_first_use() -> Path:
    """The development fallback: the extension built into opforge's build cache (once).
    Headers and a compiler are looked for first: a deploy machine without them imports
    no toolchain code to find that out."""
    import shutil

    import numpy as np

    includes = _include_dirs(np.get_include())
    if not any(shutil.which(c) for c in (os.environ.get("CXX") or "c++", "g++", "clang++")):
        raise FastcallBuildError("no C++ compiler (c++, g++, clang++ not on PATH)")
    from opforge.native.shared_library import compile_shared

    return compile_shared([SOURCE], "fastcall", flags=list(FLAGS), include_dirs=[Path(d) for d in includes],
                          kind="cpu-backend-fastcall", api="opforge cpu backend",
                          extra={"python": sys.version, "numpy": _numpy_major(np.__version__)},
                          library_name="_fastcall.so")


def _load(path: Path):
    import importlib.util

    spec = importlib.util.spec_from_file_location(MODULE, path)
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return loaded


def _decide():
    import numpy as np

    from opforge.backends.cpu import engine

    installed = engine.INSTALL_DIR / installed_name(np.__version__)  # beside the engine
    try:
        path = installed if installed.is_file() else _compile_on_first_use()
        return _load(path), None
    except Exception as e:  # noqa: BLE001 - any failure leaves the ctypes path, said by problem()
        return None, f"{type(e).__name__}: {e}"


def module():
    """The loaded extension, or None (``problem()`` says why). Built or loaded once per
    process; ``OPFORGE_CPU_FASTCALL=0`` is read per call (engines bound meanwhile keep theirs)."""
    if os.environ.get(DISABLE_ENV) == "0":
        return None
    if "module" not in _state:
        with _lock:
            if "module" not in _state:
                _state["module"], _state["problem"] = _decide()
    return _state["module"]


def problem() -> str | None:
    """Why the extension is not in use, or None when it is."""
    if os.environ.get(DISABLE_ENV) == "0":
        return f"disabled by {DISABLE_ENV}=0"
    module()
    return _state["problem"]
