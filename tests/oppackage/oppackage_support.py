"""Shared names of the op-package tests (imported as `from oppackage_support import ...`)."""

import shutil
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "opforge" / "examples" / "oppackage" / "ExampleOpPackage"

needs_compiler = pytest.mark.skipif(
    not any(shutil.which(c) for c in ("c++", "g++", "clang++")), reason="needs a C++ compiler")


def example_infos(library, *pairs):
    """OpPackageInfo list registering the example's ops: pairs of (torch op, op type)."""
    from opforge.backends.oppackage import parse_op_package_infos

    pairs = pairs or (("my_ops.mul3.default", "ExampleCustomOp"), ("aten.add.Tensor", "ElementWiseAdd"))
    return parse_op_package_infos([
        {"op_package_name": "ExampleOpPackage", "op_package_path": str(library),
         "custom_op_name": op, "op_type_name": t} for op, t in pairs])
