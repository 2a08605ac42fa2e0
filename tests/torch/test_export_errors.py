"""Bad input: every way a model can fail to export gives one ExportError that names the
node, the source line where torch recorded it, and the fix."""

from __future__ import annotations

import warnings

import pytest
import torch

from opforge.errors import ExportError, MissingKernelError
from opforge.export import export

_LIB = torch.library.Library("export_err_test", "DEF")
_LIB.define("noout(Tensor x) -> Tensor")
_LIB.define("noout2(Tensor x, float s) -> Tensor")
_LIB.define("scale(Tensor x, float s) -> Tensor")
_LIB.define("scale.out(Tensor x, float s, *, Tensor(a!) out) -> Tensor(a!)")
_LIB.define("bump(Tensor(a!) x) -> ()")
_LIB.impl("noout", lambda x: x * 2, "CompositeExplicitAutograd")
_LIB.impl("noout2", lambda x, s: x * s, "CompositeExplicitAutograd")
_LIB.impl("scale", lambda x, s: x * s, "CompositeExplicitAutograd")
_LIB.impl("scale.out", lambda x, s, *, out: out.copy_(x * s), "CompositeExplicitAutograd")
_LIB.impl("bump", lambda x: x.add_(1), "CompositeExplicitAutograd")
torch.library.register_fake("export_err_test::noout", lambda x: torch.empty_like(x), lib=_LIB)
torch.library.register_fake("export_err_test::noout2", lambda x, s: torch.empty_like(x), lib=_LIB)
torch.library.register_fake("export_err_test::scale", lambda x, s: torch.empty_like(x), lib=_LIB)
torch.library.register_fake("export_err_test::bump", lambda x: None, lib=_LIB)

X = (torch.randn(2, 3),)


class NoOutVariant(torch.nn.Module):
    def forward(self, x):
        y = torch.ops.export_err_test.noout(x)
        return torch.ops.export_err_test.noout2(y, 2.0) + torch.ops.export_err_test.noout(y)


class MutatesInput(torch.nn.Module):
    def forward(self, x):
        x.add_(1)
        return x * 2


class CustomOpMutates(torch.nn.Module):
    def forward(self, x):
        y = x + 1
        torch.ops.export_err_test.bump(y)
        return y


class DataDependent(torch.nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            return x + 1
        return x - 1


def test_custom_op_without_out_variant_lists_every_such_op_with_its_fix():
    with pytest.raises(ExportError) as info:
        export(NoOutVariant(), X)
    message = str(info.value)
    assert "2 operator(s) without an out variant" in message
    assert "export_err_test::noout.out(Tensor x, *, Tensor(a!) out) -> Tensor(a!)" in message
    assert "export_err_test::noout2.out(Tensor x, float s, *, Tensor(a!) out) -> Tensor(a!)" in message
    assert "test_export_errors.py" in message  # the source line of a node using it
    assert "`opforge.export.export()`" in message


def test_custom_op_with_out_variant_exports_to_its_out_overload():
    class Scale(torch.nn.Module):
        def forward(self, x):
            return torch.ops.export_err_test.scale(x, 3.0)

    program = export(Scale(), X)
    assert [op.key for op in program.method("forward").operators] == ["export_err_test::scale.out"]


def test_in_place_write_into_an_input_is_rejected_naming_node_and_line():
    with pytest.raises(ExportError) as info:
        export(MutatesInput(), X)
    message = str(info.value)
    assert "writes in place into the input `x`" in message
    assert "x.add_(1)" in message and "test_export_errors.py:" in message
    assert "x = x.add(1)" in message


def test_custom_op_writing_its_argument_is_rejected_with_the_functional_fix():
    with pytest.raises(ExportError) as info:
        export(CustomOpMutates(), X)
    message = str(info.value)
    assert "export_err_test::bump" in message and "writes to its argument(s) x" in message
    assert "export_err_test::bump_functional(Tensor x) -> Tensor" in message
    assert "export_err_test::bump_functional.out(Tensor x, *, Tensor(a!) out) -> Tensor(a!)" in message
    assert "torch.ops.export_err_test.bump(y)" in message


@pytest.mark.parametrize("strict", [False, True])
def test_data_dependent_control_flow_names_the_line_and_suggests_torch_cond(strict):
    with pytest.raises(ExportError) as info:
        export(DataDependent(), X, strict=strict)
    message = str(info.value)
    assert "data-dependent control flow" in message
    assert "test_export_errors.py:" in message and "if x.sum() > 0:" in message
    assert "torch.cond" in message


def test_missing_kernels_are_listed_all_at_once_before_anything_is_written():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU())
    with pytest.raises(ExportError) as info:
        export(model, X, kernels={"aten::relu.out"})
    assert isinstance(info.value, MissingKernelError)
    message = str(info.value)
    assert "aten::addmm.out" in message and "aten::permute_copy.out" in message
    # the lean runtime always has the portable kernels: adding them is the fix (issue 16)
    assert "--kernels portable" in message and "allow_missing" in message


def test_missing_custom_kernel_points_at_the_manifest_build_and_near_names():
    class Scale(torch.nn.Module):
        def forward(self, x):
            return torch.ops.export_err_test.scale(x, 3.0)

    with pytest.raises(ExportError) as info:
        export(Scale(), X, kernels={"export_err_test::scale.Out": None})
    message = str(info.value)
    assert "opforge build" in message and "`export_err_test::scale.Out`" in message


def test_allow_missing_warns_and_returns_the_program():
    model = torch.nn.ReLU()
    with pytest.warns(UserWarning, match="aten::relu.out"):
        program = export(model, X, kernels=set(), allow_missing=True)
    assert program.metadata["opforge.missing_kernels"] == "aten::relu.out"


def test_aten_kernel_set_covers_every_aten_op():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.GELU())
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        export(model, X, kernels="aten")


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        ({"kernels": "nope"}, "unknown name"),
        ({"kernels": "libmine.so"}, "no such file"),
        ({"kernels": 3}, "found int"),
        ({"preserve_ops": ["not an op"]}, "not an operator name"),
        ({"methods": {"bad name": (torch.nn.ReLU(), X)}}, "Python identifier"),
        ({"methods": {"forward": (torch.nn.ReLU(), X)}}, "defined twice"),
        ({"methods": {"encode": torch.nn.ReLU()}}, "(module_or_bound_method, example_inputs)"),
    ],
)
def test_bad_arguments_are_export_errors(kwargs, needle):
    with pytest.raises(ExportError, match=None) as info:
        export(torch.nn.ReLU(), X, **kwargs)
    assert needle in str(info.value)


def test_no_methods_at_all():
    with pytest.raises(ExportError, match="found none"):
        export(None, None)


def test_buffer_update_becomes_program_state():
    class Train(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("count", torch.zeros(()))

        def forward(self, x):
            self.count.add_(1)
            return x * 2

    program = export(Train(), X)
    assert [slot.name for slot in program.method("forward").state] == ["count"]


def test_an_op_refusing_its_fake_inputs_is_one_error_without_torchs_log(capfd):
    # torch logs ~20 lines of traceback ("failed while attempting to run meta for
    # aten.mm.default") before raising what capture turns into one ExportError
    class Mismatch(torch.nn.Module):
        def forward(self, x):
            return x @ torch.ones(4, 8)

    with pytest.raises(ExportError, match="torch.export failed: RuntimeError"):
        export(Mismatch(), (torch.randn(3, 5),))
    assert "failed while attempting to run meta" not in capfd.readouterr().err
