"""Out-variant derivation both ways, the variant signature and the export refusal."""

import pytest

from opforge.errors import SchemaError
from opforge.schema import FunctionSchema, SchemaKind
from opforge.schema.variants import check_exportable

P = FunctionSchema.parse

PAIRS = [
    ("my_ops::mul3(Tensor input) -> Tensor",
     "my_ops::mul3.out(Tensor input, *, Tensor(a!) out) -> Tensor(a!)"),
    ("my_ops::scale.Tensor(Tensor x, Scalar s=1, *, int[] dims=[]) -> Tensor",
     "my_ops::scale.Tensor_out(Tensor x, Scalar s=1, *, int[] dims=[], Tensor(a!) out) -> Tensor(a!)"),
    ("my_ops::split2(Tensor x) -> (Tensor, Tensor)",
     "my_ops::split2.out(Tensor x, *, Tensor(a!) out0, Tensor(b!) out1) -> (Tensor(a!), Tensor(b!))"),
    ("my_ops::topk(Tensor x, int k) -> (Tensor values, Tensor indices)",
     "my_ops::topk.out(Tensor x, int k, *, Tensor(a!) values, Tensor(b!) indices) -> (Tensor(a!) values, Tensor(b!) indices)"),
    ("my_ops::chunks(Tensor x, int n) -> Tensor[]",
     "my_ops::chunks.out(Tensor x, int n, *, Tensor(a!)[] out) -> ()"),
    ("aten::native_layer_norm(Tensor input, SymInt[] normalized_shape, Tensor? weight, Tensor? bias, float eps) -> (Tensor, Tensor, Tensor)",
     "aten::native_layer_norm.out(Tensor input, SymInt[] normalized_shape, Tensor? weight, Tensor? bias, float eps, *, Tensor(a!) out0, Tensor(b!) out1, Tensor(c!) out2) -> (Tensor(a!), Tensor(b!), Tensor(c!))"),
]


@pytest.mark.parametrize("functional, out", PAIRS)
def test_out_variant_derivation_both_ways(functional, out):
    f, o = P(functional), P(out)
    assert str(f.out_variant()) == out
    assert str(o.functional_variant()) == functional
    assert f.out_variant().kind() is SchemaKind.out
    assert f.signature() == o.signature()


def test_out_alias_sets_are_distinct_from_existing_ones():
    f = P("my::f(Tensor(a) x, Tensor y) -> (Tensor, Tensor)")
    # a view-like argument annotation does not make the op a view unless a return aliases it
    o = f.out_variant()
    names = [a.annotation.alias_set[0] for a in o.arguments.out]
    assert names == ["b", "c"]


@pytest.mark.parametrize(
    "text, why",
    [
        ("my::count(Tensor x) -> int", "return type 'int' cannot be an out argument"),
        ("my::f(Tensor x) -> (Tensor, float)", "return type 'float'"),
        ("my::f(Tensor x) -> ()", "returns nothing"),
        ("my::v(Tensor(a) x) -> Tensor(a)", "is a view"),
        ("my::f(Tensor x, Tensor out) -> Tensor", "already called 'out'"),
        ("my::f(Tensor(a!) x) -> ()", "mutates its input"),
    ],
)
def test_underivable_out_variant_says_why(text, why):
    with pytest.raises(SchemaError, match="out_variant") as info:
        P(text).out_variant()
    assert why in str(info.value)


def test_functional_variant_of_a_mutating_op_is_refused():
    with pytest.raises(SchemaError, match="not an out variant"):
        P("aten::relu_(Tensor(a!) self) -> Tensor(a!)").functional_variant()


def test_mutating_op_refused_for_export_names_the_out_variant():
    with pytest.raises(SchemaError) as info:
        check_exportable(P("my::acc_(Tensor(a!) self, Tensor x) -> Tensor(a!)"))
    msg = str(info.value)
    assert "mutates its argument 'self' in place" in msg
    assert "my::acc.out" in msg


def test_exportable_ops_pass():
    check_exportable(P("my::f(Tensor x) -> Tensor"))
    check_exportable(P("my::f.out(Tensor x, *, Tensor(a!) out) -> Tensor(a!)"))
