"""A custom kernel or op-package op that crashes inside a cpu delegate is named, as one on
the lean runtime is: the engine's signal handler writes the op, the kernel symbol, the
library, the engine op and the FX node; faulthandler's Python stack names the delegate,
the method and the instruction. Each crash runs in a child process. Needs torch (to
export), oneDNN and a C++ compiler."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

import opforge.backends.cpu.engine as engine
from opforge.examples.custom_model import custom_op_model
from opforge.examples.my_ops import manifest_path
from opforge.export import export
from opforge.native import build_library
from opforge.program import save

pytestmark = pytest.mark.skipif(engine.missing() is not None or not any(
    shutil.which(c) for c in ("c++", "g++", "clang++")), reason="needs oneDNN and a C++ compiler")

EXAMPLE_PACKAGE = Path(__file__).resolve().parents[2] / "opforge" / "examples" / "oppackage" / "ExampleOpPackage"

RUN = """
import numpy as np
from opforge.runtime import load
forward = load({program!r}, kernels={kernels!r}).method("forward")
forward(*[np.load(p) for p in {inputs!r}])
"""


def _crash(tmp_path, program, inputs, kernels=(), env=None):
    paths = []
    for i, x in enumerate(inputs):
        paths.append(str(tmp_path / f"x{i}.npy"))
        np.save(paths[-1], x.numpy())
    save(program, tmp_path / "m.opf")
    code = RUN.format(program=str(tmp_path / "m.opf"), kernels=list(kernels), inputs=paths)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=300, env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def crashing_kernels(tmp_path_factory):
    """The example kernel library with mul3 writing through a null pointer."""
    root = tmp_path_factory.mktemp("kernels")
    shutil.copytree(manifest_path().parent / "kernels", root / "src")
    mul = root / "src" / "mul.cpp"
    mul.write_text(mul.read_text().replace(
        "const T* src = in.const_data_ptr<T>();",
        "if (in.numel() > 0) *(volatile int*)nullptr = 1;  // SIGSEGV\n"
        "  const T* src = in.const_data_ptr<T>();", 1))
    cache = tmp_path_factory.getbasetemp() / "opforge-cache"
    good = build_library(manifest_path(), sorted((manifest_path().parent / "kernels").glob("*.cpp")),
                         root / "libgood.so", cache_root=cache)
    bad = build_library(manifest_path(), sorted((root / "src").glob("*.cpp")), root / "libcrash.so",
                        cache_root=cache)
    return good, bad


def test_a_kernel_crashing_inside_the_delegate_is_named(crashing_kernels, tmp_path):
    good, bad = crashing_kernels
    model, inputs = custom_op_model(0)
    program = export(model, inputs, kernels=["portable", set(good.ops)],
                     backends=[("cpu", {"custom_ops": ["my_ops::mul3", "my_ops::mul4",
                                                       "my_ops::minmax", "my_ops::scaled_sum"]})])
    done = _crash(tmp_path, program, inputs, kernels=[str(bad.path)])
    assert done.returncode == -signal.SIGSEGV, done.stderr
    report = done.stderr
    assert ("opforge: SIGSEGV inside a cpu delegate, in native kernel "
            "custom::native::mul3_out_impl for my_ops::mul3.out [") in report, report
    line = next(x for x in report.splitlines() if x.startswith("opforge: SIGSEGV"))
    assert f"library {bad.path}, engine op " in line and "(node 'mul3')" in line
    assert (f"instruction 0 of method 'forward', delegate 0 (backend 'cpu') calling native "
            f"code in {bad.path}") in report  # faulthandler's Python stack

    quiet = _crash(tmp_path, program, inputs, kernels=[str(bad.path)],
                   env={"OPFORGE_FAULTHANDLER": "0"})
    assert quiet.returncode == -signal.SIGSEGV
    assert "opforge: SIGSEGV" not in quiet.stderr


@pytest.fixture(scope="module")
def aborting_package(tmp_path_factory):
    """The example op package with ElementWiseAdd calling abort()."""
    from opforge.backends.oppackage import build_package, generate_skeleton, load_opdef_xml

    xml = EXAMPLE_PACKAGE / "config" / "ExampleOpPackage.xml"
    project = tmp_path_factory.mktemp("pkg") / "ExampleOpPackage"
    generate_skeleton(load_opdef_xml(xml), xml.read_text(), project)
    (project / "src" / "ops" / "ExampleCustomOp.cpp").write_text(
        (EXAMPLE_PACKAGE / "src" / "ops" / "ExampleCustomOp.cpp").read_text())
    (project / "src" / "ops" / "ElementWiseAdd.cpp").write_text("""
#include <cstdlib>
#include "ExampleOpPackageOps.h"
namespace ExampleOpPackage {
opforge::pkg::Status ElementWiseAdd(const opforge::pkg::Tensor& self, const opforge::pkg::Tensor&,
                                    float, opforge::pkg::Tensor&) {
  if (self.numel() > 0) std::abort();  // what a failed assert or a double free ends in
  return opforge::pkg::Status::Ok();
}
}
""")
    cache = tmp_path_factory.getbasetemp() / "oppackage-cache"
    return build_package(project, output=project / "libQnnExampleOpPackage.so", cache_root=cache)


class _PackageModel(torch.nn.Module):
    def forward(self, x, y):
        return torch.sin(torch.ops.my_ops.mul3(x) + y)


def test_a_package_op_crashing_inside_the_delegate_is_named(aborting_package, tmp_path):
    from opforge.backends.oppackage import parse_op_package_infos
    from opforge.examples.my_ops import register_examples

    register_examples()
    infos = parse_op_package_infos([
        {"op_package_name": "ExampleOpPackage", "op_package_path": str(aborting_package),
         "custom_op_name": op, "op_type_name": t}
        for op, t in (("my_ops.mul3.default", "ExampleCustomOp"), ("aten.add.Tensor", "ElementWiseAdd"))])
    inputs = (torch.randn(4, 5), torch.randn(5))
    program = export(_PackageModel(), inputs, kernels="portable",
                     backends=[("cpu", {"op_packages": [i.as_dict() for i in infos]})])
    done = _crash(tmp_path, program, inputs,
                  env={"OPFORGE_OP_PACKAGES": str(Path(aborting_package).parent)})
    assert done.returncode == -signal.SIGABRT, done.stderr
    report = done.stderr
    line = next((x for x in report.splitlines() if x.startswith("opforge: SIGABRT")), report)
    assert ("opforge: SIGABRT inside a cpu delegate, in package op "
            "ExampleOpPackage::ElementWiseAdd (execute) for aten.add.Tensor") in line, report
    assert f"library {aborting_package}, engine op " in line and "(node 'add')" in line
    assert "delegate 0 (backend 'cpu') calling native code in" in report
