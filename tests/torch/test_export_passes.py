"""Each export pass on its own: contract checked, graph still computes the model."""

from __future__ import annotations

import operator

import pytest
import torch

from opforge.errors import InternalError
from opforge.export import ExportPass, PassManager, export, run_pipeline
from opforge.export.capture import MethodSpec, capture
from opforge.export.method_graph import InputKind, is_alloc
from opforge.export.out_variants import is_out_schema, op_key
from opforge.export.method_graph import ASSERTION_OPS
from opforge.export.passes import (
    CheckFunctional, DecomposeToCoreAten, DropAssertions, LiftConstants, ToOutVariant,
)
from opforge.program import KernelCall, TensorValue
from opforge.runtime import load

_LIB = torch.library.Library("export_pass_test", "DEF")
_LIB.define("scale(Tensor x, float s) -> Tensor")
_LIB.define("scale.out(Tensor x, float s, *, Tensor(a!) out) -> Tensor(a!)")
_LIB.impl("scale", lambda x, s: x * s, "CompositeExplicitAutograd")
_LIB.impl("scale.out", lambda x, s, *, out: out.copy_(x * s), "CompositeExplicitAutograd")
torch.library.register_fake("export_pass_test::scale", lambda x, s: torch.empty_like(x), lib=_LIB)


class Views(torch.nn.Module):
    """Views, a multi-result op, a list result, a custom op and a tied weight."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(6, 6)
        self.b = torch.nn.Linear(6, 6)
        self.b.weight = self.a.weight  # tied: stored once
        self.ln = torch.nn.LayerNorm(6)

    def forward(self, x):
        y = self.b(self.a(x)).transpose(0, 1).unsqueeze(0)
        first, second = torch.split(y, [1, 2], dim=2)
        z = torch.ops.export_pass_test.scale(self.ln(x), 0.5)
        return first.sum() + second[0, 1:, :].mean() + z.select(1, 2).sum()


X = (torch.randn(3, 6),)


def _eager(method, inputs):
    users = iter(inputs)
    args = [method.constants[n.name] if method.input_kinds[n.name] != InputKind.USER else next(users)
            for n in method.placeholders()]
    return method.graph_module(*args)


def _through(*passes):
    method = capture(MethodSpec("forward", Views().eval(), X))
    return PassManager(list(passes)).run(method)


def test_decompose_keeps_custom_ops_and_preserved_ops():
    method = _through(DecomposeToCoreAten(preserve={"aten::linear"}))
    keys = {op_key(n.target) for n in method.call_nodes() if n.target is not operator.getitem}
    assert "export_pass_test::scale" in keys and "aten::linear" in keys
    assert "aten::layer_norm" not in keys


def test_to_out_variant_rewrites_every_call_and_the_graph_still_computes_the_model():
    model = Views().eval()
    method = run_pipeline(capture(MethodSpec("forward", model, X)))
    calls = [n for n in method.call_nodes() if not is_alloc(n)]
    assert calls and all(is_out_schema(n.target._schema) for n in calls)
    assert not any(n.target is operator.getitem for n in method.call_nodes())
    keys = {op_key(n.target) for n in calls}
    assert {"aten::permute_copy.out", "aten::unsqueeze_copy.out", "aten::split_with_sizes_copy.out",
            "aten::native_layer_norm.out", "export_pass_test::scale.out", "aten::select_copy.int_out"} <= keys
    (out,) = _eager(method, X)
    torch.testing.assert_close(out, model(*X))


def test_constants_are_deduplicated_and_keyed():
    method = _through(DecomposeToCoreAten(), CheckFunctional(), DropAssertions(), ToOutVariant(),
                      LiftConstants())
    assert method.notes["merged_constants"]  # the tied weight was merged
    keys = method.notes["constant_keys"]
    assert len(set(keys.values())) == len(keys)
    params = [n for n in method.placeholders() if method.input_kinds[n.name] != InputKind.USER]
    assert len(params) == len(keys)


class Casts(torch.nn.Module):
    """``.float()`` / ``.to(dtype)``: non-strict export records a metadata assertion."""

    def forward(self, x):
        index = x.argmax(1).float()
        return index.sum() + x.to(torch.float64).mean().to(torch.float32) + x.int().sum()


def test_run_time_assertions_are_dropped_and_the_casts_still_run():
    x = torch.randn(3, 5)
    captured = capture(MethodSpec("forward", Casts(), (x,)))
    decomposed = PassManager([DecomposeToCoreAten(), CheckFunctional()]).run(captured)
    # What the pass exists for: torch 2.13 leaves _assert_tensor_metadata before each cast.
    assert any(n.target in ASSERTION_OPS for n in decomposed.call_nodes())
    method = PassManager([DropAssertions()]).run(decomposed)
    assert not any(n.target in ASSERTION_OPS for n in method.call_nodes())
    program = export(Casts(), (x,), kernels="portable")
    (out,) = load(program).method("forward")(x.numpy())
    torch.testing.assert_close(torch.from_numpy(out), Casts()(x))


def test_pass_manager_checks_requires_and_ensures():
    class ForgetsAllocs(ExportPass):
        requires = frozenset({"captured"})
        ensures = frozenset({"all_out_variants"})

        def run(self, method):
            return method

    with pytest.raises(InternalError, match="ForgetsAllocs ensures property 'all_out_variants'"):
        _through(ForgetsAllocs())
    with pytest.raises(InternalError, match="ToOutVariant requires property 'core_aten_or_custom'"):
        _through(ToOutVariant())


def test_kernel_calls_carry_every_schema_argument_in_order_including_defaults():
    class Add(torch.nn.Module):
        def forward(self, x):
            return torch.add(x, x)  # alpha left at its default

    method = export(Add(), X).method("forward")
    (call,) = method.instructions
    assert isinstance(call, KernelCall) and method.operators[call.op].key == "aten::add.out"
    assert len(call.args) == 4  # self, other, alpha=1, out
    assert method.values[call.args[2]].value == 1
    assert isinstance(method.values[call.args[3]], TensorValue)
    assert call.args[3] == method.outputs[0]


def test_several_methods_share_constants_and_have_their_own_operator_tables():
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.enc = torch.nn.Linear(4, 3)

        def encode(self, x):
            return torch.relu(self.enc(x))

        def forward(self, x):
            return torch.sigmoid(self.enc(x))

    model = Model().eval()
    program = export(model, (torch.randn(2, 4),), methods={"encode": (model.encode, (torch.randn(5, 4),))})
    forward, encode = program.method("forward"), program.method("encode")
    assert "aten::relu.out" in {o.key for o in encode.operators}
    assert "aten::relu.out" not in {o.key for o in forward.operators}
    const = lambda m: {(v.storage.segment, v.storage.offset) for v in m.values
                       if isinstance(v, TensorValue) and type(v.storage).__name__ == "ConstantStorage"}
    assert const(forward) == const(encode)
    assert "opforge.memory_plan.encode.arena_bytes" in program.metadata


def test_inputs_and_outputs_are_planned_and_an_input_returned_as_is_works():
    class PassThrough(torch.nn.Module):
        def forward(self, x, y):
            return x, y + 1

    method = export(PassThrough(), (torch.randn(2), torch.randn(2))).method("forward")
    assert method.outputs[0] == method.inputs[0]
    for index in method.inputs:
        assert type(method.values[index].storage).__name__ == "ArenaStorage"
