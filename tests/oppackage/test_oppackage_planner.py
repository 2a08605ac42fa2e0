"""The op builder (needs torch and a C++ compiler): graph nodes mapped to package ops from
the torch schema and checked against the OpDef the package was built from; every way a node
cannot be mapped is a Rejection with its reason, every bad registration an error."""

import pytest
import torch

from opforge.backends.oppackage import build_package, generate_skeleton, parse_op_package_infos, parse_opdef_xml
from opforge.backends.oppackage.node import PackageNode, PackageParam
from opforge.backends.oppackage.planner import claimed_ops, plan_package_nodes, torch_op_name
from opforge.backends.partition import ExportGraph
from opforge.errors import BackendError

from oppackage_support import example_infos, needs_compiler

pytestmark = needs_compiler


@torch.library.custom_op("oppkg_test::opt", mutates_args=())
def opt(x: torch.Tensor, y: torch.Tensor | None = None, s: float = 1.0, dims: list[int] | None = None,
        mode: str = "a", flag: bool = False) -> torch.Tensor:
    return x.clone()


@opt.register_fake
def _(x, y=None, s=1.0, dims=None, mode="a", flag=False):
    return torch.empty_like(x)


@torch.library.custom_op("oppkg_test::two", mutates_args=())
def two(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x.clone(), x.clone()


@two.register_fake
def _(x):
    return torch.empty_like(x), torch.empty_like(x)


def _t(name, role, dtype="QNN_DATATYPE_FLOAT_32", rank="ND", extra=""):
    return (f"<{role}><Name>{name}</Name>{extra}<Datatype>{dtype}</Datatype>"
            f"<Shape><Rank>{rank}</Rank></Shape></{role}>")


def _p(name, dtype, rank="SCALAR", extra=""):
    return (f"<Parameter><Name>{name}</Name><Mandatory>false</Mandatory>{extra}<Datatype>{dtype}</Datatype>"
            f"<Shape><Rank>{rank}</Rank></Shape></Parameter>")


OPT_Y = _t("y", "Input", extra="<Mandatory>false</Mandatory>")
OPT_PARAMS = _p("s", "QNN_DATATYPE_FLOAT_32") + _p("dims", "QNN_DATATYPE_INT_32", "1D") + \
    _p("flag", "QNN_DATATYPE_BOOL_8")
OPS = {
    "Opt": _t("x", "Input") + OPT_Y + _t("out", "Output") + OPT_PARAMS,
    "YMandatory": _t("x", "Input") + _t("y", "Input") + _t("out", "Output") + OPT_PARAMS,
    "OneInput": _t("x", "Input") + _t("out", "Output") + OPT_PARAMS,
    "Rank4": _t("x", "Input", rank="4D") + OPT_Y + _t("out", "Output") + OPT_PARAMS,
    "IntOnly": _t("x", "Input", "QNN_DATATYPE_INT_32") + OPT_Y + _t("out", "Output") + OPT_PARAMS,
    "NoParams": _t("x", "Input") + OPT_Y + _t("out", "Output"),
    "NeedsK": _t("x", "Input") + OPT_Y + _t("out", "Output") + OPT_PARAMS +
    "<Parameter><Name>k</Name><Datatype>QNN_DATATYPE_INT_32</Datatype></Parameter>",
    "UnsignedDims": _t("x", "Input") + OPT_Y + _t("out", "Output") + _p("s", "QNN_DATATYPE_FLOAT_32") +
    _p("dims", "QNN_DATATYPE_UINT_32", "1D") + _p("flag", "QNN_DATATYPE_BOOL_8"),
    "IntScale": _t("x", "Input") + OPT_Y + _t("out", "Output") + _p("s", "QNN_DATATYPE_INT_32") +
    _p("dims", "QNN_DATATYPE_INT_32", "1D") + _p("flag", "QNN_DATATYPE_BOOL_8"),
    "ScalarDims": _t("x", "Input") + OPT_Y + _t("out", "Output") + _p("s", "QNN_DATATYPE_FLOAT_32") +
    _p("dims", "QNN_DATATYPE_INT_32", "SCALAR") + _p("flag", "QNN_DATATYPE_BOOL_8"),
    "Two": _t("x", "Input") + _t("a", "Output") + _t("b", "Output"),
    "TwoAsOne": _t("x", "Input") + _t("a", "Output"),
}
CHECKS = ('<OpDefCollection PackageName="Checks" Domain="t" Version="1"><OpDefList>' +
          "".join(f"<OpDef><Name>{n}</Name>{body}</OpDef>" for n, body in OPS.items()) +
          "</OpDefList></OpDefCollection>")


@pytest.fixture(scope="module")
def checks_library(tmp_path_factory):
    cache = tmp_path_factory.getbasetemp() / "oppackage-cache"
    project = tmp_path_factory.mktemp("checks") / "Checks"
    generate_skeleton(parse_opdef_xml(CHECKS, "checks.xml"), CHECKS, project)
    return build_package(project, output=project / "libQnnChecks.so", cache_root=cache)


def _graph(fn, *args):
    class M(torch.nn.Module):
        def forward(self, *a):
            return fn(*a)

    ep = torch.export.export(M(), args)
    return ExportGraph("forward", ep.graph_module, {}, {})


def _plan(library, op_type, fn, *args, custom="oppkg_test.opt.default"):
    infos = parse_op_package_infos([{"op_package_name": "Checks", "op_package_path": str(library),
                                     "custom_op_name": custom, "op_type_name": op_type}])
    return plan_package_nodes(_graph(fn, *args), infos)


X = torch.randn(2, 3)


def test_example_mapping(example_library):
    from opforge.examples.my_ops import register_examples

    register_examples()
    graph = _graph(lambda x, y: (torch.ops.my_ops.mul3(x) + y, torch.add(x, y, alpha=2),
                                 x.to(torch.int32) + 1), X, torch.randn(3))
    nodes, rejected = plan_package_nodes(graph, example_infos(example_library))
    assert sorted(nodes) == ["add", "add_1", "mul3"]
    assert nodes["mul3"].describe() == "package ExampleOpPackage::ExampleCustomOp"
    # alpha left at the schema's default: passed with it, as the OpDef declares alpha
    assert nodes["add"].params == (PackageParam("alpha", "float", (1.0,)),)
    assert nodes["add"].input_slots == (0, 1)
    assert [(t.dtype, t.shape) for t in nodes["add"].inputs] == [("float32", (2, 3)), ("float32", (3,))]
    assert nodes["add_1"].params == (PackageParam("alpha", "float", (2.0,)),)  # int alpha → the FLOAT param
    (r,) = rejected
    assert (r.node, r.kind, r.op, r.backend) == ("add_2", "dtype", "aten::add.Tensor", "cpu")
    assert "input 'self' is int32; the OpDef's input 'self' accepts QNN_DATATYPE_FLOAT_32" in r.reason
    assert "test_oppackage_planner.py" in r.source
    assert PackageNode.from_bytes(nodes["add_1"].to_bytes()) == nodes["add_1"]
    assert claimed_ops(example_infos(example_library)) == {"my_ops.mul3.default", "aten.add.Tensor"}
    assert torch_op_name(next(iter(graph.call_nodes()))) == "my_ops.mul3.default"


def test_optional_list_bool_params(checks_library):
    nodes, rejected = _plan(checks_library, "Opt", lambda x: opt(x, None, 2.5, [0, 1], "a", True), X)
    assert not rejected
    (node,) = nodes.values()
    assert node.input_slots == (0,)  # y None: left out
    assert node.params == (PackageParam("s", "float", (2.5,)), PackageParam("dims", "int", (0, 1), True),
                           PackageParam("flag", "bool", (True,)))
    nodes, _ = _plan(checks_library, "Opt", lambda x, y: opt(x, y), X, X)
    (node,) = nodes.values()
    assert node.input_slots == (0, 1)  # dims (default None) skipped, the others at their defaults
    assert node.params == (PackageParam("s", "float", (1.0,)), PackageParam("flag", "bool", (False,)))
    # arguments at their defaults that the OpDef does not declare are not passed
    nodes, rejected = _plan(checks_library, "NoParams", lambda x: opt(x, None, 1.0, None, "a"), X)
    assert not rejected and list(nodes.values())[0].params == ()


REJECTED = [
    ("YMandatory", lambda x: opt(x), "op", "schema argument 'y' is None, but the OpDef's input 'y' is mandatory"),
    ("OneInput", lambda x: opt(x), "op", "the schema has 2 tensor argument(s) (x, y); the OpDef declares 1 input(s) (x)"),
    ("Rank4", lambda x: opt(x), "shape", "input 'x' has rank 2 (shape (2, 3)); the OpDef's input 'x' has rank 4D"),
    ("IntOnly", lambda x: opt(x), "dtype", "input 'x' is float32; the OpDef's input 'x' accepts QNN_DATATYPE_INT_32"),
    ("NoParams", lambda x: opt(x, None, 2.0), "op", "schema argument 's' = 2.0 has no <Parameter> of that name"),
    ("Opt", lambda x: opt(x, None, 1.0, [], "b"), "op", "argument 'mode' is a str ('b')"),
    ("NeedsK", lambda x: opt(x), "op", "the OpDef's mandatory parameter 'k' has no value"),
    ("UnsignedDims", lambda x: opt(x, None, 1.0, [-1]), "op", "parameter 'dims' = [-1] is negative"),
    ("IntScale", lambda x: opt(x, None, 0.5), "dtype", "parameter 's' = 0.5 is a float; the OpDef declares QNN_DATATYPE_INT_32"),
    ("ScalarDims", lambda x: opt(x, None, 1.0, [1]), "shape", "parameter 'dims' = [1] is a list; the OpDef declares rank SCALAR"),
]


@pytest.mark.parametrize("op_type,fn,kind,needle", REJECTED, ids=[r[0] for r in REJECTED])
def test_rejections(checks_library, op_type, fn, kind, needle):
    nodes, rejected = _plan(checks_library, op_type, fn, X)
    assert nodes == {}
    (r,) = rejected
    assert r.kind == kind and needle in r.reason, r.reason
    assert r.reason.startswith(f"oppkg_test.opt.default → package op Checks::{op_type}: ")


def test_outputs(checks_library):
    nodes, rejected = _plan(checks_library, "Two", lambda x: two(x), X, custom="oppkg_test.two")
    assert len(list(nodes.values())[0].outputs) == 2 and not rejected
    nodes, (r,) = _plan(checks_library, "TwoAsOne", lambda x: two(x), X, custom="oppkg_test.two")
    assert "the op returns 2 tensor(s); the OpDef declares 1 output(s) (a)" in r.reason


def test_bad_registrations(checks_library, example_library):
    with pytest.raises(BackendError, match="has no op type 'Missing' — valid: .*IntOnly"):
        _plan(checks_library, "Missing", lambda x: opt(x), X)
    infos = parse_op_package_infos([{"op_package_name": "Checks", "op_package_path": str(checks_library),
                                     "custom_op_name": "oppkg_test.opt", "op_type_name": "Opt",
                                     "platform": "aarch64_android"}])
    nodes, (r,) = plan_package_nodes(_graph(lambda x: opt(x), X), infos)
    assert "for platform aarch64_android, not this machine's" in r.reason
    both = parse_op_package_infos([{"op_package_name": "Checks", "op_package_path": str(checks_library),
                                    "custom_op_name": "a.b", "op_type_name": "Two"}])
    with pytest.raises(BackendError, match="already mapped"):
        plan_package_nodes(_graph(lambda x: opt(x), X), both + [
            type(both[0])(**{**both[0].as_dict(), "op_package_name": "ExampleOpPackage",
                             "op_package_path": str(example_library), "op_type_name": "ExampleCustomOp"})])


QUALCOMM_STYLE = """<?xml version="1.0" encoding="UTF-8"?>
<!-- written the way Qualcomm's HTP examples are: attributes on their own lines, comments,
     whitespace around text, a 4D NHWC tensor, an HTP-only op -->
<OpDefCollection
        PackageName="StylePackage"
        Domain="aisw"
        Version="1.0"
>
    <OpDefList>
        <OpDef>
            <Name>Times3</Name>
            <Description>
                <Content>
                    multiplies by three
                </Content>
            </Description>
            <Input>
                <Name>input</Name>
                <Description><Content>input activation</Content></Description>
                <Mandatory>true</Mandatory>
                <Datatype>QNN_DATATYPE_FLOAT_32</Datatype>
                <Datatype>QNN_DATATYPE_UFIXED_POINT_8</Datatype>
                <Shape>
                    <Rank>4D</Rank>
                    <Layout>NHWC</Layout>
                    <Text>a tensor of 4 dimension</Text>
                </Shape>
            </Input>
            <Output>
                <Name>output</Name>
                <Mandatory>true</Mandatory>
                <Datatype>QNN_DATATYPE_FLOAT_32</Datatype>
                <Datatype>QNN_DATATYPE_UFIXED_POINT_8</Datatype>
                <Shape>
                    <Rank>4D</Rank>
                    <Layout>NHWC</Layout>
                </Shape>
            </Output>
            <!--This Op is implemented on these Backends-->
            <SupportedBackend>HTP</SupportedBackend>
        </OpDef>
    </OpDefList>
</OpDefCollection>
"""


def test_qualcomm_style_opdef_end_to_end(tmp_path_factory):
    """An HTP-style OpDef, fed unchanged: skeleton, a body written as the docs say, build,
    registration for my_ops.mul3, mapping of a 4-d node, and the op run through the ABI."""
    import numpy as np

    from opforge.backends.oppackage.runtime import prepare
    from opforge.examples.my_ops import register_examples

    register_examples()
    pkg = parse_opdef_xml(QUALCOMM_STYLE, "style.xml")
    assert pkg.ops[0].description == "multiplies by three" and pkg.ops[0].supported_backends == ("HTP",)
    project = tmp_path_factory.mktemp("style") / "StylePackage"
    generate_skeleton(pkg, QUALCOMM_STYLE, project)
    source = project / "src" / "ops" / "Times3.cpp"
    source.write_text(source.read_text().replace(
        '  return opforge::pkg::not_implemented("StylePackage", "Times3");',
        "  for (int64_t i = 0; i < input.numel(); ++i) output.data<float>()[i] = input.data<float>()[i] * 3;\n"
        "  return opforge::pkg::Status::Ok();"))
    lib = build_package(project, output=project / "libQnnStylePackage.so",
                        cache_root=tmp_path_factory.getbasetemp() / "oppackage-cache")
    infos = parse_op_package_infos([{"op_package_name": "StylePackage", "op_package_path": str(lib),
                                     "custom_op_name": "my_ops.mul3.default", "op_type_name": "Times3"}])
    x = torch.randn(1, 4, 4, 3)
    nodes, rejected = plan_package_nodes(_graph(lambda x: torch.ops.my_ops.mul3(x), x), infos)
    (node,) = nodes.values()
    assert not rejected and node.inputs[0].shape == (1, 4, 4, 3)
    _, _, run = prepare(node.to_bytes(), infos)
    out = np.empty((1, 4, 4, 3), np.float32)
    run([x.numpy()], [out])
    np.testing.assert_allclose(out, (x * 3).numpy())
    _, (r,) = plan_package_nodes(_graph(lambda x: torch.ops.my_ops.mul3(x), X), infos)
    assert r.kind == "shape" and "rank 2" in r.reason and "rank 4D" in r.reason
