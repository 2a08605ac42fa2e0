"""Skeleton generation (pure Python): typed signatures from OpDefs, and OpDefs a skeleton
cannot be made from, each with a clear error."""

import pytest

from opforge.backends.oppackage import generate_skeleton, parse_opdef_xml, skeleton_ops
from opforge.backends.oppackage.skeleton import render_glue
from opforge.errors import ManifestError


def _pkg(body: str, version="1.0"):
    return parse_opdef_xml(f'<OpDefCollection PackageName="P" Version="{version}"><OpDefList><OpDef>'
                           f"<Name>Op</Name>{body}"
                           "<Output><Name>y</Name><Datatype>QNN_DATATYPE_FLOAT_32</Datatype></Output>"
                           "</OpDef></OpDefList></OpDefCollection>", "s.xml")


def _param(name, dtype, default=None, rank="SCALAR", enum=""):
    d = f"<Default>{default}</Default>" if default is not None else ""
    return (f"<Parameter><Name>{name}</Name><Mandatory>false</Mandatory><Datatype>{dtype}</Datatype>"
            f"<Shape><Rank>{rank}</Rank></Shape>{d}{enum}</Parameter>")


@pytest.mark.parametrize("param,decl,default", [
    (_param("k", "QNN_DATATYPE_INT_32", "-3"), "int32_t k", "-3"),
    (_param("k", "QNN_DATATYPE_UINT_8", "0x10"), "uint8_t k", "16"),
    (_param("k", "QNN_DATATYPE_FLOAT_64", "2.5"), "double k", "2.5"),
    (_param("k", "QNN_DATATYPE_FLOAT_32", "1e-3"), "float k", "0.001f"),
    (_param("k", "QNN_DATATYPE_BOOL_8", "1"), "bool k", "true"),
    (_param("k", "QNN_DATATYPE_INT_64", "[1, -2]", "1D"), "const std::vector<int64_t>& k", "{1, -2}"),
    (_param("k", "QNN_DATATYPE_INT_32", None, "ND"), "const std::vector<int32_t>& k", ""),
    (_param("k", "QNN_DATATYPE_UINT_32", "B", enum="<Enumeration><Enum>A</Enum><Enum>B</Enum></Enumeration>"),
     "uint32_t k", "1"),
    (_param("k", "QNN_DATATYPE_FLOAT_32"), "std::optional<float> k", ""),
])
def test_parameter_forms(param, decl, default):
    (op,) = skeleton_ops(_pkg(param))
    (p,) = op.parameters
    assert p.decl == decl and p.default == default


@pytest.mark.parametrize("body,needles", [
    (_param("s", "QNN_DATATYPE_STRING"), ["s.xml:1", "QNN_DATATYPE_STRING", "use an <Enumeration>"]),
    (_param("k", "QNN_DATATYPE_INT_32", "fast"), ["<Default> of parameter 'k'", "'fast' is not a int32_t"]),
    (_param("k", "QNN_DATATYPE_INT_32", "[1, x]", "1D"), ["int32_t list", "e.g. [1, 2]"]),
    (_param("k", "QNN_DATATYPE_BOOL_8", "maybe"), ["not a bool"]),
    ("<Output><Name>r</Name><Repeated>true</Repeated><Datatype>QNN_DATATYPE_FLOAT_32</Datatype></Output>",
     ["Repeated but not the last output"]),
])
def test_skeleton_refuses(body, needles):
    with pytest.raises(ManifestError) as e:
        skeleton_ops(_pkg(body))
    for needle in needles:
        assert needle in str(e.value), str(e.value)


def test_identifiers_and_literals():
    pkg = _pkg("<Input><Name>in[0]</Name><Datatype>QNN_DATATYPE_FLOAT_32</Datatype></Input>"
               "<Input><Name>in(0)</Name><Datatype>QNN_DATATYPE_FLOAT_32</Datatype></Input>"
               "<Input><Name>class</Name><Datatype>QNN_DATATYPE_FLOAT_32</Datatype></Input>"
               "<Input><Name>0x</Name><Datatype>QNN_DATATYPE_FLOAT_32</Datatype></Input>",
               version='1 &quot;beta&quot; \\ é')
    (op,) = skeleton_ops(pkg)
    assert [a.ident for a in op.inputs] == ["in_0_", "in_0__1", "class_", "_0x"]
    glue = render_glue(pkg, "<x/>")["src/PInterface.cpp"]
    assert r'"1 \"beta\" \\ \303\251"' in glue


def test_out_dir_is_a_file(tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(ManifestError, match="is a file"):
        generate_skeleton(_pkg(""), "<x/>", tmp_path / "f")
