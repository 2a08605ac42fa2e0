"""The schema parser: grammar coverage, lossless round trip, and caret diagnostics."""

import pytest

from opforge.errors import SchemaError
from opforge.schema import (
    Annotation,
    BaseType,
    FunctionSchema,
    ListType,
    OptionalType,
    SchemaKind,
    parse_type,
)

VALID = [
    "my_ops::mul3(Tensor input) -> Tensor",
    "my_ops::mul3.out(Tensor input, *, Tensor(a!) out) -> Tensor(a!)",
    "aten::add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor",
    "aten::add_.Tensor(Tensor(a!) self, Tensor other, *, Scalar alpha=1) -> Tensor(a!)",
    "aten::view(Tensor(a) self, SymInt[] size) -> Tensor(a)",
    "aten::unbind.int(Tensor(a -> *) self, int dim=0) -> Tensor(a)[]",
    "max.dim(Tensor self, int dim, bool keepdim=False) -> (Tensor values, Tensor indices)",
    "aten::_foreach_add.List(Tensor[] self, Tensor[] other, *, Scalar alpha=1) -> Tensor[]",
    "index.Tensor(Tensor self, Tensor?[] indices) -> Tensor",
    "max_pool2d(Tensor self, int[2] kernel_size, int[2] stride=[], int[2] padding=0, int[2] dilation=1, bool ceil_mode=False) -> Tensor",
    "x::f(Tensor? w=None, float eps=1e-05, str mode='mean', str m2=\"valid\", bool flag=True) -> Tensor",
    "x::g(ScalarType? dtype=None, Layout? layout=None, Device? device=None, MemoryFormat memory_format=contiguous_format) -> Tensor",
    "x::h(Generator? generator=None, SymInt n=-1, Scalar? s=None, bool[3] mask=[True, False, True]) -> ()",
    "x::k(int reduction=Mean, float[]? scales=None, ScalarType dtype=long, int big=9223372036854775807) -> (Tensor, Tensor)",
    "x::noargs() -> Tensor",
    "x::kwonly(*, Tensor(a!) out) -> Tensor(a!)",
    "x::alias_union(Tensor(a|b) self) -> Tensor(a|b)",
    "x::named_single(Tensor theta) -> Tensor grid",
    "__and__.Tensor(Tensor self, Tensor other) -> Tensor",
    "x::lists(int[] a, int[1]? b=None, SymInt[]? c=None, Tensor(a!)[] out) -> ()",
]


@pytest.mark.parametrize("text", VALID)
def test_round_trip(text):
    schema = FunctionSchema.parse(text)
    assert str(schema) == text
    assert FunctionSchema.parse(str(schema)) == schema


def test_structure_of_an_out_variant():
    s = FunctionSchema.parse("aten::add.out(Tensor self, Tensor other, *, Scalar alpha=1, Tensor(a!) out) -> Tensor(a!)")
    assert (s.name.namespace, s.name.name, s.name.overload) == ("aten", "add", "out")
    assert s.name.qualified == "aten::add.out"
    assert [a.name for a in s.arguments.positional] == ["self", "other"]
    assert [a.name for a in s.arguments.kwarg_only] == ["alpha", "out"]
    assert [a.name for a in s.arguments.out] == ["out"]
    assert s.arguments.flat[2].default == "1"
    assert s.arguments.out[0].annotation == Annotation(("a",), True)
    assert s.kind() is SchemaKind.out


def test_types():
    assert parse_type("Tensor?[]") == ListType(OptionalType(BaseType("Tensor")))
    assert parse_type("int[2]") == ListType(BaseType("int"), 2)
    assert parse_type("SymInt[]?") == OptionalType(ListType(BaseType("SymInt")))
    s = FunctionSchema.parse("aten::unbind.int(Tensor(a -> *) self, int dim=0) -> Tensor(a)[]")
    ann = s.arguments.flat[0].annotation
    assert ann.alias_set == ("a",) and ann.alias_set_after == ("*",) and not ann.is_write
    assert s.returns[0].type == ListType(BaseType("Tensor"))


@pytest.mark.parametrize(
    "text, kind, view",
    [
        ("my::f(Tensor x) -> Tensor", SchemaKind.functional, False),
        ("my::f.out(Tensor x, *, Tensor(a!) out) -> Tensor(a!)", SchemaKind.out, False),
        ("aten::relu_(Tensor(a!) self) -> Tensor(a!)", SchemaKind.inplace, False),
        ("aten::__iand__.Tensor(Tensor(a!) self, Tensor other) -> Tensor(a!)", SchemaKind.inplace, False),
        ("my::acc(Tensor(a!) acc, Tensor x) -> ()", SchemaKind.mutable, False),
        ("aten::view(Tensor(a) self, SymInt[] size) -> Tensor(a)", SchemaKind.functional, True),
    ],
)
def test_classification(text, kind, view):
    s = FunctionSchema.parse(text)
    assert s.kind() is kind
    assert s.is_view() is view
    assert s.is_mutating() is (kind in (SchemaKind.inplace, SchemaKind.mutable))


# (bad schema, column of the caret (1-based), words the expectation must contain)
BAD = [
    ("my::f(Tensor x) Tensor", 16, "' -> '"),
    ("my::f(Tensor x -> Tensor", 15, "')' to close the argument list"),
    ("my::f(Tensor x)) -> Tensor", 16, "' -> '"),
    ("my::f(Tensr x) -> Tensor", 7, "a known type"),
    ("my::f(Tensor x, int x) -> Tensor", 21, "unique argument name"),
    ("my::f(int k=1.5) -> Tensor", 13, "an integer"),
    ("my::f(bool b=1) -> Tensor", 14, "True or False"),
    ("my::f(Tensor t=None) -> Tensor", 16, "optional"),
    ("my::f(str s=mean) -> Tensor", 13, "quoted string"),
    ("my::f(Tensor x) -> (Tensor", 27, "')' to close the returns"),
    ("my::f(Tensor x) -> (Tensor)", 20, "without parentheses"),
    ("my::f(Tensor(a! x) -> Tensor", 16, "')' to close the alias annotation"),
    ("my::f(Tensor x, *) -> Tensor", 17, "keyword-only argument after '*'"),
    ("my::f(int[ x) -> Tensor", 11, "']'"),
    ("(Tensor x) -> Tensor", 1, "operator name"),
    ("my::f(Tensor x) -> Tensor extra junk", 32, "end of the schema"),
]


@pytest.mark.parametrize("text, column, expected", BAD)
def test_malformed_schema_shows_caret_and_expectation(text, column, expected):
    with pytest.raises(SchemaError) as info:
        FunctionSchema.parse(text)
    msg = str(info.value)
    assert expected in msg
    assert f"column {column}" in msg
    lines = msg.splitlines()
    # The string is shown, and the caret line points at the reported column.
    assert lines[-2] == "  " + text
    assert lines[-1] == "  " + " " * (column - 1) + "^"


def test_non_string_is_rejected():
    with pytest.raises(SchemaError, match="a schema is a string"):
        FunctionSchema.parse(None)
