"""custom_aot_extra.h compiles without MindSpore, warning-free, in both std::string ABIs; its
AotExtra has MindSpore's object layout (a vtable pointer, the workspace vector, the kernel
data pointer: 40 bytes, what opforge.mindspore.extra builds); its TypeId numbers are
MindSpore's; the public surface is what __all__ says."""

import shutil
import subprocess

import pytest

from mindspore_support import needs_cxx
from opforge.mindspore.compile import include_dir

PROBE = r"""
#include <cstdio>
#include <type_traits>
#include "custom_aot_extra.h"
static_assert(std::is_polymorphic<AotExtra>::value, "AotExtra has virtual functions");
static_assert(sizeof(AotExtra) == 40, "vptr + std::vector<size_t> + AotKernelData*");
static_assert(sizeof(TypeId) == sizeof(int), "TypeId is an int");
int main() {
  std::printf("typeid %d %d %d %d %d %d\n", (int)kNumberTypeFloat32, (int)kNumberTypeInt64,
              (int)kNumberTypeBool, (int)kNumberTypeBFloat16, (int)kNumberTypeComplex64,
              (int)kNumberTypeComplex128);
  std::printf("abi %d\n", opforge_ms_string_abi);
  return 0;
}
// written against the header of MindSpore's wheel (namespace mindspore)
mindspore::TypeId NsInferType(std::vector<mindspore::TypeId> ids, mindspore::AotExtra* extra);
mindspore::TypeId NsInferType(std::vector<mindspore::TypeId> ids, mindspore::AotExtra* extra) {
  return extra->Attr<bool>("f") ? ids[0] : mindspore::kNumberTypeFloat32;
}
"""


@needs_cxx
@pytest.mark.parametrize("abi", [0, 1])
def test_header_compiles_alone_with_mindspore_layout(tmp_path, abi):
    cxx = shutil.which("c++") or shutil.which("g++")
    (tmp_path / "probe.cc").write_text(PROBE)
    subprocess.run([cxx, "-std=c++17", "-Wall", "-Wextra", "-Werror",
                    f"-D_GLIBCXX_USE_CXX11_ABI={abi}", f"-I{include_dir()}",
                    "-o", str(tmp_path / "probe"), str(tmp_path / "probe.cc")], check=True)
    lines = dict(line.split(" ", 1) for line in
                 subprocess.run([str(tmp_path / "probe")], capture_output=True, text=True,
                                check=True).stdout.splitlines())
    from opforge.mindspore.dtypes import TYPE_IDS

    assert [int(v) for v in lines["typeid"].split()] == [
        TYPE_IDS[d] for d in ("float32", "int64", "bool", "bfloat16", "complex64", "complex128")]
    assert [int(v) for v in lines["typeid"].split()][3:] == [45, 51, 52]
    assert int(lines["abi"]) == abi


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
