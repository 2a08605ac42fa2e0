"""The whole flow: OpDef XML → skeleton filled in → built → registered by compile spec →
exported → run, matching eager; an override of aten.add.Tensor visible in the outputs.

Two backends run it: ``pkgonly`` (tests/oppackage/package_backend.py: package nodes only,
through the same planner/node/prepare calls as the cpu backend) always, and the ``cpu``
backend once it is available on this machine."""

import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from opforge.backends import register_backend
from opforge.backends.oppackage import build_package, generate_skeleton, load_opdef_xml
from opforge.export import delegation_report, export
from opforge.runtime import load

from oppackage_support import EXAMPLE, example_infos, needs_compiler
from package_backend import PackageOnlyBackend

pytestmark = needs_compiler

register_backend(PackageOnlyBackend, replace=True)


class Model(torch.nn.Module):
    def forward(self, x, y):
        a = torch.ops.my_ops.mul3(x)      # → ExampleCustomOp
        b = a + y                          # aten.add.Tensor → ElementWiseAdd (override)
        return torch.sin(b), torch.add(b, y, alpha=0.5)


@pytest.fixture(scope="module")
def inputs():
    from opforge.examples.my_ops import register_examples

    register_examples()
    g = torch.Generator().manual_seed(0)
    return torch.randn(4, 5, generator=g), torch.randn(5, generator=g)


@pytest.fixture(scope="module")
def subtracting_library(tmp_path_factory):
    """The example package again, from its XML through `new`, with ElementWiseAdd written
    to subtract (self - alpha * other): an override anyone can see in the outputs."""
    xml = EXAMPLE / "config" / "ExampleOpPackage.xml"
    project = tmp_path_factory.mktemp("sub") / "ExampleOpPackage"
    generate_skeleton(load_opdef_xml(xml), xml.read_text(), project)
    (project / "src" / "ops" / "ExampleCustomOp.cpp").write_text(
        (EXAMPLE / "src" / "ops" / "ExampleCustomOp.cpp").read_text())
    (project / "src" / "ops" / "ElementWiseAdd.cpp").write_text("""
#include "ExampleOpPackageOps.h"
namespace ExampleOpPackage {
opforge::pkg::Status ElementWiseAdd(const opforge::pkg::Tensor& self, const opforge::pkg::Tensor& other,
                                    float alpha, opforge::pkg::Tensor& output) {
  const float* a = self.data<float>();
  const float* b = other.data<float>();
  float* out = output.data<float>();
  const int64_t n = output.numel(), nb = other.numel(), na = self.numel();
  for (int64_t i = 0; i < n; ++i) out[i] = a[i % na] - alpha * b[i % nb];  // trailing broadcast only
  return opforge::pkg::Status::Ok();
}
}
""")
    cache = tmp_path_factory.getbasetemp() / "oppackage-cache"
    return build_package(project, output=project / "libQnnExampleOpPackage.so", cache_root=cache)


def _run(backend, library, inputs):
    specs = {"op_packages": [i.as_dict() for i in example_infos(library)]}
    program = export(Model(), inputs, backends=[(backend, specs)], kernels="portable")
    loaded = load(program)  # held: the delegates are destroyed with it
    method = loaded.method("forward")
    return program, [np.asarray(o) for o in method(*[t.numpy() for t in inputs])]


def test_pkgonly_matches_eager(example_library, inputs):
    program, outs = _run("pkgonly", example_library, inputs)
    want = Model()(*inputs)
    for got, ref in zip(outs, want):
        np.testing.assert_allclose(got, ref.numpy(), rtol=1e-5, atol=1e-6)
    (delegate,) = delegation_report(program)["forward"]["delegates"]
    assert delegate["backend"] == "pkgonly"
    assert delegate["ops"] == ["my_ops::mul3.default", "aten::add.Tensor", "aten::add.Tensor"]
    (sin,) = delegation_report(program)["forward"]["rejected"]
    assert sin["op"] == "aten::sin.default"


def test_unmappable_claimed_node_is_explained(example_library):
    """A node a package claims but cannot take is left out with the package's reason (and
    runs on kernels), never silently given to another implementation."""
    class IntAdd(torch.nn.Module):
        def forward(self, x):
            return x.to(torch.int32) + 1

    specs = {"op_packages": [i.as_dict() for i in example_infos(example_library)]}
    program = export(IntAdd(), (torch.randn(3),), backends=[("pkgonly", specs)], kernels="portable")
    rejected = {r["node"]: r for r in delegation_report(program)["forward"]["rejected"]}
    assert rejected["add"]["kind"] == "dtype"
    assert "ExampleOpPackage::ElementWiseAdd: input 'self' is int32" in rejected["add"]["reason"]
    loaded = load(program)
    np.testing.assert_array_equal(loaded.method("forward")(np.array([1.5, 2.0, -1.0], np.float32))[0], [2, 3, 0])


def test_override_visible_in_outputs(subtracting_library, inputs):
    _, outs = _run("pkgonly", subtracting_library, inputs)
    x, y = inputs
    b = x * 3 - y                                     # the package's add subtracts
    np.testing.assert_allclose(outs[0], torch.sin(b).numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(outs[1], (b - 0.5 * y).numpy(), rtol=1e-5, atol=1e-6)


def _cpu_backend_or_skip():
    # the repository installs oneDNN (the cpu extra): a missing backend is a failure here
    from opforge.backends import get_backend

    backend = get_backend("cpu")
    problem = backend.unavailable()
    assert problem is None, f"cpu backend not usable: {problem}"
    assert any(d.name == "op_packages" for d in backend.compile_spec_defs)
    return backend


def test_cpu_backend_runs_packages(example_library, subtracting_library, inputs):
    _cpu_backend_or_skip()
    program, outs = _run("cpu", example_library, inputs)
    for got, ref in zip(outs, Model()(*inputs)):
        np.testing.assert_allclose(got, ref.numpy(), rtol=1e-5, atol=1e-6)
    _, outs = _run("cpu", subtracting_library, inputs)
    x, y = inputs
    np.testing.assert_allclose(outs[0], torch.sin(x * 3 - y).numpy(), rtol=1e-5, atol=1e-6)


def test_cli_export_with_op_packages(example_library, inputs, tmp_path):
    """`opforge export --backend cpu --op-packages FILE` then `opforge inspect` names the
    package implementation of each delegated node."""
    _cpu_backend_or_skip()
    from opforge.cli import cli

    (tmp_path / "packages.json").write_text(json.dumps([i.as_dict() for i in example_infos(example_library)]))
    (tmp_path / "model.py").write_text(
        "import torch\nfrom opforge.examples.my_ops import register_examples\nregister_examples()\n"
        "class M(torch.nn.Module):\n    def forward(self, x, y):\n        return torch.ops.my_ops.mul3(x) + y\n"
        "def make():\n    return M(), (torch.randn(4, 5), torch.randn(5))\n")
    runner = CliRunner()
    with runner.isolated_filesystem(tmp_path):
        result = runner.invoke(cli, ["export", f"{tmp_path / 'model.py'}:make", "-o", "m.pte", "--backend", "cpu",
                                     "--op-packages", str(tmp_path / "packages.json")])
        assert result.exit_code == 0, result.output
        result = runner.invoke(cli, ["inspect", "m.pte"])
        assert "ExampleOpPackage::ExampleCustomOp" in result.output
        assert "ExampleOpPackage::ElementWiseAdd" in result.output


def test_a_registration_that_matches_no_node_warns_with_a_did_you_mean(example_library, inputs):
    """custom_op_name 'my_ops.mul3.defualt' used to be ignored in silence (the op then ran on
    the backend's own implementation, or the kernels)."""
    infos = [i.as_dict() for i in example_infos(example_library)]
    typo = dict(next(i for i in infos if i["custom_op_name"] == "my_ops.mul3.default"))
    typo["custom_op_name"] = "my_ops.mul3.defualt"
    specs = {"op_packages": [typo] + [i for i in infos if i["custom_op_name"] != "my_ops.mul3.default"]}
    with pytest.warns(UserWarning, match="'my_ops.mul3.defualt' matches no node of method "
                                         "'forward'.*did you mean 'my_ops.mul3.default'"):
        export(Model(), inputs, backends=[("cpu", specs)])
