"""Smoke test of the public export API (runs first) and its documented surface."""

from __future__ import annotations

import torch

import opforge.export


def test_public_surface_is_what_is_documented():
    assert sorted(opforge.export.__all__) == sorted([
        "export", "MethodSpec", "AtenKernels", "ExportMissingKernelError", "normalize_op_name",
        "run_pipeline", "ExportPass", "PassManager", "plan_arenas", "TensorLifetime", "Allocation",
        "MemoryPlan", "delegation_report",
    ])
    for name in opforge.export.__all__:
        assert getattr(opforge.export, name) is not None


def test_export_a_relu():
    program = opforge.export.export(torch.nn.ReLU(), (torch.randn(2, 3),))
    method = program.method("forward")
    assert [op.key for op in method.operators] == ["aten::relu.out"]
    assert len(method.instructions) == 1 and len(method.inputs) == len(method.outputs) == 1


def test_normalize_op_name():
    for spelled in ("aten::linear", "aten::linear.default", "aten.linear.default"):
        assert opforge.export.normalize_op_name(spelled) == "aten::linear"
    assert opforge.export.normalize_op_name("aten::add.Tensor") == "aten::add.Tensor"
