"""opforge: define a custom PyTorch operator once; build, export and run it.

``import opforge`` never imports PyTorch: the lean runtime must work with NumPy alone.
Names that need PyTorch are resolved lazily on first use.
"""

from __future__ import annotations

from opforge.errors import (
    BuildError,
    ConcurrentCallError,
    ExportError,
    KernelError,
    ManifestError,
    MissingKernelError,
    OpforgeError,
    ProgramError,
    RegistrationError,
    SchemaError,
)

__version__ = "0.1.0"

# Public names that live in subpackages, imported on first use (see __getattr__).
_LAZY = {
    "op": ("opforge.manifest", "op"),
    "OpDef": ("opforge.manifest", "OpDef"),
    "load_manifest": ("opforge.manifest", "load_manifest"),
    "FunctionSchema": ("opforge.schema", "FunctionSchema"),
    "register": ("opforge.torch_bridge", "register"),
    "export": ("opforge", "export"),  # the (callable) subpackage; see opforge/export/__init__.py
}

__all__ = [
    "__version__",
    "op",
    "OpDef",
    "load_manifest",
    "FunctionSchema",
    "register",
    "export",
    "OpforgeError",
    "SchemaError",
    "ManifestError",
    "RegistrationError",
    "BuildError",
    "ExportError",
    "ProgramError",
    "KernelError",
    "MissingKernelError",
    "ConcurrentCallError",
]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        if module == "opforge":  # a subpackage: importing it binds the attribute
            return importlib.import_module(f"opforge.{attr}")
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'opforge' has no attribute {name!r}")
