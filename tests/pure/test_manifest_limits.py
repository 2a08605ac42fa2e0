"""Hostile manifest YAML is refused with ManifestError (file:line and the limit), never with
MemoryError or RecursionError, and no error message grows with the user's value."""

import pytest

from opforge.errors import ManifestError, shown
from opforge.manifest import parse_manifest
from opforge.manifest.yaml_source import MAX_ALIAS_NODES, MAX_DEPTH, load_yaml

ENTRY = "- func: my_ops::f(Tensor x) -> Tensor\n"


def billion_laughs() -> str:
    """Nine lists of nine aliases of the list before: 9**9 strings in ~500 bytes."""
    lines = ["a: &a [" + ", ".join(['"x"'] * 9) + "]"]
    for prev, name in zip("abcdefgh", "bcdefghi"):
        lines.append(f"{name}: &{name} [" + ", ".join([f"*{prev}"] * 9) + "]")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("text", [
    billion_laughs(),
    # the same inside an entry, where validation would format the value in its error
    "- x: &a [" + ", ".join(['"x"'] * 9) + "]\n" + "".join(
        f"  {n}: &{n} [" + ", ".join([f"*{p}"] * 9) + "]\n"
        for p, n in zip("abcdefgh", "bcdefghi")) + ENTRY + "  kernels: *i\n",
], ids=["mapping", "manifest"])
def test_billion_laughs_is_refused_by_the_alias_limit(text):
    with pytest.raises(ManifestError) as info:
        parse_manifest(text, "laughs.yaml")
    msg = str(info.value)
    assert msg.startswith("`opforge manifest`: laughs.yaml:")
    assert "alias *" in msg and f"at most {MAX_ALIAS_NODES} nodes added by aliases" in msg
    assert "fix:" in msg and len(msg) < 600


def _aliases_adding(nodes: int) -> str:
    """A document whose aliases add exactly ``nodes`` nodes (a list of 999 + itself = 1000)."""
    assert nodes % 1000 == 0
    return ("s: &s 0\na: &a [" + ", ".join(["0"] * 999) + "]\n"
            "b: [" + ", ".join(["*a"] * (nodes // 1000)) + "]\n")


def test_aliases_are_counted_exactly_up_to_the_limit():
    data = load_yaml(_aliases_adding(MAX_ALIAS_NODES), "limit.yaml")
    assert len(data["b"]) == MAX_ALIAS_NODES // 1000 and data["b"][0] is data["a"]
    with pytest.raises(ManifestError, match=r"limit.yaml:4: alias \*s .* at most"):
        load_yaml(_aliases_adding(MAX_ALIAS_NODES) + "c: *s\n", "limit.yaml")


def test_a_manifest_with_a_few_aliases_loads():
    text = """\
- func: my_ops::f.out(Tensor x, *, Tensor(a!) out) -> Tensor(a!)
  type_alias: &types {T0: [Float, Double]}
  kernels: &kernels
    - arg_meta: {x: [T0], out: [T0]}
      kernel_name: custom::f_out
- func: my_ops::g.out(Tensor x, *, Tensor(a!) out) -> Tensor(a!)
  type_alias: *types
  kernels: *kernels
  <<: {doc: merged from a mapping}
"""
    f, g = parse_manifest(text, "aliases.yaml")
    assert [b.dtype_key for b in f.kernels] == [b.dtype_key for b in g.kernels] == [
        "v1/6|6", "v1/7|7"]
    assert g.doc == "merged from a mapping" and g.source == "aliases.yaml:6"


def test_a_recursive_alias_is_refused():
    with pytest.raises(ManifestError, match=r"r.yaml:2: alias \*a — refers to a list or mapping"):
        parse_manifest(ENTRY + "  doc: &a [1, *a]\n", "r.yaml")


@pytest.mark.parametrize("value", ["[" * 300 + "]" * 300, "{a: " * 300 + "1" + "}" * 300,
                                   "[" * 5000 + "]" * 5000])
def test_deep_nesting_is_a_manifest_error_not_a_recursion_error(value):
    with pytest.raises(ManifestError) as info:
        parse_manifest(ENTRY + f"  doc: {value}\n", "deep.yaml")
    msg = str(info.value)
    assert msg.startswith("`opforge manifest`: deep.yaml:2: ")
    assert f"nested {MAX_DEPTH + 1} deep" in msg and f"at most {MAX_DEPTH} levels" in msg


def test_nesting_is_counted_exactly_up_to_the_limit():
    assert load_yaml("[" * MAX_DEPTH + "]" * MAX_DEPTH, "d.yaml") is not None
    with pytest.raises(ManifestError, match=f"d.yaml:1: .* nested {MAX_DEPTH + 1} deep"):
        load_yaml("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), "d.yaml")


def test_an_integer_python_cannot_convert_is_a_manifest_error():
    with pytest.raises(ManifestError, match=r"big.yaml:2: an integer — 5000 characters long"):
        parse_manifest(ENTRY + "  doc: " + "7" * 5000 + "\n", "big.yaml")


HUGE = 20_000  # characters or items; a message quoting it whole would be ~100 kB
# (entry lines after "- ", the part of the message that must be there)
HUGE_VALUES = [
    (f"{ENTRY[2:]}  type_alias: {{T0: [{', '.join(['Float'] * HUGE)}, Nope]}}\n"
     "  kernels: [{arg_meta: {x: [T0]}, kernel_name: c::f}]\n", "a type alias is a list"),
    (f"{ENTRY[2:]}  dim_order_alias: {{D0: [[{', '.join(map(str, range(HUGE)))}, 0]]}}\n"
     "  kernels: [{arg_meta: {x: [Float, D0]}, kernel_name: c::f}]\n", "dim order alias"),
    (f"{ENTRY[2:]}  kernels: [{{arg_meta: null, kernel_name: {'k' * HUGE}-}}]\n", "kernel_name"),
    (f"{ENTRY[2:]}  kernels: [{{arg_meta: {{x: [{'T' * HUGE}]}}, kernel_name: c::f}}]\n",
     "is neither a type alias"),
    (f"{ENTRY[2:]}  kernels: [{{arg_meta: {{? {'x' * HUGE} : [Float]}}, kernel_name: c::f}}]\n",
     "not a tensor argument"),
    (f"{ENTRY[2:]}  kernels: [{{arg_meta: {{x: [[{', '.join(['1'] * HUGE)}]]}}, "
     "kernel_name: c::f}]\n", "is neither a type alias"),
    (f"{ENTRY[2:]}  python: '{'m' * HUGE}'\n", "is not a 'module:function' reference"),
    (f"{ENTRY[2:]}  ? {'k' * HUGE}\n  : 1\n", "unknown key"),  # a long key is explicit
    (f"func: my_ops::f(Tensor x, {'Tensor y, ' * (HUGE // 10)}Tensr z) -> Tensor\n",
     "invalid schema"),
    (f"func: my_ops::{'f' * HUGE}(Tensor(a!) x) -> Tensor(a!)\n", "mutates its input"),
    (f"op: {'a' * HUGE}\n", "is not an ATen operator"),
    (f"func: [{', '.join(['1'] * HUGE)}]\n", "must be a schema string"),
]


@pytest.mark.parametrize("entry, words", HUGE_VALUES, ids=[w for _, w in HUGE_VALUES])
def test_an_error_about_a_huge_value_has_a_bounded_message(entry, words):
    with pytest.raises(ManifestError) as info:
        parse_manifest("- " + entry, "huge.yaml")
    msg = str(info.value)
    assert words in msg and msg.startswith("`opforge manifest`: huge.yaml:")
    assert len(msg) < 1500, len(msg)


def test_an_item_that_is_not_a_mapping_is_shown_cut():
    with pytest.raises(ManifestError) as info:
        parse_manifest("- [" + ", ".join(["1"] * HUGE) + "]\n", "huge.yaml")
    assert "every entry is a mapping" in str(info.value) and len(str(info.value)) < 500


def test_shown_cuts_values_without_formatting_them_whole():
    assert shown("abc") == "'abc'" and shown([1, (2,), {"k": None}]) == "[1, (2,), {'k': None}]"
    long = shown("x" * 10**7)
    assert len(long) == 200 and long.endswith("…") and long.startswith("'xxx")
    loop: list = [1]
    loop.append(loop)
    assert shown(loop).startswith("[1, [1, [1, ") and len(shown(loop)) <= 200
    assert shown(10**5000) == "<an integer of 16610 bits>"
    assert shown(list(range(10**6)), limit=20) == "[0, 1, 2, 3, 4, 5, …"
