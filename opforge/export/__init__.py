"""Export: a PyTorch model with custom operators → an ``opforge.program.Program``.

    capture (torch.export) → passes (decompose, check functional, out variants,
    constants, memory plan) → kernel check → emit → verify

>>> import torch
>>> from opforge.export import export
>>> program = export(torch.nn.ReLU(), (torch.randn(2, 3),))
>>> [op.key for op in program.method("forward").operators]
['aten::relu.out']

This package imports torch; the lean runtime never imports it.
"""

from opforge.export.api import export, normalize_op_name
from opforge.export.capture import MethodSpec
from opforge.backends.report import delegation_report
from opforge.export.kernel_sets import AtenKernels, ExportMissingKernelError
from opforge.export.memory_planning import Allocation, MemoryPlan, TensorLifetime, plan_arenas
from opforge.export.pass_manager import ExportPass, PassManager
from opforge.export.pipeline import run_pipeline

__all__ = [
    "delegation_report",
    "export",
    "MethodSpec",
    "AtenKernels",
    "ExportMissingKernelError",
    "normalize_op_name",
    "run_pipeline",
    "ExportPass",
    "PassManager",
    "plan_arenas",
    "TensorLifetime",
    "Allocation",
    "MemoryPlan",
]


# `opforge.export(model, inputs)` is the documented entry point, but `opforge.export` is
# also this package: once it is imported, Python binds the *module* to that attribute.
# Making the module callable keeps both spellings working without a second name.
import sys as _sys
import types as _types


class _CallableModule(_types.ModuleType):
    def __call__(self, *args, **kwargs):
        return export(*args, **kwargs)


_sys.modules[__name__].__class__ = _CallableModule
