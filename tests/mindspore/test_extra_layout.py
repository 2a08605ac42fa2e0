"""What a kernel reads through ``extra`` is right whatever header it was built with.

A MindSpore project keeps MindSpore's ``custom_aot_extra.h`` beside its kernels; a quoted
include finds it first, so the kernel calls AotExtra's virtual functions. opforge's object
behind ``extra`` has that layout (opforge's own header copies it), for sources opforge
compiles (MindSpore's flags: -D_GLIBCXX_USE_CXX11_ABI=0) and for prebuilt libraries of
either std::string ABI. Each case runs in a child process: a layout mismatch is a crash.
"""

import json
import shutil
import subprocess
import sys

import pytest

from mindspore_support import KERNELS, needs_cxx

pytest.importorskip("torch")

LAYOUT = KERNELS / "mindspore_layout"

# scale 2.5, bias 3, flip false, mode long, weights 0.5+1.5, grid 1+2+3: y = 2.5x + 1011
ATTRS = [
    ("scale", "float", "2.5"), ("bias", "int", "3"), ("flip", "bool", "false"),
    ("mode", "str", "a string longer than fifteen characters"),
    ("weights", "listFloat", "0.5,1.5"), ("grid", "listListInt", "[[1, 2], [3]]"),
]

CHILD = r"""
import json, sys
import torch
from opforge.mindspore import Custom, CustomRegOp, DataType
func, cache, attrs = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
info = CustomRegOp("AttrsKernel").input(0, "x").output(0, "y")
for name, kind, value in attrs:
    info = info.attr(name, "required", kind, value)
info = info.dtype_format(DataType.F32_Default, DataType.F32_Default).target("CPU")
op = Custom(func, out_shape=lambda x: x, out_dtype=lambda x: x, func_type="aot",
            reg_info=info.get_op_info(), cache_root=cache)
try:
    print(json.dumps(op(torch.tensor([0.0, 1.0, -2.0])).tolist()))
except Exception as e:
    print(json.dumps(f"{type(e).__name__}: {e}"))
"""


def _run(func: str, cache, attrs=ATTRS):
    result = subprocess.run([sys.executable, "-c", CHILD, func, str(cache), json.dumps(attrs)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"child died ({result.returncode}): {result.stderr[-2000:]}"
    return json.loads(result.stdout.strip().splitlines()[-1])


def _beside_mindspore_header(tmp_path):
    folder = tmp_path / "project"
    folder.mkdir()
    for name in ("custom_aot_extra.h", "attrs_kernel.cc"):
        shutil.copy(LAYOUT / name, folder / name)
    return folder


@needs_cxx
def test_source_beside_mindspore_header(tmp_path, cache):
    folder = _beside_mindspore_header(tmp_path)
    assert _run(f"{folder / 'attrs_kernel.cc'}:AttrsKernel", cache) == [1011.0, 1013.5, 1006.0]


@needs_cxx
@pytest.mark.parametrize("abi", [0, 1])
@pytest.mark.parametrize("header", ["mindspore", "opforge"])
def test_prebuilt_library_of_either_header_and_string_abi(tmp_path, cache, abi, header):
    from opforge.mindspore.compile import include_dir

    folder = _beside_mindspore_header(tmp_path)
    if header == "opforge":
        (folder / "custom_aot_extra.h").unlink()
    cxx = shutil.which("c++") or shutil.which("g++")
    library = tmp_path / f"libattrs_{header}_{abi}.so"
    subprocess.run([cxx, "-std=c++17", "-shared", "-fPIC", "-O2", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
                    f"-I{include_dir()}", "-o", str(library), str(folder / "attrs_kernel.cc")],
                   check=True)
    assert _run(f"{library}:AttrsKernel", cache) == [1011.0, 1013.5, 1006.0]


@needs_cxx
def test_a_missing_attribute_is_a_kernel_error_naming_it(tmp_path, cache):
    folder = _beside_mindspore_header(tmp_path)
    got = _run(f"{folder / 'attrs_kernel.cc'}:AttrsKernel", cache,
               [a for a in ATTRS if a[0] != "bias"])
    assert got.startswith("KernelError") and "'bias'" in got and "no attribute" in got


@needs_cxx
def test_a_package_built_against_the_format_1_header_is_refused(add_lib, tmp_path):
    from opforge.errors import KernelError
    from opforge.mindspore import define, read_package, write_package

    op = define(f"{add_lib}:AddCustom", lambda x, y: x, lambda x, y: x)
    folder = write_package([op], tmp_path / "vendors" / "old")
    (folder / "include" / "custom_aot_extra.h").write_text("#define OPFORGE_MS_EXTRA_VERSION 1\n")
    (stored,) = read_package(folder)
    with pytest.raises(KernelError, match="format-1 custom_aot_extra.h.*rebuild the package"):
        stored.functions()
