"""Custom ops quantize from their manifest contract: each kind, multi-output ops, the
same-node pitfall, overrides by a custom annotation, and contract errors."""

import operator
import warnings

import numpy as np
import pytest
import torch

import opforge
from opforge.errors import ManifestError
from opforge.examples.custom_model import custom_op_model
from opforge.manifest import parse_manifest
from opforge.quantize import Quantizer, quantize
from opforge.torch_bridge import register

from tests.quantize.quantize_support import calibration_samples, run_lean

DQ = torch.ops.quantized_decomposed.dequantize_per_tensor.default
Q = torch.ops.quantized_decomposed.quantize_per_tensor.default


@opforge.op("qtest::blend(Tensor a, Tensor b) -> Tensor",
            quantization={"inputs": {"b": {"shared": "a"}}, "outputs": {0: {"shared": "a"}}})
def blend(a, b):
    return (a + b) * 0.5


@opforge.op("qtest::squash(Tensor x) -> Tensor",
            quantization={"outputs": {0: {"fixed": {"min": 0.0, "max": 1.0}}}})
def squash(x):
    return torch.sigmoid(x)


@opforge.op("qtest::spread(Tensor x) -> (Tensor low, Tensor high)",
            quantization={"outputs": {"low": "quantized", "high": "float"}})
def spread(x):
    return x - 1.0, x + 1.0


for _op in (blend, squash, spread):
    register(_op.opdef)


def _quantize(model, inputs, scheme="8a8w", **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return quantize(model, inputs, scheme, calibration=calibration_samples(inputs), **kw)


def _qparams_before(node):
    """(scale, zero point) of the dequantize feeding ``node``'s first input."""
    dq = node.args[0]
    assert dq.target == DQ, dq
    return dq.args[1], dq.args[2]


def _users(graph_module, target):
    return [n for n in graph_module.graph.nodes if n.target == target]


def test_the_example_ops_follow_their_manifest_contracts():
    model, inputs = custom_op_model()
    result = _quantize(model, inputs)
    by_op = {d.op: d for d in result.report.decisions}
    assert by_op["my_ops::mul3"].scheme == "8a8w"
    assert "contract in(input=quantized)" in by_op["my_ops::mul3"].detail
    assert by_op["my_ops::minmax"].detail.startswith("contract passthrough")
    assert by_op["my_ops::scaled_sum"].scheme == "float"
    assert "says 'float'" in by_op["my_ops::scaled_sum"].detail
    assert by_op["my_ops::mul4"].scheme == "float"
    assert any("my_ops::mul4 has no quantization contract" in n for n in result.report.notes)
    gm = result.model
    (minmax,) = _users(gm, torch.ops.my_ops.minmax.default)
    scale, zp = _qparams_before(minmax)
    # passthrough: both getitem outputs are quantized with the input's qparams
    for item in minmax.users:
        (q,) = item.users
        assert q.target == Q and (q.args[1], q.args[2]) == (scale, zp)
    # float: scaled_sum reads a dequantized float and has no annotation of its own (its
    # output is quantized only where a consumer, the add, asks for it)
    (ssum,) = _users(gm, torch.ops.my_ops.scaled_sum.default)
    assert ssum.args[0].target == DQ
    assert "quantization_annotation" not in ssum.meta
    assert result.report.sqnr_db > 25


def test_the_example_ops_run_on_lean_with_their_kernels():
    from opforge.examples.my_ops_numpy import register_example_kernels
    from opforge.runtime import KernelRegistry

    model, inputs = custom_op_model()
    result = _quantize(model, inputs)
    registry = KernelRegistry.portable()
    register_example_kernels(registry)
    (got,) = run_lean(result.export(), inputs, registry)
    want = result.model(*inputs).detach().numpy()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


class TwoInputs(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.ops.qtest.blend(self.a(x), self.b(x))


def test_shared_input_and_output_qparams():
    model = TwoInputs().eval()
    inputs = (torch.randn(4, 8),)
    gm = _quantize(model, inputs).model
    (node,) = _users(gm, torch.ops.qtest.blend.default)
    a, b = node.args
    assert (a.args[1], a.args[2]) == (b.args[1], b.args[2])  # b shares a's qparams
    (q,) = node.users
    assert (q.args[1], q.args[2]) == (a.args[1], a.args[2])  # so does the output


class SameNodeTwice(torch.nn.Module):
    def forward(self, x):
        return torch.ops.qtest.blend(x, x)


def test_the_same_node_for_two_inputs_does_not_recurse():
    # the reference's pitfall: a SharedQuantizationSpec between two inputs that are the
    # same node makes prepare recurse forever; the contract code leaves it out
    result = _quantize(SameNodeTwice().eval(), (torch.randn(4, 8),))
    assert result.report.decision("blend").scheme == "8a8w"


class Squash(torch.nn.Module):
    def forward(self, x):
        return torch.ops.qtest.squash(x * 2.0)


@pytest.mark.parametrize("scheme,qmax", [("8a8w", 255), ("16a8w", 65535)])
def test_fixed_output_range(scheme, qmax):
    gm = _quantize(Squash().eval(), (torch.randn(4, 8),), scheme).model
    (node,) = _users(gm, torch.ops.qtest.squash.default)
    (q,) = node.users
    assert q.args[1] == pytest.approx(1.0 / qmax) and q.args[2] == 0


class Spread(torch.nn.Module):
    def forward(self, x):
        low, high = torch.ops.qtest.spread(x)
        return low, high


def test_multi_output_specs_go_on_the_getitem_users():
    gm = _quantize(Spread().eval(), (torch.randn(4, 8),)).model
    (node,) = _users(gm, torch.ops.qtest.spread.default)
    items = {u.args[1]: u for u in node.users if u.target is operator.getitem}
    assert [u.target for u in items[0].users] == [Q]      # low: quantized
    assert all(u.target != Q for u in items[1].users)     # high: float


def test_a_custom_annotation_overrides_the_contract():
    def keep_mul3_float(gm):
        for node in gm.graph.nodes:
            if node.target == torch.ops.my_ops.mul3.default:
                node.meta.pop("quantization_annotation", None)

    model, inputs = custom_op_model()
    quantizer = Quantizer("8a8w")
    quantizer.add_custom_quant_annotations([keep_mul3_float])
    result = _quantize(model, inputs, quantizer=quantizer)
    decision = next(d for d in result.report.decisions if d.op == "my_ops::mul3")
    assert decision.scheme == "custom" and "keep_mul3_float" in decision.detail
    (mul3,) = _users(result.model, torch.ops.my_ops.mul3.default)
    assert "quantization_annotation" not in mul3.meta


@pytest.mark.parametrize("contract,message", [
    ("{inputs: {other: quantized}}", "input 'other' is not a tensor input of the op"),
    ("{outputs: {3: quantized}}", "output 3 is not an output of the op"),
    ("{inputs: {input: float}, outputs: {0: {shared: input}}}", "which is not a quantized input"),
    ("{outputs: {0: {fixed: {min: 1.0, max: 2.0}}}}", "0 inside the range"),
    ("sometimes", "'float', 'passthrough', 'integer' or a mapping"),
    ("{inputs: {input: int8}}", "rule 'int8'"),
])
def test_contract_errors_name_the_entry(contract, message):
    text = f"- func: bad::op(Tensor input, int dim) -> Tensor\n  quantization: {contract}\n"
    with pytest.raises(ManifestError) as info:
        parse_manifest(text, "bad.yaml")
    assert "bad.yaml:2" in str(info.value) and message in str(info.value)


@opforge.op("qtest::row_max(Tensor x) -> Tensor", quantization="integer")
def row_max(x):
    return x.amax(dim=-1)


@opforge.op("qtest::row_max_float(Tensor x) -> Tensor", quantization="passthrough")
def row_max_float(x):
    return x.amax(dim=-1)


for _op in (row_max, row_max_float):
    _op.register_fake(lambda x: x.new_empty(x.shape[:-1]))


@opforge.op("qtest::pairwise_max(Tensor a, Tensor b) -> Tensor", quantization="integer")
def pairwise_max(a, b):
    return torch.maximum(a, b)


for _op in (row_max, row_max_float, pairwise_max):
    register(_op.opdef)


class RowMax(torch.nn.Module):
    def __init__(self, op):
        super().__init__()
        self.a, self.b, self.op = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8), op

    def forward(self, x):
        m = self.op(self.a(x).reshape(4, 2, 4))
        return torch.ops.qtest.pairwise_max(m, m * 0.5) + 1


@pytest.mark.parametrize("scheme", ["8a8w", "16a8w"])
def test_an_integer_contract_runs_the_kernel_on_the_integers(scheme):
    from opforge.runtime import KernelRegistry

    inputs = (torch.randn(4, 8),)
    torch.manual_seed(0)
    result = _quantize(RowMax(torch.ops.qtest.row_max).eval(), inputs, scheme)
    torch.manual_seed(0)
    reference = _quantize(RowMax(torch.ops.qtest.row_max_float).eval(), inputs, scheme)
    gm = result.model
    (node,) = _users(gm, torch.ops.qtest.row_max.default)
    assert node.args[0].target == Q                  # reads the integers
    (pair,) = _users(gm, torch.ops.qtest.pairwise_max.default)
    # its integers go to a dequantize and, unchanged, to the next integer op
    assert {u.target for u in node.users} == {DQ, torch.ops.qtest.pairwise_max.default}
    assert pair.args[0] is node and pair.args[1].target == Q  # one set of qparams
    assert "runs on the integers" in result.report.decision(node.name).detail
    # exactly what the float (passthrough) version computes
    torch.testing.assert_close(gm(*inputs), reference.model(*inputs), rtol=0, atol=0)
    registry = KernelRegistry.portable()

    def row_max_out(x, out):
        np.amax(x, axis=-1, out=out)

    def pairwise_max_out(a, b, out):
        np.maximum(a, b, out=out)

    registry.register("qtest::row_max.out", row_max_out, origin="test", target="portable")
    registry.register("qtest::pairwise_max.out", pairwise_max_out, origin="test", target="portable")
    program = result.export()
    (got,) = run_lean(program, inputs, registry)
    np.testing.assert_array_equal(got, gm(*inputs).detach().numpy())


def test_the_integer_kind_parses_as_shared_passthrough():
    (d,) = parse_manifest("- func: q::m(Tensor a, Tensor b) -> Tensor\n  quantization: integer\n", "m.yaml")
    assert d.quantization.on_integers and d.quantization.describe() == "integer"
    assert dict(d.quantization.inputs)["b"].input == "a"
