"""Hostile schema strings get SchemaError with a column, never RecursionError or ValueError,
and an error about a long schema shows the part around the caret."""

import pytest

from opforge.errors import SchemaError
from opforge.schema import FunctionSchema, parse_type
from opforge.schema.parser import MAX_TYPE_DEPTH


def _column(err: SchemaError) -> int:
    return int(str(err).split("at column ")[1].split(" ")[0])


def _shown_at_caret(err: SchemaError) -> str:
    """The character the caret points at, in the shown (possibly cut) schema line."""
    *_, line, caret = str(err).split("\n")
    return line[len(caret) - 1]


# (text, its part before the type's suffixes, the suffix pattern repeated)
DEEP = [
    ("ns::f(Tensor" + "[]" * 500 + " x) -> Tensor", "ns::f(Tensor", "[]"),
    ("ns::f(int" + "[]?" * 300 + " x) -> Tensor", "ns::f(int", "[]?"),
    ("ns::f(Tensor x) -> Tensor" + "[]" * 1000, "ns::f(Tensor x) -> Tensor", "[]"),
    ("ns::f(Tensor x) -> (Tensor" + "?[3]" * 400 + ", Tensor)", "ns::f(Tensor x) -> (Tensor",
     "?[3]"),
    ("ns::f(Tensor(a!)" + "[]" * 400 + " out) -> ()", "ns::f(Tensor(a!)", "[]"),
]


@pytest.mark.parametrize("text, before, unit", DEEP, ids=range(len(DEEP)))
def test_deeply_nested_types_are_a_schema_error(text, before, unit):
    with pytest.raises(SchemaError) as info:
        FunctionSchema.parse(text)
    msg = str(info.value)
    assert f"at most {MAX_TYPE_DEPTH} '?' and '[]' suffixes" in msg
    # the caret is on the first suffix past the limit
    per_unit = unit.count("?") + unit.count("[")
    assert _column(info.value) == len(before) + len(unit) * MAX_TYPE_DEPTH // per_unit + 1
    assert _shown_at_caret(info.value) == unit[0]
    assert len(msg) < 800


def test_type_depth_is_counted_exactly_up_to_the_limit():
    ok = "ns::f(Tensor" + "?[]" * (MAX_TYPE_DEPTH // 2) + " x) -> Tensor"
    assert str(FunctionSchema.parse(ok)) == ok
    assert str(parse_type("int" + "[]" * MAX_TYPE_DEPTH)) == "int" + "[]" * MAX_TYPE_DEPTH
    with pytest.raises(SchemaError, match="suffix 33 of type 'int'"):
        parse_type("int" + "[]" * (MAX_TYPE_DEPTH + 1))


@pytest.mark.parametrize("text, column, expected", [
    ("ns::f(Tensor x) -> " + "(" * 500 + "Tensor" + ")" * 500, 21, "a type such as"),
    ("ns::f(Tensor" + "(" * 500 + "a" + ")" * 500 + " x) -> Tensor", 14, "an alias set name"),
    ("ns::f(int[" + "9" * 5000 + "] x) -> Tensor", 11, "a list size of at most 18 digits"),
    ("ns::f(int x=" + "[" * 5000 + ") -> Tensor", 13, "an integer"),
])
def test_nested_parentheses_and_huge_numbers_are_a_schema_error(text, column, expected):
    with pytest.raises(SchemaError) as info:
        FunctionSchema.parse(text)
    assert _column(info.value) == column and expected in str(info.value)
    assert _shown_at_caret(info.value) == text[column - 1]
    assert len(str(info.value)) < 800


@pytest.mark.parametrize("where", [10, 5000, 19_990])
def test_a_long_schema_is_shown_around_the_caret(where):
    names = [f"a{i}" for i in range(20_000)]
    names[where] = "a1"  # a duplicate argument name at argument `where`
    text = "ns::f(" + ", ".join(f"int {n}" for n in names) + ") -> ()"
    with pytest.raises(SchemaError) as info:
        FunctionSchema.parse(text)
    column = _column(info.value)
    assert column == len("ns::f(" + ", ".join(f"int {n}" for n in names[:where]) + ", int ") + 1
    assert _shown_at_caret(info.value) == "a"
    assert len(str(info.value)) < 800


def test_a_huge_identifier_is_shown_cut():
    with pytest.raises(SchemaError) as info:
        FunctionSchema.parse("ns::f(" + "T" * 100_000 + " x) -> Tensor")
    assert "unknown type 'TTT" in str(info.value) and len(str(info.value)) < 1500
