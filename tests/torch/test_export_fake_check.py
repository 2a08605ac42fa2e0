"""Export runs each custom op's fake against its real implementation on the example inputs:
a wrong fake (the default one on a broadcasting op) is refused, naming the op, the shapes
and the fix, instead of planning wrong shapes that give wrong numbers without a word."""

from __future__ import annotations

import pytest
import torch
from torch.export import Dim

import opforge
from opforge.errors import ExportError
from opforge.export import export
from opforge.runtime import load

CALLS = {"gelu_mul": 0}


@opforge.op("fake_check_test::gelu_mul(Tensor w, Tensor x) -> Tensor")
def gelu_mul(w, x):  # no fake: the default one shapes the output like w
    CALLS["gelu_mul"] += 1
    return torch.nn.functional.gelu(w) * x


@opforge.op("fake_check_test::gelu_mul_ok(Tensor w, Tensor x) -> Tensor")
def gelu_mul_ok(w, x):
    return torch.nn.functional.gelu(w) * x


@gelu_mul_ok.register_fake
def _(w, x):
    return w.new_empty(torch.broadcast_shapes(w.shape, x.shape))


@opforge.op("fake_check_test::gelu_mul_native(Tensor w, Tensor x) -> Tensor")
def gelu_mul_native(w, x):  # no fake; a "native" kernel is bound to it below
    return torch.nn.functional.gelu(w) * x


@opforge.op("fake_check_test::positive(Tensor x) -> Tensor")
def positive(x):
    return x > 0


@positive.register_fake
def _(x):
    return torch.empty_like(x)  # wrong: the op returns bool


@opforge.op("fake_check_test::no_eager(Tensor x) -> Tensor")
def no_eager(x):
    raise RuntimeError("this op has no eager implementation here")


for _op in (gelu_mul, gelu_mul_ok, gelu_mul_native, positive, no_eager):
    _op.register()

W, X = torch.randn(1, 16), torch.randn(6, 16)


class GeluMul(torch.nn.Module):
    def __init__(self, op):
        super().__init__()
        self.op = op

    def forward(self, w, x):
        return self.op(w, x) + 1


def test_default_fake_of_a_broadcasting_op_is_refused_naming_op_shapes_and_fix():
    with pytest.raises(ExportError) as info:
        export(GeluMul(torch.ops.fake_check_test.gelu_mul), (W, X))
    text = str(info.value)
    assert "fake_check_test::gelu_mul" in text
    assert "float32[1, 16], float32[6, 16]" in text  # the inputs
    assert "fake gives float32[1, 16]" in text and "real implementation float32[6, 16]" in text
    assert "register_fake" in text and "fake: module:function" in text
    assert "test_export_fake_check.py" in text  # the model line


def test_wrong_fake_is_refused_with_dynamic_shapes_too():
    with pytest.raises(ExportError, match="fake gives float32\\[1, 16\\]"):
        export(GeluMul(torch.ops.fake_check_test.gelu_mul), (W, X),
               dynamic_shapes=({}, {0: Dim("rows", max=32)}))


def test_with_a_native_kernel_bound_the_python_reference_gives_the_real_shapes():
    from opforge.torch_bridge import set_out_kernel

    def kernel(w, x, outs):  # writes whatever fits the outputs the fake shaped
        outs[0].copy_((torch.nn.functional.gelu(w) * x)[: outs[0].shape[0]])

    set_out_kernel("fake_check_test::gelu_mul_native", kernel)
    try:
        with pytest.raises(ExportError, match="real implementation float32\\[6, 16\\]"):
            export(GeluMul(torch.ops.fake_check_test.gelu_mul_native), (W, X))
    finally:
        set_out_kernel("fake_check_test::gelu_mul_native", None)


def test_wrong_dtype_of_a_given_fake_is_refused_naming_that_fake():
    class Positive(torch.nn.Module):
        def forward(self, x):
            return torch.ops.fake_check_test.positive(x)

    with pytest.raises(ExportError) as info:
        export(Positive(), (X,))
    text = str(info.value)
    assert "fake gives float32[6, 16], its real implementation bool[6, 16]" in text
    assert "correct its fake" in text


@pytest.mark.parametrize("dynamic", [False, True])
def test_a_right_fake_exports_and_runs_like_eager(dynamic):
    model = GeluMul(torch.ops.fake_check_test.gelu_mul_ok)
    shapes = ({}, {0: Dim("rows", max=32)}) if dynamic else None
    program = export(model, (W, X), dynamic_shapes=shapes)
    out = load(program, mode="aten").method("forward")(W.numpy(), X.numpy())[0]
    torch.testing.assert_close(torch.from_numpy(out), model(W, X))


def test_the_real_op_runs_once_per_node():
    class Twice(torch.nn.Module):
        def forward(self, w, x):
            return torch.ops.fake_check_test.gelu_mul(x, x) + torch.ops.fake_check_test.gelu_mul(x, w)

    CALLS["gelu_mul"] = 0
    export(Twice(), (W, X))  # (x, x) and (x, w): the default fake is right for both
    assert CALLS["gelu_mul"] == 2


def test_an_op_that_cannot_run_eagerly_here_does_not_stop_export():
    class NoEager(torch.nn.Module):
        def forward(self, x):
            return torch.ops.fake_check_test.no_eager(x) * 2

    export(NoEager(), (X,), kernels=None)  # nothing to compare with: exported unchecked


def test_a_graph_without_custom_ops_runs_nothing_eagerly(monkeypatch):
    import opforge.export.fake_check as fake_check

    def refuse(*args, **kwargs):
        raise AssertionError("no custom op: nothing may run")

    monkeypatch.setattr(fake_check, "_RealRun", refuse)
    export(torch.nn.Linear(16, 4), (X,))


def test_the_check_leaves_the_models_buffers_as_they_were():
    # torch.export's graph updates a cache buffer in place (index_copy_): interpreting it
    # on the model's own buffers would write them
    class Cached(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("cache", torch.zeros(8, 16))

        def forward(self, x, positions):
            self.cache.index_copy_(0, positions, x)  # before the custom op: the check runs it
            return torch.ops.fake_check_test.gelu_mul_ok(self.cache, self.cache)

    model = Cached()
    export(model, (X, torch.arange(6)))
    assert not model.cache.any()
