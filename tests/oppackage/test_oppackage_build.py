"""Skeleton → compiled package → loaded and run through the C ABI from ctypes (needs a C++
compiler): the untouched skeleton's "not implemented yet", the example's ops, the build
cache, the refused targets and platforms, and every registration check at load."""

import json

import numpy as np
import pytest
from click.testing import CliRunner

from opforge.backends.oppackage import (
    PackageNode, PackageParam, TensorSpec, build_package, generate_skeleton, load_opdef_xml,
    parse_op_package_infos, parse_opdef_xml,
)
from opforge.backends.oppackage.build import check_target, host_platform
from opforge.backends.oppackage.runtime import (
    ABI_VERSION, TRUST_ENV, load_package, load_packages, prepare, trust_packages,
)
from opforge.cli import cli
from opforge.errors import BackendError, BuildError, ManifestError

from oppackage_support import EXAMPLE, needs_compiler

pytestmark = needs_compiler

EXAMPLE_XML = EXAMPLE / "config" / "ExampleOpPackage.xml"


def _node(library, op_type, inputs, outputs, params=(), slots=None, package="ExampleOpPackage"):
    return PackageNode(package, op_type, "x.y.default", f"{package}InterfaceProvider", "cpu",
                       host_platform(), str(library), tuple(params),
                       tuple(slots if slots is not None else range(len(inputs))),
                       tuple(TensorSpec("float32", s) for s in inputs),
                       tuple(TensorSpec("float32", s) for s in outputs))


def test_example_ops_through_the_abi(example_library):
    fn, state, node = prepare(_node(example_library, "ExampleCustomOp", [(2, 3)], [(2, 3)]).to_bytes())
    assert fn and state and node.fn == fn
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    out = np.zeros((2, 3), np.float32)
    node([x], [out])
    np.testing.assert_array_equal(out, x * 3)
    for shapes in ([(2, 3), (3,)], [(4, 1, 3), (2, 1)], [(2, 3), (2, 3)], [(), (5,)]):
        a = np.asarray(np.random.default_rng(0).standard_normal(shapes[0]), dtype=np.float32)
        b = np.asarray(np.random.default_rng(1).standard_normal(shapes[1]), dtype=np.float32)
        want = a + 2.5 * b
        _, _, add = prepare(_node(example_library, "ElementWiseAdd", shapes, [want.shape],
                                  [PackageParam("alpha", "float", (2.5,))]))
        got = np.empty(want.shape, np.float32)
        add([a, b], [got])
        np.testing.assert_allclose(got, want, rtol=1e-6)
        add.close()
        add.close()  # once only
    # alpha left out: the OpDef's default 1
    _, _, add = prepare(_node(example_library, "ElementWiseAdd", [(3,), (3,)], [(3,)]))
    got = np.empty(3, np.float32)
    add([np.ones(3, np.float32), np.full(3, 2, np.float32)], [got])
    np.testing.assert_array_equal(got, [3, 3, 3])


def test_call_through_fn_and_state(example_library):
    """What the cpu engine does: call fn(state, ...) with opforge_ext_tensor-shaped structs."""
    import ctypes

    from opforge.backends.oppackage.runtime import _EXECUTE, _tensors

    node = _node(example_library, "ExampleCustomOp", [(4,)], [(4,)])
    fn, state, keep = prepare(node.to_bytes())
    x, out = np.array([1, 2, 3, 4], np.float32), np.zeros(4, np.float32)
    ins, k1 = _tensors(node.inputs, [x])
    outs, k2 = _tensors(node.outputs, [out])
    error = ctypes.create_string_buffer(256)
    assert _EXECUTE(fn)(state, ins, 1, outs, 1, error, 256) == 0
    np.testing.assert_array_equal(out, [3, 6, 9, 12])


def test_prepare_refuses(example_library):
    with pytest.raises(BackendError, match="the package refused the node: ExampleOpPackage::ElementWiseAdd: "
                                           "mandatory input 1 not given"):
        prepare(_node(example_library, "ElementWiseAdd", [(3,)], [(3,)]))
    with pytest.raises(BackendError, match="unknown parameter 'beta'"):
        prepare(_node(example_library, "ElementWiseAdd", [(3,), (3,)], [(3,)],
                      [PackageParam("beta", "float", (1.0,))]))
    with pytest.raises(BackendError, match="parameter 'alpha' — a list"):
        prepare(_node(example_library, "ElementWiseAdd", [(3,), (3,)], [(3,)],
                      [PackageParam("alpha", "float", (1.0, 2.0), True)]))
    with pytest.raises(BackendError, match="2 outputs — valid: 1"):
        prepare(_node(example_library, "ExampleCustomOp", [(3,)], [(3,), (3,)]))
    with pytest.raises(BackendError, match="no op type 'Nope' — valid: ElementWiseAdd, ExampleCustomOp"):
        prepare(_node(example_library, "Nope", [(3,)], [(3,)]))
    with pytest.raises(BackendError, match="magic"):
        prepare(b"garbage-bytes-here")
    _, _, node = prepare(_node(example_library, "ExampleCustomOp", [(3,)], [(3,)]))
    with pytest.raises(BackendError, match="valid: C-contiguous float32"):
        node([np.zeros(3, np.float64)], [np.zeros(3, np.float32)])
    with pytest.raises(BackendError, match="ExampleCustomOp: float32 tensors only"):  # the op's own error
        _, _, bad = prepare(PackageNode(**{**_node(example_library, "ExampleCustomOp", [(3,)], [(3,)]).__dict__,
                                           "inputs": (TensorSpec("int32", (3,)),)}))
        bad([np.zeros(3, np.int32)], [np.zeros(3, np.float32)])


def test_prepare_loads_only_trusted_libraries(example_library, raw_package, tmp_path, monkeypatch):
    """A program is untrusted data: the library a node names is loaded only when allowed."""
    monkeypatch.delenv(TRUST_ENV, raising=False)
    lib = raw_package("Untrusted", _iface("Untrusted"))
    node = PackageNode("Untrusted", "Op", "a.b.default", "UntrustedInterfaceProvider", "cpu",
                       host_platform(), str(lib), (), (), (), ())
    with pytest.raises(BackendError) as e:
        prepare(node.to_bytes())
    assert "opforge loads a library a program names (its code runs) only when you allow it — fix: " \
           "1. `opforge run PROGRAM --op-packages FILE`" in str(e.value)
    assert f"2. set {TRUST_ENV}=" in str(e.value) and "trust_packages" in str(e.value)
    monkeypatch.setenv(TRUST_ENV, f"/nonexistent:{lib.parent}")  # a folder allows what is under it
    _, _, op = prepare(node.to_bytes())
    op.close()


def test_prepare_takes_the_path_from_the_compile_spec(example_library, tmp_path, monkeypatch):
    node = _node(tmp_path / "elsewhere.so", "ExampleCustomOp", [(3,)], [(3,)])
    monkeypatch.setenv(TRUST_ENV, str(tmp_path))
    with pytest.raises(BackendError, match="no such file"):
        prepare(node)
    infos = parse_op_package_infos([{"op_package_name": "ExampleOpPackage",
                                     "op_package_path": str(example_library),
                                     "custom_op_name": "my_ops.mul3", "op_type_name": "ExampleCustomOp"}])
    _, _, run = prepare(node.to_bytes(), infos)
    out = np.zeros(3, np.float32)
    run([np.ones(3, np.float32)], [out])
    assert out.tolist() == [3, 3, 3]
    other = parse_op_package_infos([{**infos[0].as_dict(), "platform": "aarch64_android"}])
    with pytest.raises(BackendError, match="only for aarch64_android"):
        prepare(node, other)


def test_untouched_skeleton_compiles_and_says_not_implemented(tmp_path, pkg_cache):
    pkg = load_opdef_xml(EXAMPLE_XML)
    project = tmp_path / "proj"
    written = generate_skeleton(pkg, EXAMPLE_XML.read_text(), project)
    assert (project / "src" / "ops" / "ExampleCustomOp.cpp") in written
    assert (project / "CMakeLists.txt").is_file() and (project / "include/opforge/oppackage.h").is_file()
    text = (project / "src" / "ExampleOpPackageOps.h").read_text()
    assert ("opforge::pkg::Status ElementWiseAdd(const opforge::pkg::Tensor& self, const "
            "opforge::pkg::Tensor& other, float alpha, opforge::pkg::Tensor& output);") in text
    assert "param  alpha: float = 1.0f" in text
    lib = build_package(project, output=tmp_path / "lib" / "libQnnExampleOpPackage.so",
                        cache_root=pkg_cache)
    trust_packages([lib])
    # a second library of the same package name at another path: loaded on its own
    _, _, node = prepare(_node(lib, "ExampleCustomOp", [(3,)], [(3,)]))
    with pytest.raises(BackendError, match="ExampleOpPackage::ExampleCustomOp: not implemented yet — "
                                           "write its body in src/ops/ExampleCustomOp.cpp"):
        node([np.ones(3, np.float32)], [np.zeros(3, np.float32)])
    with pytest.raises(ManifestError, match="the folder is not empty"):
        generate_skeleton(pkg, EXAMPLE_XML.read_text(), project)
    (project / "src" / "ops" / "ExampleCustomOp.cpp").write_text("// mine\n")
    generate_skeleton(pkg, EXAMPLE_XML.read_text(), project, force=True)
    assert (project / "src" / "ops" / "ExampleCustomOp.cpp").read_text() == "// mine\n"


RICH = """<OpDefCollection PackageName="Rich" Domain="x" Version="0.1 &quot;β&quot; \\ ?">
<OpDefList><OpDef>
<Name>Mix</Name><Description><Content>ends a comment */ and has "quotes" and )opdef"</Content></Description>
<Input><Name>in[0]</Name><Datatype>QNN_DATATYPE_FLOAT_32</Datatype><Shape><Rank>ND</Rank></Shape></Input>
<Input><Name>opt</Name><Mandatory>false</Mandatory><Datatype>QNN_DATATYPE_FLOAT_32</Datatype></Input>
<Input><Name>many</Name><Mandatory>false</Mandatory><Repeated>true</Repeated><Datatype>QNN_DATATYPE_FLOAT_32</Datatype></Input>
<Output><Name>out</Name><Datatype>QNN_DATATYPE_FLOAT_32</Datatype></Output>
<Output><Name>rest</Name><Repeated>true</Repeated><Datatype>QNN_DATATYPE_FLOAT_32</Datatype></Output>
<Parameter><Name>mode</Name><Mandatory>false</Mandatory><Datatype>QNN_DATATYPE_UINT_32</Datatype>
  <Shape><Rank>SCALAR</Rank></Shape><Default>FAST</Default><Enumeration><Enum>EXACT</Enum><Enum>FAST</Enum></Enumeration></Parameter>
<Parameter><Name>dims</Name><Mandatory>false</Mandatory><Datatype>QNN_DATATYPE_INT_32</Datatype>
  <Shape><Rank>1D</Rank></Shape><Default>[0, 1]</Default></Parameter>
<Parameter><Name>keep</Name><Mandatory>false</Mandatory><Datatype>QNN_DATATYPE_BOOL_8</Datatype>
  <Shape><Rank>SCALAR</Rank></Shape><Default>true</Default></Parameter>
<Parameter><Name>maybe</Name><Mandatory>false</Mandatory><Datatype>QNN_DATATYPE_INT_64</Datatype>
  <Shape><Rank>SCALAR</Rank></Shape></Parameter>
<Parameter><Name>scale</Name><Datatype>QNN_DATATYPE_FLOAT_32</Datatype><Shape><Rank>SCALAR</Rank></Shape></Parameter>
<Parameter><Name>default</Name><Mandatory>false</Mandatory><Datatype>QNN_DATATYPE_FLOAT_64</Datatype>
  <Shape><Rank>SCALAR</Rank></Shape><Default>0.5</Default></Parameter>
</OpDef></OpDefList></OpDefCollection>"""


def test_skeleton_of_every_argument_form_compiles(tmp_path, pkg_cache):
    """Optional and repeated inputs, a repeated last output, enum/list/bool/optional/keyword-named
    parameters: the generated glue compiles, and a filled-in body sees the right values."""
    pkg = parse_opdef_xml(RICH, "rich.xml")
    project = tmp_path / "rich"
    generate_skeleton(pkg, RICH, project)
    ops_h = (project / "src" / "RichOps.h").read_text()
    assert ("Mix(const opforge::pkg::Tensor& in_0_, const opforge::pkg::Tensor* opt, const "
            "opforge::pkg::TensorList& many, uint32_t mode, const std::vector<int32_t>& dims, bool "
            "keep, std::optional<int64_t> maybe, float scale, double default_, opforge::pkg::Tensor& "
            "out, opforge::pkg::TensorList& rest)") in ops_h
    (project / "src" / "ops" / "Mix.cpp").write_text("""
#include "RichOps.h"
namespace Rich {
opforge::pkg::Status Mix(const opforge::pkg::Tensor& in_0_, const opforge::pkg::Tensor* opt,
    const opforge::pkg::TensorList& many, uint32_t mode, const std::vector<int32_t>& dims, bool keep,
    std::optional<int64_t> maybe, float scale, double default_, opforge::pkg::Tensor& out,
    opforge::pkg::TensorList& rest) {
  float* o = out.data<float>();
  o[0] = in_0_.data<float>()[0] * scale;
  o[1] = opt ? opt->data<float>()[0] : -1.0f;
  o[2] = static_cast<float>(many.size());
  o[3] = static_cast<float>(mode);
  o[4] = static_cast<float>(dims.size() == 2 ? dims[0] * 10 + dims[1] : -1);
  o[5] = keep ? 1.0f : 0.0f;
  o[6] = maybe ? static_cast<float>(*maybe) : -1.0f;
  o[7] = static_cast<float>(default_);
  o[8] = static_cast<float>(rest.size());
  return opforge::pkg::Status::Ok();
}
}
""")
    lib = build_package(project, output=tmp_path / "libQnnRich.so", cache_root=pkg_cache)
    trust_packages([lib])
    from opforge.backends.oppackage.runtime import load_package

    loaded = load_package(lib, package_name="Rich")
    assert loaded.version == '0.1 "β" \\ ?' and loaded.opdef_xml == RICH
    assert loaded.opdef().op("Mix").description.startswith("ends a comment */")

    def run(inputs, slots, params, n_rest):
        node = PackageNode("Rich", "Mix", "x.y.default", "RichInterfaceProvider", "cpu", host_platform(),
                           str(lib), tuple(params), tuple(slots),
                           tuple(TensorSpec("float32", (1,)) for _ in inputs),
                           (TensorSpec("float32", (9,)),) + tuple(TensorSpec("float32", (1,)) for _ in range(n_rest)))
        _, _, op = prepare(node)
        out = np.zeros(9, np.float32)
        op([np.array([v], np.float32) for v in inputs], [out] + [np.zeros(1, np.float32)] * n_rest)
        return out.tolist()

    assert run([2.0], [0], [PackageParam("scale", "float", (3.0,))], 1) == [6, -1, 0, 1, 1, 1, -1, 0.5, 1]
    assert run([2.0, 7.0, 1.0, 1.0], [0, 1, 2, 2],
               [PackageParam("scale", "int", (1,)), PackageParam("mode", "int", (0,)),
                PackageParam("dims", "int", (3, 4), True), PackageParam("keep", "bool", (False,)),
                PackageParam("maybe", "int", (9,)), PackageParam("default", "float", (2.0,))], 2) \
        == [2, 7, 2, 0, 34, 0, 9, 2, 2]
    with pytest.raises(BackendError, match="mandatory parameter 'scale' not given"):
        run([2.0], [0], [], 1)
    with pytest.raises(BackendError, match="input slot 1 given twice"):
        run([2.0, 1.0, 1.0], [0, 1, 1], [PackageParam("scale", "float", (1.0,))], 1)
    with pytest.raises(BackendError, match="1 outputs — valid: at least 2"):
        run([2.0], [0], [PackageParam("scale", "float", (1.0,))], 0)
    with pytest.raises(BackendError, match="parameter 'dims' — a float — valid: an integer"):
        run([2.0], [0], [PackageParam("scale", "float", (1.0,)),
                         PackageParam("dims", "float", (1.0,), True)], 1)


def test_build_cache_and_output(example_library, pkg_cache, tmp_path):
    entries = sorted((pkg_cache / "build" / "libs").iterdir())
    again = build_package(EXAMPLE, output=tmp_path, cache_root=pkg_cache)
    assert sorted((pkg_cache / "build" / "libs").iterdir()) == entries  # a hit: nothing compiled
    assert again == tmp_path / "libQnnExampleOpPackage.so"
    assert again.read_bytes() == example_library.read_bytes()
    assert not (EXAMPLE / "src" / "ExampleOpPackageInterface.cpp").exists()  # the project is only read


def test_compile_errors_are_shown(tmp_path, pkg_cache):
    pkg = load_opdef_xml(EXAMPLE_XML)
    generate_skeleton(pkg, EXAMPLE_XML.read_text(), tmp_path / "p")
    (tmp_path / "p" / "src" / "ops" / "ElementWiseAdd.cpp").write_text("int broken( {\n")
    with pytest.raises(BuildError, match=r"ElementWiseAdd.cpp:1:\d+: error"):
        build_package(tmp_path / "p", output=tmp_path / "x.so", cache_root=pkg_cache)
    (tmp_path / "p" / "src" / "ops" / "ElementWiseAdd.cpp").unlink()
    with pytest.raises(BuildError, match="no source for op.s. ElementWiseAdd"):
        build_package(tmp_path / "p", output=tmp_path / "x.so", cache_root=pkg_cache)
    with pytest.raises(BuildError, match="0 XML files in config/"):
        build_package(tmp_path, output=tmp_path / "x.so", cache_root=pkg_cache)


@pytest.mark.parametrize("target,platform,needles", [
    ("htp", None, ["--target htp", "Hexagon SDK", "QNN_SDK_ROOT"]),
    ("dsp", None, ["--target dsp", "Hexagon SDK"]),
    ("gpu", None, ["OpenCL"]),
    ("npu", None, ["unknown", "valid: cpu, htp"]),
    ("cpu", "aarch64_android", ["Android NDK"]),
    ("cpu", "sparc", ["unknown", "valid: x86_64"]),
])
def test_refused_targets(target, platform, needles):
    if platform == host_platform():
        pytest.skip("that platform is this machine's")
    with pytest.raises(BuildError) as e:
        check_target(target, platform)
    for needle in needles:
        assert needle in str(e.value)


def test_cli_new_and_build(tmp_path, monkeypatch):
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(tmp_path / "cache"))
    runner = CliRunner()
    result = runner.invoke(cli, ["oppackage", "new", str(EXAMPLE_XML), "-o", str(tmp_path / "p")])
    assert result.exit_code == 0, result.output
    assert "src/ops/ExampleCustomOp.cpp: opforge::pkg::Status ExampleCustomOp(" in result.output
    result = runner.invoke(cli, ["oppackage", "build", str(tmp_path / "p"), "--target", "cpu",
                                 "-o", str(tmp_path / "libQnnExampleOpPackage.so"), "--json"])
    assert result.exit_code == 0, result.output
    info = json.loads(result.output)
    assert info["ops"] == ["ExampleCustomOp", "ElementWiseAdd"] and info["platform"] == host_platform()
    result = runner.invoke(cli, ["oppackage", "build", str(tmp_path / "p"), "--target", "htp"])
    assert result.exit_code != 0 and "Hexagon SDK" in str(result.exception)
    # a manifest with an op_package entry is a source too
    (tmp_path / "m.yaml").write_text(
        "- op_package: Y\n  ops:\n    - name: Scale\n      inputs: [{name: x, datatypes: [QNN_DATATYPE_FLOAT_32]}]\n"
        "      outputs: [{name: y, datatypes: [QNN_DATATYPE_FLOAT_32]}]\n")
    result = runner.invoke(cli, ["oppackage", "new", str(tmp_path / "m.yaml"), "-o", str(tmp_path / "y")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "y" / "config" / "Y.xml").is_file()


# --- registration checks at load ----------------------------------------------------------

def _iface(name, abi="OPFORGE_OPPACKAGE_ABI_VERSION", target='"cpu"', platform="OPFORGE_PKG_PLATFORM",
           ops='{"Op", create, execute, destroy}', provider=None):
    return f"""
    static int32_t create(const opforge_pkg_param*, int32_t, const opforge_pkg_tensor*, const int32_t*,
                          int32_t, const opforge_pkg_tensor*, int32_t, void** impl, char*, int32_t) {{
      static int x; *impl = &x; return 0; }}
    static int32_t execute(void*, const opforge_pkg_tensor*, int32_t, opforge_pkg_tensor*, int32_t,
                           char*, int32_t) {{ return 0; }}
    static void destroy(void*) {{}}
    static const opforge_pkg_op kOps[] = {{ {ops} }};
    static const opforge_pkg_interface kI = {{ {abi}, "{name}", "1", {target}, {platform},
        sizeof(kOps) / sizeof(kOps[0]), kOps, "" }};
    extern "C" __attribute__((visibility("default"))) int32_t {provider or name + "InterfaceProvider"}(
        uint32_t, const opforge_pkg_interface** out) {{ *out = &kI; return 0; }}
    """


def _reg(path, name, **kw):
    return parse_op_package_infos([{"op_package_name": name, "op_package_path": str(path),
                                    "custom_op_name": kw.pop("op", "a.b.default"),
                                    "op_type_name": "Op", **kw}])


def test_package_for_another_abi(raw_package):
    lib = raw_package("OldAbi", _iface("OldAbi", abi=str(ABI_VERSION + 98)))
    with pytest.raises(BackendError, match=rf"built for op-package ABI version {ABI_VERSION + 98}; "
                                           rf"this opforge speaks version {ABI_VERSION} — fix: rebuild"):
        load_package(lib, package_name="OldAbi")


def test_package_for_another_platform_or_target(raw_package):
    lib = raw_package("Arm", _iface("Arm", platform='"aarch64_android"'))
    with pytest.raises(BackendError, match="built for platform 'aarch64_android', this machine is"):
        load_package(lib, package_name="Arm")
    lib = raw_package("Htp", _iface("Htp", target='"htp"'))
    with pytest.raises(BackendError, match="built for target 'htp' — valid: cpu"):
        load_package(lib, package_name="Htp")
    with pytest.raises(BackendError, match="registered for platform aarch64_android"):
        load_package(lib, package_name="Htp", platform="aarch64_android")
    # registrations for another platform are skipped, as ExecuTorch does
    assert load_packages(_reg(lib, "Htp", platform="aarch64_android")) == {}


def test_wrong_interface_provider_and_name(example_library, raw_package, tmp_path):
    with pytest.raises(BackendError, match="interface provider 'ExampleInterfaceProvider' — the library "
                                           "exports no such symbol .it does export "
                                           "'ExampleOpPackageInterfaceProvider'.") as e:
        load_packages(_reg(example_library, "ExampleOpPackage", interface_provider="ExampleInterfaceProvider"))
    assert "fix: set interface_provider to 'ExampleOpPackageInterfaceProvider'" in str(e.value)
    lib = raw_package("Named", _iface("Named", provider="OtherInterfaceProvider"))
    with pytest.raises(BackendError, match="no such symbol — valid: .* 'NamedInterfaceProvider'"):
        load_package(lib, package_name="Named")
    assert load_package(lib, package_name="Named", interface_provider="OtherInterfaceProvider").ops
    with pytest.raises(BackendError, match="the library is package 'ExampleOpPackage', registered as 'Mine'"):
        load_package(example_library, package_name="Mine", interface_provider="ExampleOpPackageInterfaceProvider")
    (tmp_path / "junk.so").write_bytes(b"not an elf")
    with pytest.raises(BackendError, match="cannot be loaded"):
        load_package(tmp_path / "junk.so", package_name="Junk")


def test_duplicate_op_types_across_packages(raw_package):
    one = raw_package("One", _iface("One"))
    two = raw_package("Two", _iface("Two"))
    with pytest.raises(BackendError, match="op type 'Op': defined by package 'One' and by package 'Two'"):
        load_packages(_reg(one, "One", op="a.b.default") + _reg(two, "Two", op="c.d.default"))
    twice = raw_package("Twice", _iface("Twice", ops='{"Op", create, execute, destroy}, '
                                                     '{"Op", create, execute, destroy}'))
    with pytest.raises(BackendError, match="op type 'Op' listed twice"):
        load_package(twice, package_name="Twice")
    # one package registered for several torch ops is loaded once
    loaded = load_packages(_reg(one, "One", op="a.b.default") + _reg(one, "One", op="e.f.default"))
    assert list(loaded) == ["One"]
