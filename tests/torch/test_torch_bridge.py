"""Registration with PyTorch: eager, out variant, fake, opcheck, torch.export, duplicates."""

import pytest
import torch

import opforge
from opforge.errors import KernelError, RegistrationError
from opforge.examples.my_ops import register_examples
from opforge.manifest import parse_manifest
from opforge.torch_bridge import register

# torch's functionalization (used by opcheck's aot_dispatch test) does not support custom
# ops whose *returns* alias an input, and an out variant returns its `Tensor(a!) out` by
# definition (ATen and ExecuTorch convention). The other three checks run on out variants.
OUT_CHECKS = ("test_schema", "test_autograd_registration", "test_faketensor")


@pytest.fixture(scope="module")
def my_ops():
    register_examples()
    return torch.ops.my_ops


SHAPES = [(), (0,), (7,), (3, 4), (2, 3, 5)]
DTYPES = [torch.float32, torch.float64, torch.int32, torch.int64]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_yaml_ops_eager_match_their_semantics(my_ops, shape, dtype):
    x = (torch.randn(shape) * 10).to(dtype)
    # Exact: multiplying by a small integer is exact in every dtype here.
    torch.testing.assert_close(my_ops.mul3(x), x * 3, rtol=0, atol=0)
    out = torch.empty_like(x)
    assert my_ops.mul4.out(x, output=out) is out
    torch.testing.assert_close(out, x * 4, rtol=0, atol=0)


def test_yaml_ops_pass_opcheck(my_ops):
    x = torch.randn(3, 4, 5)
    torch.library.opcheck(my_ops.mul3.default, (x,))
    torch.library.opcheck(my_ops.mul3.out, (x,), {"output": torch.empty_like(x)}, test_utils=OUT_CHECKS)
    # two outputs
    torch.library.opcheck(my_ops.minmax.default, (x, 1))
    torch.library.opcheck(my_ops.minmax.out, (x, 1), {"min": torch.empty(3, 5), "max": torch.empty(3, 5)},
                          test_utils=OUT_CHECKS)
    # scalar and int-list arguments
    torch.library.opcheck(my_ops.scaled_sum.default, (x, 0.5, [0, 2]), {"keepdim": True})
    torch.library.opcheck(my_ops.scaled_sum.out, (x, 2, [1]), {"out": torch.empty(3, 5)}, test_utils=OUT_CHECKS)


@opforge.op("bridge_test::topk2(Tensor x, int k, *, bool largest=True) -> (Tensor values, Tensor indices)")
def topk2(x, k, *, largest=True):
    v, i = torch.topk(x, k, dim=-1, largest=largest)
    return v, i


@topk2.register_fake
def _(x, k, *, largest=True):
    shape = (*x.shape[:-1], k)
    return x.new_empty(shape), x.new_empty(shape, dtype=torch.int64)


@opforge.op("bridge_test::affine(Tensor x, float[] scale, Scalar shift=0, int[2] pad=0) -> Tensor")
def affine(x, scale, shift=0, pad=0):
    return x * scale[0] + shift


def test_decorator_ops_pass_opcheck():
    register([topk2.opdef, affine.opdef])
    x = torch.randn(4, 6)
    ops = torch.ops.bridge_test
    torch.library.opcheck(ops.topk2.default, (x, 3), {"largest": False})
    torch.library.opcheck(ops.topk2.out, (x, 2), {"values": torch.empty(4, 2),
                                                    "indices": torch.empty(4, 2, dtype=torch.int64)},
                          test_utils=OUT_CHECKS)
    torch.library.opcheck(ops.affine.default, (x, [2.0]), {"shift": 1.5})
    torch.library.opcheck(ops.affine.out, (x, [2.0, 3.0], 1), {"out": torch.empty(4, 6)}, test_utils=OUT_CHECKS)
    v, i = ops.topk2(x, 3)
    torch.testing.assert_close((v, i), torch.topk(x, 3))
    assert topk2(x, 1)[0].shape == (4, 1)  # the decorated function still calls the reference


def test_registered_op_survives_torch_export(my_ops):
    class M(torch.nn.Module):
        def forward(self, x):
            lo, hi = torch.ops.my_ops.minmax(torch.ops.my_ops.mul3(x), 1)
            return torch.ops.my_ops.scaled_sum(hi - lo, 2.0, [0])

    x = torch.randn(3, 4)
    ep = torch.export.export(M(), (x,))
    targets = {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}
    assert {"my_ops.mul3.default", "my_ops.minmax.default", "my_ops.scaled_sum.default"} <= targets
    ep = ep.run_decompositions()  # custom ops stay opaque through core-ATen decomposition
    targets = {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}
    assert "my_ops.mul3.default" in targets
    torch.testing.assert_close(ep.module()(x), M()(x))


def test_registering_twice_names_the_first_source(my_ops):
    (again,) = parse_manifest("- func: my_ops::mul3(Tensor input) -> Tensor\n", "second.yaml")
    with pytest.raises(RegistrationError) as info:
        register(again)
    msg = str(info.value)
    assert "my_ops.yaml:8" in msg and "second.yaml:1" in msg


def test_name_taken_by_torch_itself():
    (clash,) = parse_manifest("- func: prims::my_thing(Tensor x) -> Tensor\n", "x.yaml")
    register(clash)  # a free name in an existing namespace is fine
    (clash,) = parse_manifest("- func: aten_like::relu(Tensor x) -> Tensor\n", "x.yaml")
    register(clash)
    lib = torch.library.Library("outside_ops", "FRAGMENT")
    lib.define("thing(Tensor x) -> Tensor")
    (taken,) = parse_manifest("- func: outside_ops::thing(Tensor x) -> Tensor\n", "x.yaml")
    with pytest.raises(RegistrationError, match="defined outside opforge"):
        register(taken)


def test_op_without_implementation_or_fake_explains_the_fix():
    (d,) = parse_manifest("- func: bridge_test::nothing(Tensor x) -> Tensor[]\n", "n.yaml")
    register(d)
    with pytest.raises(KernelError, match="no eager implementation"):
        torch.ops.bridge_test.nothing(torch.ones(2))
    class M(torch.nn.Module):
        def forward(self, x):
            return torch.ops.bridge_test.nothing(x)
    with pytest.raises(Exception, match="has no fake"):
        torch.export.export(M(), (torch.ones(2),))


def test_top_level_export_is_callable_and_the_package():
    import opforge.export as export_pkg

    assert opforge.export is export_pkg
    program = opforge.export(torch.nn.ReLU(), (torch.randn(2, 3),))
    assert [op.key for op in program.method("forward").operators] == ["aten::relu.out"]
