"""The lean runtime: kernel registry, loader, executor, memory arenas and event tracer.

NumPy only: nothing here imports torch (ATen mode imports it lazily, when asked for).
"""

from __future__ import annotations

from opforge.runtime.registry import DEFAULT_DTYPE, Kernel, KernelRegistry, registry_from

__all__ = ["Kernel", "KernelRegistry", "DEFAULT_DTYPE", "registry_from"]
