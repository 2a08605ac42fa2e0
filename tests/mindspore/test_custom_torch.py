"""Custom ops in PyTorch: eager vs the reference, fake inference under torch.export,
export to a program run lean and in ATen mode like eager, check(), pyfunc."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from mindspore_support import needs_cxx  # noqa: E402
from opforge.examples import mindspore_add as example  # noqa: E402
from opforge.export import export  # noqa: E402
from opforge.mindspore import Custom, check, write_package  # noqa: E402
from opforge.program import to_bytes  # noqa: E402
from opforge.runtime import load  # noqa: E402

pytestmark = needs_cxx


@pytest.fixture(scope="module")
def python_infer(cache):
    return example.add_custom_python(cache_root=cache)


def test_eager_matches_torch_for_dtypes_and_strides(python_infer):
    op = python_infer
    for dtype in (torch.float32, torch.float64):
        x, y = torch.randn(3, 5, dtype=dtype), torch.randn(3, 5, dtype=dtype)
        torch.testing.assert_close(op(x, y), x + y, rtol=0, atol=0)
        torch.testing.assert_close(op(x.t(), y.t()), x.t() + y.t(), rtol=0, atol=0)
    out = torch.empty(3, 5)
    x, y = torch.randn(3, 5), torch.randn(3, 5)
    torch.ops.mindspore.AddCustom.out(x, y, out=out)
    torch.testing.assert_close(out, x + y, rtol=0, atol=0)


def test_eager_refuses_dtypes_outside_reg_info(python_infer):
    with pytest.raises(Exception, match="input dtypes .int32, int32.*valid"):
        python_infer(torch.ones(3, dtype=torch.int32), torch.ones(3, dtype=torch.int32))


def test_fake_inference_under_fake_tensors(python_infer):
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        x = mode.from_tensor(torch.empty(2, 7, dtype=torch.float64))
        out = torch.ops.mindspore.AddCustom(x, x)
    assert tuple(out.shape) == (2, 7) and out.dtype == torch.float64


def _export_and_run(op, tmp_path, monkeypatch):
    model = example.AddModel(op)
    inputs = example.example_inputs()
    program = export(model, inputs)
    keys = [o.key for o in program.method("forward").operators]
    assert "mindspore::AddCustom.out" in keys
    want = model(*inputs).detach().numpy()
    write_package([op.op], tmp_path / "vendors" / "example")
    monkeypatch.setenv("OPFORGE_CUSTOM_OPP_PATH", str(tmp_path))
    data = to_bytes(program)
    (lean,) = load(data, kernels=["opforge.mindspore:register_vendor_ops"]).method("forward")(
        *[t.numpy() for t in inputs])
    (aten,) = load(data, mode="aten").method("forward")(*[t.numpy() for t in inputs])
    np.testing.assert_allclose(lean, want, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(aten, want, rtol=1e-6, atol=1e-6)


def test_python_infer_variant_exports_and_runs_lean_and_aten(python_infer, tmp_path, monkeypatch):
    _export_and_run(python_infer, tmp_path, monkeypatch)


def test_cpp_infer_variant_exports_and_runs_lean_and_aten(cache, tmp_path, monkeypatch):
    op = example.add_custom_cpp(cache_root=cache)
    assert op.op.out_shape == op.op.out_dtype == "cpp"
    try:
        _export_and_run(op, tmp_path, monkeypatch)
    finally:
        example.add_custom_python(cache_root=cache)  # the module's other tests use this one


def test_check_passes_against_a_true_reference_and_fails_a_wrong_one(python_infer):
    report = check(python_infer, lambda x, y: x + y)
    assert report.ok, report.failures
    assert set(report.dtypes) == {"float32", "float64"}  # int rows are outside reg_info
    wrong = check(python_infer, lambda x, y: x - y)
    assert not wrong.ok and "native" in wrong.failures


def test_a_lambda_kernel_cannot_go_into_a_package(tmp_path):
    # lambda inference is stored as "program" (test_lean_path.py); a lambda kernel cannot be
    op = Custom(lambda x: x * x, out_shape=lambda x: x, out_dtype=lambda x: x,
                func_type="pyfunc", reg_info={"op_name": "LambdaSquare", "inputs": ["x"],
                                              "outputs": ["y"]})
    with pytest.raises(Exception, match="a lambda or a nested function.*module level"):
        write_package([op.op], tmp_path / "p")


def numpy_square(x):
    return x * x


def test_pyfunc_op(tmp_path):
    op = Custom(numpy_square, out_shape=lambda x: x, out_dtype=lambda x: x, func_type="pyfunc")
    x = torch.randn(4, 3)
    torch.testing.assert_close(op(x), x * x)
    assert op.key == "mindspore::numpy_square.out"


def test_redefinition_with_another_schema_is_another_op(cache):
    first = example.add_custom_python(cache_root=cache)  # defined here, whatever ran before
    other = Custom(f"{example.SOURCE}:AddCustom", out_shape=lambda x: x, out_dtype=lambda x: x,
                   reg_info={"op_name": "AddCustom", "inputs": ["x"], "outputs": ["z"]},
                   cache_root=cache)
    assert other.name != first.name and other.name.startswith("AddCustom_")  # as in MindSpore
    assert first.op.inputs == ("x", "y") and other.op.inputs == ("x",)


def test_msop_check_cli_passes_and_fails(cache, monkeypatch):
    from click.testing import CliRunner

    from opforge.cli import cli

    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(cache))  # the compiled example: a cache hit
    ok = CliRunner().invoke(cli, ["msop", "check", "opforge.examples.mindspore_add:add_custom_cpp",
                                  "--reference", "opforge.examples.mindspore_add:add_reference"])
    assert ok.exit_code == 0 and "check: passed" in ok.output, ok.output
    bad = CliRunner().invoke(cli, ["msop", "check", "opforge.examples.mindspore_add:add_custom_cpp",
                                   "--reference", "operator:mul"])
    assert bad.exit_code != 0 and "FAIL native" in bad.output
    example.add_custom_python(cache_root=cache)


def test_opforge_run_cli_with_the_registrar(python_infer, tmp_path, monkeypatch):
    from click.testing import CliRunner

    from opforge.cli import cli
    from opforge.program import save

    program = export(example.AddModel(python_infer), example.example_inputs())
    save(program, tmp_path / "model.opf")
    write_package([python_infer.op], tmp_path / "opp" / "vendors" / "x")
    monkeypatch.setenv("OPFORGE_CUSTOM_OPP_PATH", str(tmp_path / "opp"))
    result = CliRunner().invoke(cli, ["run", str(tmp_path / "model.opf"), "--kernels",
                                      "opforge.mindspore:register_vendor_ops"])
    assert result.exit_code == 0, result.output


def test_tutorial_style_kernel_without_header_or_reg_info(cache):
    from mindspore_support import KERNELS

    op = Custom(f"{KERNELS / 'plain_add.cc'}:PlainAdd", out_shape=lambda x, _: x,
                out_dtype=lambda x, _: x, func_type="aot", cache_root=cache)
    assert op.op.inputs == ("x0", "x1") and op.op.outputs == ("y",)
    x, y = torch.randn(4, 5), torch.randn(4, 5)
    torch.testing.assert_close(op(x, y), x + y, rtol=0, atol=0)
    with pytest.raises(Exception, match="returned 2"):  # the kernel refuses float64 itself
        op(x.double(), y.double())
