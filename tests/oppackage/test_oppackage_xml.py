"""OpDef XML in (pure Python): every field, the CPU supplement, the writer's round trip,
the YAML manifest form, and each bad input with file:line and what is valid."""

import dataclasses

import pytest

from opforge.backends.oppackage import load_opdef_xml, parse_opdef_xml
from opforge.backends.oppackage.model import Constraint
from opforge.backends.oppackage.xml_writer import to_opdef_xml
from opforge.backends.oppackage.yaml_reader import parse_manifest_packages
from opforge.errors import ManifestError
from opforge.manifest import parse_manifest

from oppackage_support import EXAMPLE

FULL = """<?xml version="1.0" encoding="UTF-8"?>
<OpDefCollection PackageName="FullPackage" Domain="aisw" Version="2.1">
  <OpDefList>
    <OpDef>
      <Name>Everything</Name>
      <Description><Content>does it all</Content><Code>y = f(x)</Code></Description>
      <Reference Source="paper" Url="https://example.org/p"/>
      <Input>
        <Name>in[0]</Name>
        <Description><Content>first</Content></Description>
        <Constraint id="c1" Type="Shape">last dim is 4</Constraint>
        <Mandatory>true</Mandatory>
        <Datatype>QNN_DATATYPE_FLOAT_32</Datatype>
        <Datatype>QNN_DATATYPE_UFIXED_POINT_8</Datatype>
        <Shape><Rank>4D</Rank><Layout>NHWC</Layout><Text>[N, H, W, C]</Text></Shape>
        <Repeated>false</Repeated>
        <IsStaticTensor>false</IsStaticTensor>
      </Input>
      <Input>
        <Name>bias</Name>
        <Mandatory>false</Mandatory>
        <Datatype>QNN_DATATYPE_FLOAT_32</Datatype>
        <Shape><Rank>1D</Rank></Shape>
        <IsStaticTensor>true</IsStaticTensor>
      </Input>
      <Input>
        <Name>extra</Name>
        <Mandatory>false</Mandatory>
        <Datatype>BACKEND_SPECIFIC</Datatype>
        <Shape><Rank>ND</Rank><Layout>BACKEND_SPECIFIC</Layout></Shape>
        <Repeated>true</Repeated>
      </Input>
      <Output>
        <Name>out[0]</Name>
        <Mandatory>true</Mandatory>
        <Datatype>QNN_DATATYPE_FLOAT_32</Datatype>
        <Shape><Rank>4D</Rank><Layout>NHWC</Layout></Shape>
        <Repeated>false</Repeated>
      </Output>
      <Parameter>
        <Name>mode</Name>
        <Mandatory>false</Mandatory>
        <Datatype>QNN_DATATYPE_UINT_32</Datatype>
        <Shape><Rank>SCALAR</Rank></Shape>
        <Default>FAST</Default>
        <Enumeration><Enum>EXACT</Enum><Enum>FAST</Enum></Enumeration>
      </Parameter>
      <Parameter>
        <Name>scale</Name>
        <Constraint Type="Value">positive</Constraint>
        <Mandatory>true</Mandatory>
        <Datatype>QNN_DATATYPE_FLOAT_32</Datatype>
        <Shape><Rank>SCALAR</Rank></Shape>
      </Parameter>
      <Parameter>
        <Name>dims</Name>
        <Mandatory>false</Mandatory>
        <Datatype>QNN_DATATYPE_INT_32</Datatype>
        <Shape><Rank>1D</Rank></Shape>
        <Default>[0, 1]</Default>
      </Parameter>
      <Parameter>
        <Name>keep</Name>
        <Mandatory>false</Mandatory>
        <Datatype>QNN_DATATYPE_BOOL_8</Datatype>
        <Shape><Rank>SCALAR</Rank></Shape>
        <Default>true</Default>
      </Parameter>
      <Parameter>
        <Name>maybe</Name>
        <Mandatory>false</Mandatory>
        <Datatype>QNN_DATATYPE_INT_64</Datatype>
        <Shape><Rank>SCALAR</Rank></Shape>
      </Parameter>
      <SupportedBackend>HTP</SupportedBackend>
      <SupportedBackend>CPU</SupportedBackend>
      <UseDefaultTranslation>true</UseDefaultTranslation>
    </OpDef>
  </OpDefList>
  <SupplementalOpDefList Backend="CPU">
    <SupportedOps><OpName>Everything</OpName></SupportedOps>
    <SupplementalOpDef>
      <Name>Everything</Name>
      <Input>
        <Name>in[0]</Name>
        <Datatype>QNN_DATATYPE_FLOAT_32</Datatype>
        <Shape><Layout>UNDEFINED</Layout><Text>any layout on CPU</Text></Shape>
      </Input>
      <Constraint Type="Description">cpu: float only</Constraint>
      <OnlyDefaultSupported>false</OnlyDefaultSupported>
    </SupplementalOpDef>
  </SupplementalOpDefList>
  <SupplementalOpDefList Backend="HTP">
    <SupportedOps><OpName>Everything</OpName></SupportedOps>
  </SupplementalOpDefList>
</OpDefCollection>
"""


def _strip(obj):
    if dataclasses.is_dataclass(obj):
        return tuple((f.name, _strip(getattr(obj, f.name))) for f in dataclasses.fields(obj)
                     if f.name not in ("line", "source"))
    if isinstance(obj, tuple):
        return tuple(_strip(i) for i in obj)
    return obj


def test_every_field():
    pkg = parse_opdef_xml(FULL, "full.xml")
    assert (pkg.name, pkg.domain, pkg.version) == ("FullPackage", "aisw", "2.1")
    op = pkg.op("Everything")
    assert op.description == "does it all y = f(x)"
    assert op.references == (("paper", "https://example.org/p"),)
    assert op.supported_backends == ("HTP", "CPU") and op.use_default_translation
    x, bias, extra = op.inputs
    assert (x.name, x.mandatory, x.rank, x.layout, x.shape_text) == ("in[0]", True, "4D", "NHWC", "[N, H, W, C]")
    assert x.datatypes == ("QNN_DATATYPE_FLOAT_32", "QNN_DATATYPE_UFIXED_POINT_8")
    assert x.constraints == (Constraint("Shape", "last dim is 4", "c1"),) and x.description == "first"
    assert (bias.mandatory, bias.is_static_tensor, bias.rank) == (False, True, "1D")
    assert (extra.repeated, extra.layout, extra.datatypes) == (True, "BACKEND_SPECIFIC", ("BACKEND_SPECIFIC",))
    mode, scale, dims, keep, maybe = op.parameters
    assert mode.enumeration == ("EXACT", "FAST") and mode.default == "FAST"
    assert scale.constraints == (Constraint("Value", "positive"),) and scale.mandatory
    assert dims.default == "[0, 1]" and keep.default == "true" and maybe.default is None
    assert x.line == 8 and op.line == 4
    backend, supported, sups = pkg.supplements[0]
    assert (backend, supported, sups[0].only_default_supported) == ("CPU", ("Everything",), False)
    assert pkg.supplements[1][0] == "HTP"


def test_cpu_supplement_applies():
    op = parse_opdef_xml(FULL).for_backend("cpu").op("Everything")
    assert op.inputs[0].datatypes == ("QNN_DATATYPE_FLOAT_32",)
    assert (op.inputs[0].layout, op.inputs[0].shape_text) == ("UNDEFINED", "any layout on CPU")
    assert op.inputs[0].rank == "4D"  # not overridden
    assert parse_opdef_xml(FULL).for_backend("GPU") == parse_opdef_xml(FULL)


def test_writer_round_trip():
    for pkg in (parse_opdef_xml(FULL), load_opdef_xml(EXAMPLE / "config" / "ExampleOpPackage.xml")):
        assert _strip(parse_opdef_xml(to_opdef_xml(pkg))) == _strip(pkg)


def test_missing_shape_means_any_rank():
    pkg = parse_opdef_xml("""<OpDefCollection PackageName="P"><OpDefList><OpDef><Name>A</Name>
      <Output><Name>o</Name><Datatype>QNN_DATATYPE_FLOAT_32</Datatype></Output>
      </OpDef></OpDefList></OpDefCollection>""")
    assert pkg.ops[0].outputs[0].rank == "ND" and pkg.domain == "" and pkg.version == ""


def _op(body: str, extra: str = "") -> str:
    return (f'<OpDefCollection PackageName="P" Domain="d" Version="1">\n<OpDefList>\n<OpDef>\n'
            f'<Name>A</Name>\n{body}\n</OpDef>\n</OpDefList>\n{extra}</OpDefCollection>')


_OUT = "<Output><Name>o</Name><Datatype>QNN_DATATYPE_FLOAT_32</Datatype></Output>"

BAD = [
    ("malformed", '<OpDefCollection PackageName="P">\n<OpDefList>\n</OpDefCollection>',
     ["bad.xml:3", "malformed XML", "mismatched tag"]),
    ("not closed", '<OpDefCollection PackageName="P">', ["bad.xml:1", "malformed XML"]),
    ("entity bomb", '<?xml version="1.0"?>\n<!DOCTYPE lolz [\n <!ENTITY lol "lol">\n'
     ' <!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">\n'
     ' <!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">\n]>\n'
     '<OpDefCollection PackageName="&lol3;"/>', ["bad.xml:2", "DOCTYPE", "refuses"]),
    ("external entity", '<?xml version="1.0"?>\n<!DOCTYPE r [<!ENTITY x SYSTEM "file:///etc/passwd">]>\n'
     '<OpDefCollection PackageName="&x;"/>', ["bad.xml:2", "DOCTYPE"]),
    ("wrong root", "<OpDefList/>", ["bad.xml:1", "<OpDefCollection"]),
    ("no package name", "<OpDefCollection><OpDefList/></OpDefCollection>",
     ["bad.xml:1", "PackageName"]),
    ("package name not C", '<OpDefCollection PackageName="my-pkg"/>', ["not a C identifier"]),
    ("unknown attribute", '<OpDefCollection PackageName="P" Vendor="x"/>', ["Vendor", "valid: PackageName"]),
    ("no ops", '<OpDefCollection PackageName="P"><OpDefList/></OpDefCollection>', ["no <OpDef>"]),
    ("unknown datatype", _op("<Input><Name>x</Name>\n<Datatype>QNN_DATATYPE_FLOAT_3</Datatype></Input>" + _OUT),
     ["bad.xml:6", "<Datatype>", "QNN_DATATYPE_FLOAT_3", "did you mean QNN_DATATYPE_FLOAT_32"]),
    ("no datatype", _op("<Input><Name>x</Name></Input>" + _OUT), ["bad.xml:5", "no <Datatype>"]),
    ("unknown element", _op("<Input><Name>x</Name><Mandtory>true</Mandtory>"
                            "<Datatype>QNN_DATATYPE_FLOAT_32</Datatype></Input>" + _OUT),
     ["<Mandtory>", "did you mean <Mandatory>"]),
    ("bad bool", _op("<Input><Name>x</Name><Mandatory>yes</Mandatory>"
                     "<Datatype>QNN_DATATYPE_FLOAT_32</Datatype></Input>" + _OUT),
     ["<Mandatory>", "'yes'", "true or false"]),
    ("bad rank", _op("<Input><Name>x</Name><Datatype>QNN_DATATYPE_FLOAT_32</Datatype>"
                     "<Shape><Rank>7D</Rank></Shape></Input>" + _OUT), ["<Rank>", "SCALAR, 1D"]),
    ("bad layout", _op("<Input><Name>x</Name><Datatype>QNN_DATATYPE_FLOAT_32</Datatype>"
                       "<Shape><Rank>4D</Rank><Layout>NCHW</Layout></Shape></Input>" + _OUT),
     ["<Layout>", "NHWC"]),
    ("no output", _op(""), ["declares no <Output>"]),
    ("no op name", '<OpDefCollection PackageName="P"><OpDefList><OpDef>' + _OUT +
     "</OpDef></OpDefList></OpDefCollection>", ["no <Name>"]),
    ("two names", _op("<Name>B</Name>" + _OUT), ["<Name> given twice"]),
    ("duplicate op", '<OpDefCollection PackageName="P"><OpDefList>\n<OpDef><Name>A</Name>' + _OUT +
     '</OpDef>\n<OpDef><Name>A</Name>' + _OUT + "</OpDef></OpDefList></OpDefCollection>",
     ["bad.xml:3", "'A' declared twice (first at line 2)"]),
    ("duplicate input", _op("<Input><Name>x</Name><Datatype>QNN_DATATYPE_FLOAT_32</Datatype></Input>\n"
                            "<Input><Name>x</Name><Datatype>QNN_DATATYPE_FLOAT_32</Datatype></Input>" + _OUT),
     ["bad.xml:6", "input 'x'", "declared twice"]),
    ("constraint type", _op("<Input><Name>x</Name><Constraint Type='Size'>a</Constraint>"
                            "<Datatype>QNN_DATATYPE_FLOAT_32</Datatype></Input>" + _OUT),
     ["<Constraint>", "Number, Shape, Value"]),
    ("enumeration empty", _op(_OUT + "<Parameter><Name>m</Name><Datatype>QNN_DATATYPE_UINT_32</Datatype>"
                              "<Enumeration/></Parameter>"), ["no <Enum>"]),
    ("repeated on a parameter", _op(_OUT + "<Parameter><Name>m</Name><Repeated>true</Repeated>"
                                    "<Datatype>QNN_DATATYPE_UINT_32</Datatype></Parameter>"),
     ["<Repeated>", "unknown element inside <Parameter>"]),
    ("unknown backend", _op(_OUT + "<SupportedBackend>NPU</SupportedBackend>"), ["backend", "CPU, GPU"]),
    ("supplement for an unknown op", _op(_OUT, '<SupplementalOpDefList Backend="CPU"><SupportedOps>'
                                               "<OpName>B</OpName></SupportedOps></SupplementalOpDefList>"),
     ["<OpName>", "'B' has no OpDef"]),
    ("supplement for an unknown tensor", _op(_OUT, '<SupplementalOpDefList Backend="CPU">'
                                                   "<SupplementalOpDef><Name>A</Name><Input><Name>z</Name>"
                                                   "</Input></SupplementalOpDef></SupplementalOpDefList>"),
     ["input 'z' is not one of OpDef 'A'"]),
    ("supplement without backend", _op(_OUT, "<SupplementalOpDefList/>"), ["Backend"]),
]


@pytest.mark.parametrize("text,needles", [(t, n) for _, t, n in BAD], ids=[b[0] for b in BAD])
def test_bad_xml(text, needles):
    with pytest.raises(ManifestError) as e:
        parse_opdef_xml(text, "bad.xml")
    message = str(e.value)
    assert message.startswith("`opforge oppackage`: bad.xml")
    assert "valid:" in message or "malformed" in message, message
    for needle in needles:
        assert needle in message, message


def test_huge_entity_bomb_refused_fast():
    # the classic billion-laughs document: refused at the DOCTYPE, before anything expands
    lines = ['<!ENTITY lol0 "lol">'] + [
        f'<!ENTITY lol{i} "{("&lol%d;" % (i - 1)) * 10}">' for i in range(1, 10)]
    text = '<?xml version="1.0"?><!DOCTYPE r [' + "".join(lines) + ']><OpDefCollection PackageName="&lol9;"/>'
    with pytest.raises(ManifestError, match="DOCTYPE"):
        parse_opdef_xml(text)


def test_deep_nesting_and_size_bounded():
    with pytest.raises(ManifestError, match="nested more than"):
        parse_opdef_xml("<OpDefCollection>" + "<a>" * 100 + "</a>" * 100 + "</OpDefCollection>")
    with pytest.raises(ManifestError, match="bytes"):
        parse_opdef_xml(b" " * (16 << 20 + 1))


def test_unreadable_file(tmp_path):
    with pytest.raises(ManifestError, match="cannot read it"):
        load_opdef_xml(tmp_path / "missing.xml")


# --- the YAML manifest form ---------------------------------------------------------------

MANIFEST = """\
- func: my_ops::mul3.out(Tensor input, *, Tensor(a!) output) -> Tensor(a!)
  kernels:
    - arg_meta: null
      kernel_name: custom::mul3_out_impl
- op_package: YamlPackage
  domain: aisw
  version: "1.0"
  ops:
    - name: Mul3
      description: times three
      references: [{source: opforge, url: my_ops.yaml}]
      inputs:
        - {name: input, datatypes: [QNN_DATATYPE_FLOAT_32], shape: {rank: ND, text: any},
           constraints: [{type: Value, text: finite, id: c}]}
      outputs:
        - {name: output, datatypes: [QNN_DATATYPE_FLOAT_32], shape: {rank: ND}}
      parameters:
        - {name: scale, mandatory: false, datatypes: [QNN_DATATYPE_FLOAT_32],
           shape: {rank: SCALAR}, default: 3}
        - {name: mode, datatypes: [QNN_DATATYPE_UINT_32], shape: {rank: SCALAR},
           enumeration: [A, B], default: B}
      supported_backends: [CPU]
      use_default_translation: false
  supplemental:
    - backend: CPU
      supported_ops: [Mul3]
      ops:
        - name: Mul3
          inputs: [{name: input, datatypes: [QNN_DATATYPE_FLOAT_32], shape: {layout: UNDEFINED}}]
          only_default_supported: true
"""


def test_manifest_op_package_entry():
    assert [d.out_key for d in parse_manifest(MANIFEST, "m.yaml")] == ["my_ops::mul3.out"]
    (pkg,) = parse_manifest_packages(MANIFEST, "m.yaml")
    op = pkg.op("Mul3")
    assert (pkg.name, pkg.domain, pkg.version) == ("YamlPackage", "aisw", "1.0")
    assert op.parameters[0].default == "3" and op.parameters[1].enumeration == ("A", "B")
    assert op.inputs[0].constraints == (Constraint("Value", "finite", "c"),)
    assert pkg.supplements[0][2][0].only_default_supported is True
    # the same package written as XML reads back the same
    assert _strip(parse_opdef_xml(to_opdef_xml(pkg))) == _strip(pkg)


@pytest.mark.parametrize("change,needles", [
    (("QNN_DATATYPE_FLOAT_32], shape: {rank: ND, text", "QNN_FLOAT], shape: {rank: ND, text"),
     ["m.yaml:13", "unknown datatype", "QNN_FLOAT"]),
    (("      description: times three", "      descripton: times three"),
     ["m.yaml:10", "unknown key", "did you mean 'description'"]),
    (("supported_ops: [Mul3]", "supported_ops: [Mul4]"), ["unknown op", "Mul4"]),
    (("rank: SCALAR}, default: 3", "rank: 0D}, default: 3"), ["unknown rank", "'0D'"]),
])
def test_manifest_op_package_errors(change, needles):
    text = MANIFEST.replace(*change)
    assert text != MANIFEST
    with pytest.raises(ManifestError) as e:
        parse_manifest(text, "m.yaml")
    for needle in needles:
        assert needle in str(e.value), str(e.value)
