"""The AddCustom example of MindSpore's AOT custom operators, on opforge.

``AddCustom`` (``mindspore/add_custom.cc``): ``z = x + y``, two inputs and one output,
MindSpore's C signature unchanged. Two ways to infer its output:

* Python: ``add_custom_python()`` passes ``out_shape=add_custom_shape`` and
  ``out_dtype=add_custom_dtype`` (module-level, so a program's runtime can import them);
* C++: ``add_custom_cpp()`` leaves both ``None``; ``AddCustomInferShape`` and
  ``AddCustomInferType`` in the same file are used.

``AddModel`` uses the op between ordinary layers; ``docs/mindspore.md`` walks through
exporting it and running it on the lean runtime, and building ``mindspore/op_host`` +
``mindspore/op_kernel`` into a vendor package with ``opforge msop build``.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["SOURCE", "OP_HOST", "OP_KERNEL", "reg_info", "add_custom_shape", "add_custom_dtype",
           "add_custom_python", "add_custom_cpp", "AddModel", "example_inputs", "add_reference"]

HERE = Path(__file__).resolve().parent / "mindspore"
SOURCE = HERE / "add_custom.cc"
OP_HOST = HERE / "op_host"
OP_KERNEL = HERE / "op_kernel"


def reg_info() -> dict:
    from opforge.mindspore import CustomRegOp, DataType

    return (CustomRegOp("AddCustom").input(0, "x").input(1, "y").output(0, "z")
            .dtype_format(DataType.F32_Default, DataType.F32_Default, DataType.F32_Default)
            .dtype_format(DataType.F64_Default, DataType.F64_Default, DataType.F64_Default)
            .target("CPU").get_op_info())


def add_custom_shape(x, y):
    """MindSpore's out_shape: the inputs' shapes (lists) → z's shape."""
    return x


def add_custom_dtype(x, y):
    """MindSpore's out_dtype: the inputs' dtypes → z's dtype."""
    return x


def add_custom_python(**kw):
    """AddCustom with Python inference (compiles add_custom.cc through the build cache)."""
    from opforge.mindspore import Custom

    return Custom(f"{SOURCE}:AddCustom", out_shape=add_custom_shape, out_dtype=add_custom_dtype,
                  func_type="aot", reg_info=reg_info(), **kw)


def add_custom_cpp(**kw):
    """AddCustom with C++ inference (AddCustomInferShape / AddCustomInferType)."""
    from opforge.mindspore import Custom

    return Custom(f"{SOURCE}:AddCustom", out_shape=None, out_dtype=None, func_type="aot",
                  reg_info=reg_info(), **kw)


def AddModel(op):
    """A small model using ``op`` (a ``Custom``) between ordinary layers."""
    import torch

    class _AddModel(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(4, 4)

        def forward(self, x, y):
            return torch.relu(op(self.linear(x), y)) * 2

    torch.manual_seed(0)
    return _AddModel().eval()


def example_inputs():
    import torch

    return torch.randn(3, 4), torch.randn(3, 4)


def add_reference(x, y):
    """What AddCustom computes, in PyTorch: the reference `opforge msop check` compares with."""
    return x + y
