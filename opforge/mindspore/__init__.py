"""MindSpore-style AOT custom operators on opforge (``docs/mindspore.md``).

    CustomRegOp, DataType        registration info, as MindSpore writes it (no torch)
    Custom                       define an op: "lib.so:Name", "file.cc:Name", a vendor op's
                                 name, or a Python function (func_type="pyfunc"); imports torch
    write_package, read_package  vendor packages (op_info.json + libraries)
    register_vendor_ops          the lean runtime's registrar: every op on the search path
                                 (OPFORGE_CUSTOM_OPP_PATH, then ASCEND_CUSTOM_OPP_PATH)

Only ``Custom`` and ``check`` import torch, when first used: the lean runtime imports this
package with NumPy alone.
"""

from __future__ import annotations

from opforge.mindspore.definition import NameMismatchWarning, define
from opforge.mindspore.op import NAMESPACE, AotKernel, AotOp
from opforge.mindspore.package import (
    MINDSPORE_SEARCH_PATH_ENV, SEARCH_PATH_ENV, default_install_path, find_op, load_package,
    packages, read_package, register_vendor_ops, search_path, write_package,
)
from opforge.mindspore.reg_info import CustomRegOp, DataType, RegInfo, parse_reg_info

__all__ = [
    "Custom", "check", "CustomRegOp", "DataType", "RegInfo", "parse_reg_info", "define",
    "AotOp", "AotKernel", "NAMESPACE", "NameMismatchWarning", "SEARCH_PATH_ENV",
    "MINDSPORE_SEARCH_PATH_ENV", "search_path", "packages", "find_op", "read_package",
    "write_package", "load_package", "register_vendor_ops", "default_install_path",
]


def __getattr__(name: str):
    if name in ("Custom", "check"):
        from opforge.mindspore import custom

        return getattr(custom, name)
    raise AttributeError(f"module 'opforge.mindspore' has no attribute {name!r}")
