"""The build stage: native kernels from a manifest, compiled into one shared library.

    manifest → select ops → codegen (glue + CMake project) → cmake/ninja → cache → lib.so

>>> from opforge.native import include_dir, ABI_VERSION
>>> (include_dir() / "opforge" / "kernel_abi.h").is_file(), ABI_VERSION
(True, 1)

Heavy parts (Jinja2, the compiler driver) are imported on first use, so the lean runtime
can read :mod:`opforge.native.abi` without them. Never imports torch.
"""

from __future__ import annotations

from opforge.native.abi import ABI_VERSION, include_dir

__all__ = ["ABI_VERSION", "include_dir", "build_library", "BuildResult", "select_ops",
           "generate_project", "cache_dir"]

_LAZY = {
    "build_library": "opforge.native.driver",
    "BuildResult": "opforge.native.driver",
    "cache_dir": "opforge.native.cache",
    "select_ops": "opforge.native.selection",
    "generate_project": "opforge.native.codegen",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'opforge.native' has no attribute {name!r}")
