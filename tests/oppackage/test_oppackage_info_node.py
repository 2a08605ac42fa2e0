"""Registrations (OpPackageInfo from a compile spec or a file) and PackageNode bytes,
including hostile bytes (pure Python)."""

import json
import random
import struct

import pytest

from opforge.backends.oppackage import (
    OpPackageInfo, PackageNode, PackageParam, TensorSpec, load_op_package_infos,
    normalize_op_name, parse_op_package_infos,
)
from opforge.backends.oppackage.build import host_platform
from opforge.errors import BackendError

ENTRY = {"op_package_name": "ExampleOpPackage", "op_package_path": "/x/libQnnExampleOpPackage.so",
         "custom_op_name": "my_ops.mul3.default", "op_type_name": "ExampleCustomOp"}


def test_defaults_and_spellings():
    (info,) = parse_op_package_infos([ENTRY])
    assert info == OpPackageInfo("ExampleOpPackage", "/x/libQnnExampleOpPackage.so",
                                 "ExampleOpPackageInterfaceProvider", "cpu",
                                 "my_ops.mul3.default", "ExampleCustomOp", host_platform())
    (info,) = parse_op_package_infos(json.dumps({"op_packages": [
        {**ENTRY, "custom_op_name": "aten::add.Tensor", "qnn_op_type_name": "Add",
         "op_type_name": None, "platform": "AARCH64_ANDROID", "target": "CPU"}]}).replace(
        ', "op_type_name": null', ""))
    assert (info.custom_op_name, info.op_type_name, info.platform) == ("aten.add.Tensor", "Add", "aarch64_android")
    assert normalize_op_name("my_ops::mul3") == "my_ops.mul3.default"
    assert normalize_op_name("not an op") is None
    assert parse_op_package_infos("") == [] and parse_op_package_infos(None) == []


@pytest.mark.parametrize("value,needle", [
    ([{**ENTRY, "custom_op_nam": "x"}], "unknown key 'custom_op_nam'"),
    ([{k: v for k, v in ENTRY.items() if k != "op_package_path"}], "op_package_path"),
    ([{**ENTRY, "custom_op_name": "mul3"}], "not a torch op name"),
    ([{**ENTRY, "target": "npu"}], "target 'npu'"),
    ([{**ENTRY, "platform": "riscv"}], "platform 'riscv'"),
    ([{**ENTRY, "platform": 3}], "platform = 3"),
    ("[{", "not JSON"),
    ({"x": 1}, "a list of package registrations"),
    (["x"], "not a mapping"),
])
def test_bad_registrations(value, needle):
    with pytest.raises(BackendError, match="valid|JSON") as e:
        parse_op_package_infos(value)
    assert needle in str(e.value)
    assert "op_packages" in str(e.value)


def test_two_packages_for_one_torch_op():
    other = {**ENTRY, "op_package_name": "Other", "op_type_name": "Mul"}
    with pytest.raises(BackendError, match=r"already mapped to ExampleOpPackage::ExampleCustomOp by entry \[0\]"):
        parse_op_package_infos([ENTRY, other])
    assert len(parse_op_package_infos([ENTRY, ENTRY])) == 2  # the same registration twice is harmless


def test_files(tmp_path):
    (tmp_path / "p.json").write_text(json.dumps([{**ENTRY, "op_package_path": "lib/libQnnE.so"}]))
    (info,) = load_op_package_infos(tmp_path / "p.json")
    assert info.op_package_path == str(tmp_path / "lib" / "libQnnE.so")  # relative to the file
    (tmp_path / "p.yaml").write_text("op_packages:\n  - op_package_name: E\n    op_package_path: /l.so\n"
                                     "    custom_op_name: aten.add.Tensor\n    op_type_name: Add\n")
    assert load_op_package_infos(tmp_path / "p.yaml")[0].custom_op_name == "aten.add.Tensor"
    (tmp_path / "bad.yaml").write_text("- op_package_name: [\n")
    with pytest.raises(BackendError, match="bad.yaml"):
        load_op_package_infos(tmp_path / "bad.yaml")
    with pytest.raises(BackendError, match="cannot read it"):
        load_op_package_infos(tmp_path / "none.json")


NODE = PackageNode("ExampleOpPackage", "ElementWiseAdd", "aten.add.Tensor",
                   "ExampleOpPackageInterfaceProvider", "cpu", "x86_64", "/x/lib.so",
                   (PackageParam("alpha", "float", (2.0,)), PackageParam("dims", "int", (0, -1), True),
                    PackageParam("keep", "bool", (True,))),
                   (0, 1), (TensorSpec("float32", (2, 3)), TensorSpec("float32", (3,))),
                   (TensorSpec("float32", (2, 3)),))


def test_node_round_trip():
    data = NODE.to_bytes()
    assert data[:8] == b"OFPKGND\0" and struct.unpack_from("<II", data, 8) == (1, len(data) - 16)
    assert PackageNode.from_bytes(data) == NODE
    assert PackageNode.from_bytes(memoryview(data)) == NODE
    assert NODE.describe() == "package ExampleOpPackage::ElementWiseAdd"


def _with(body_change):
    body = json.loads(NODE.to_bytes()[16:])
    body_change(body)
    raw = json.dumps(body).encode()
    return struct.pack("<8sII", b"OFPKGND\0", 1, len(raw)) + raw


@pytest.mark.parametrize("data,needle", [
    (b"", "shorter than"),
    (b"XXXXXXXX" + NODE.to_bytes()[8:], "magic"),
    (NODE.to_bytes()[:8] + struct.pack("<I", 2) + NODE.to_bytes()[12:], "format version 2"),
    (NODE.to_bytes()[:-1], "body length"),
    (NODE.to_bytes() + b"\0", "body length"),
    (struct.pack("<8sII", b"OFPKGND\0", 1, 3) + b"\xff\xfe\xfd", "not JSON"),
    (struct.pack("<8sII", b"OFPKGND\0", 1, 2) + b"[]", "not a JSON object"),
    (_with(lambda b: b.pop("op_type")), "no 'op_type'"),
    (_with(lambda b: b.update(inputs=[{"dtype": "float99", "shape": [1]}])), "dtype"),
    (_with(lambda b: b["inputs"][0].update(shape=[-1])), "shape"),
    (_with(lambda b: b["inputs"][0].update(shape=[1] * 17)), "shape"),
    (_with(lambda b: b.update(input_slots=[0])), "input_slots"),
    (_with(lambda b: b["params"][0].update(kind="str")), "param kind"),
    (_with(lambda b: b["params"][0].update(values=["x"])), "not a float"),
    (_with(lambda b: b["params"][1].update(values=[1.5])), "not a int"),
    (_with(lambda b: b["params"][0].update(values=[1.0, 2.0])), "2 values"),
    (_with(lambda b: b.update(package="")), "'package'"),
    (_with(lambda b: b.update(package=7)), "not a str"),
    (struct.pack("<8sII", b"OFPKGND\0", 1, 9) + b'{"a":NaN}', "not JSON"),
])
def test_node_bytes_refused(data, needle):
    with pytest.raises(BackendError) as e:
        PackageNode.from_bytes(data)
    assert needle in str(e.value) and "re-export" in str(e.value), str(e.value)


def test_node_bytes_fuzz():
    rng = random.Random(7)
    good = NODE.to_bytes()
    for _ in range(2000):
        data = bytearray(good)
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        if rng.random() < 0.3:
            data = data[: rng.randrange(len(data))]
        try:
            PackageNode.from_bytes(bytes(data))
        except BackendError:
            pass
