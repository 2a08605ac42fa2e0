"""opforge: define a custom PyTorch operator once; build, export and run it.

``import opforge`` never imports PyTorch: the lean runtime must work with NumPy alone.
Names that need PyTorch are resolved lazily on first use.
"""

from __future__ import annotations

from opforge.errors import (
    BuildError,
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

__all__ = [
    "__version__",
    "OpforgeError",
    "SchemaError",
    "ManifestError",
    "RegistrationError",
    "BuildError",
    "ExportError",
    "ProgramError",
    "KernelError",
    "MissingKernelError",
]
