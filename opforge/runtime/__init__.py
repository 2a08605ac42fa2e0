"""The lean runtime: kernel registry, loader, executor, memory arenas and event tracer.

    load(path, mode="lean") → LoadedProgram → .method("forward") → Method(*inputs) → outputs

NumPy only: nothing here imports torch (``mode="aten"`` imports it lazily, when asked for).

>>> import numpy as np
>>> from opforge.program import (Program, Method, TensorValue, ArenaStorage, ScalarType,
...                              KernelCall, Operator, MemoryPlan)
>>> from opforge.runtime import load
>>> x = TensorValue(ScalarType.FLOAT32, (2,), storage=ArenaStorage(0, 0))
>>> y = TensorValue(ScalarType.FLOAT32, (2,), storage=ArenaStorage(0, 64))
>>> forward = Method("forward", (x, y), (0,), (1,), (KernelCall(0, (0, 1)),),
...                  (Operator("aten::neg", "out"),), MemoryPlan((128,)))
>>> load(Program(methods=(forward,))).method("forward")(np.ones(2, np.float32))[0].tolist()
[-1.0, -1.0]
"""

from __future__ import annotations

from opforge.runtime.capture import Capture, Intermediate, capture_intermediates
from opforge.runtime.loader import MODES, LoadedProgram, dtype_key, load
from opforge.runtime.method import IOSpec, Method
from opforge.runtime.registry import DEFAULT_DTYPE, Kernel, KernelRegistry, registry_from
from opforge.runtime.tracer import OpStats, Tracer

__all__ = [
    "load", "LoadedProgram", "Method", "IOSpec", "MODES", "dtype_key",
    "Kernel", "KernelRegistry", "DEFAULT_DTYPE", "registry_from",
    "Tracer", "OpStats",
    "Capture", "Intermediate", "capture_intermediates",
]
