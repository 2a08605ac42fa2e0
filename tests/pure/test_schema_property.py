"""Property tests: generated schemas round-trip, and derivation is an involution."""

from hypothesis import given, settings
from hypothesis import strategies as st

from opforge.schema import FunctionSchema, SchemaKind

# Not the out variant's argument names, nor the named returns' (r0..r2): an input that
# takes the name an out argument needs is refused (test_input_named_like_a_return below).
IDENT = st.from_regex(r"[a-z][a-z0-9_]{0,6}", fullmatch=True).filter(
    lambda s: s not in {"out", "out0", "out1", "out2", "r0", "r1", "r2"})

# (type text, defaults valid for it)
TYPES = [
    ("Tensor", []), ("Tensor?", ["None"]), ("Tensor[]", []), ("Tensor?[]", []),
    ("int", ["0", "-1", "7"]), ("SymInt", ["0"]), ("int[]", ["[]", "[0, 1]"]), ("int[2]", ["1", "[1, 1]"]),
    ("int?", ["None", "3"]), ("SymInt[]?", ["None"]), ("float", ["1e-05", "0.5", "2"]),
    ("float[]?", ["None"]), ("bool", ["True", "False"]), ("bool[3]", ["[True, False, True]"]),
    ("str", ["'mean'", '"valid"']), ("str?", ["None"]), ("Scalar", ["1", "0.5"]), ("Scalar?", ["None"]),
    ("ScalarType?", ["None", "float"]), ("Layout?", ["None"]), ("Device?", ["None"]),
    ("MemoryFormat?", ["None", "contiguous_format"]), ("Generator?", ["None"]),
]


@st.composite
def arguments(draw, n):
    names = draw(st.lists(IDENT, min_size=n, max_size=n, unique=True))
    out = []
    for name in names:
        t, defaults = draw(st.sampled_from(TYPES))
        default = draw(st.sampled_from([None, *defaults])) if defaults else None
        out.append(f"{t} {name}" + (f"={default}" if default is not None else ""))
    return out


@st.composite
def functional_schemas(draw):
    ns, name = draw(IDENT), draw(IDENT)
    overload = draw(st.sampled_from(["", ".Tensor", ".dim", ".Scalar"]))
    args = draw(arguments(draw(st.integers(0, 6))))
    star = draw(st.integers(0, len(args)))
    if star < len(args) and draw(st.booleans()):
        args = args[:star] + ["*"] + args[star:]
    n_ret = draw(st.integers(1, 3))
    named = draw(st.booleans()) and n_ret > 1
    rets = [f"Tensor r{i}" if named else "Tensor" for i in range(n_ret)]
    ret = rets[0] if n_ret == 1 else "(" + ", ".join(rets) + ")"
    return f"{ns}::{name}{overload}({', '.join(args)}) -> {ret}"


@settings(max_examples=300, deadline=None)
@given(functional_schemas())
def test_generated_schemas_round_trip_and_derive(text):
    f = FunctionSchema.parse(text)
    assert str(f) == text
    assert f.kind() is SchemaKind.functional
    o = f.out_variant()
    assert o.kind() is SchemaKind.out
    assert FunctionSchema.parse(str(o)) == o
    assert o.functional_variant() == f
    assert o.signature() == f.signature()
    assert len(o.arguments.out) == len(f.returns)


def test_input_named_like_a_return_is_refused_when_deriving_the_out_variant():
    import pytest

    from opforge.errors import SchemaError

    f = FunctionSchema.parse("a::a(Tensor a, Tensor r0) -> (Tensor r0, Tensor r1)")
    with pytest.raises(SchemaError, match="already called 'r0'"):
        f.out_variant()
