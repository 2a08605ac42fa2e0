"""custom_aot_extra.h compiles without MindSpore, warning-free, and its structs have the
layout the ctypes adapter uses (field by field); the public surface is what __all__ says."""

import ctypes
import shutil
import subprocess

import pytest

from mindspore_support import needs_cxx
from opforge.mindspore.aot import CAttr, CExtra
from opforge.mindspore.compile import include_dir

PROBE = r"""
#include <cstddef>
#include <cstdio>
#include <type_traits>
#include "custom_aot_extra.h"
static_assert(std::is_standard_layout<AotExtra>::value, "AotExtra must be standard layout");
static_assert(sizeof(AotExtra) == sizeof(opforge_ms_extra), "AotExtra wraps opforge_ms_extra");
static_assert(sizeof(TypeId) == sizeof(int), "TypeId is an int");
int main() {
  std::printf("extra %zu %zu %zu %zu %zu %zu %zu\n", sizeof(opforge_ms_extra),
              offsetof(opforge_ms_extra, version), offsetof(opforge_ms_extra, num_workspace),
              offsetof(opforge_ms_extra, workspace), offsetof(opforge_ms_extra, kernel_data),
              offsetof(opforge_ms_extra, num_attrs), offsetof(opforge_ms_extra, attrs));
  std::printf("attr %zu %zu %zu %zu %zu %zu %zu\n", sizeof(opforge_ms_attr),
              offsetof(opforge_ms_attr, name), offsetof(opforge_ms_attr, kind),
              offsetof(opforge_ms_attr, reserved), offsetof(opforge_ms_attr, i),
              offsetof(opforge_ms_attr, d), offsetof(opforge_ms_attr, s));
  std::printf("typeid %d %d %d\n", (int)kNumberTypeFloat32, (int)kNumberTypeInt64,
              (int)kNumberTypeBool);
  return 0;
}
"""


def _layout(struct) -> list[int]:
    return [ctypes.sizeof(struct)] + [getattr(struct, name).offset for name, _ in struct._fields_]


@needs_cxx
def test_header_compiles_alone_and_matches_the_ctypes_mirror(tmp_path):
    cxx = shutil.which("c++") or shutil.which("g++")
    (tmp_path / "probe.cc").write_text(PROBE)
    subprocess.run([cxx, "-std=c++17", "-Wall", "-Wextra", "-Werror", f"-I{include_dir()}",
                    "-o", str(tmp_path / "probe"), str(tmp_path / "probe.cc")], check=True)
    lines = dict(line.split(" ", 1) for line in
                 subprocess.run([str(tmp_path / "probe")], capture_output=True, text=True,
                                check=True).stdout.splitlines())
    assert [int(v) for v in lines["extra"].split()] == _layout(CExtra)
    assert [int(v) for v in lines["attr"].split()] == _layout(CAttr)
    from opforge.mindspore.dtypes import TYPE_IDS

    assert [int(v) for v in lines["typeid"].split()] == [TYPE_IDS["float32"], TYPE_IDS["int64"],
                                                          TYPE_IDS["bool"]]


def test_public_surface():
    import opforge.mindspore as ms

    assert sorted(ms.__all__) == sorted([
        "Custom", "check", "CustomRegOp", "DataType", "RegInfo", "parse_reg_info", "define",
        "AotOp", "AotKernel", "NAMESPACE", "NameMismatchWarning", "SEARCH_PATH_ENV",
        "MINDSPORE_SEARCH_PATH_ENV", "search_path", "packages", "find_op", "read_package",
        "write_package", "load_package", "register_vendor_ops", "default_install_path"])
    for name in ms.__all__:
        if name not in ("Custom", "check"):  # these two import torch when first used
            assert getattr(ms, name) is not None
    with pytest.raises(AttributeError):
        ms.NoSuchThing  # noqa: B018
