"""The build stage: native kernels from a manifest, compiled into one shared library.

    manifest → select ops → codegen (glue + CMake project) → cmake/ninja → cache → lib.so

>>> from opforge.build import include_dir, ABI_VERSION
>>> (include_dir() / "opforge" / "kernel_abi.h").is_file(), ABI_VERSION
(True, 1)

Heavy parts (Jinja2, the compiler driver) are imported on first use, so the lean runtime
can read :mod:`opforge.build.abi` without them. Never imports torch.
"""

from __future__ import annotations

from opforge.build.abi import ABI_VERSION, include_dir

__all__ = ["ABI_VERSION", "include_dir", "build_library", "BuildResult", "select_ops",
           "generate_project", "cache_dir"]

_LAZY = {
    "build_library": "opforge.build.driver",
    "BuildResult": "opforge.build.driver",
    "cache_dir": "opforge.build.cache",
    "select_ops": "opforge.build.selection",
    "generate_project": "opforge.build.codegen",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'opforge.build' has no attribute {name!r}")
