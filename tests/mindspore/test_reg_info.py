"""CustomRegOp / DataType produce MindSpore's dictionary; parse_reg_info refuses what
MindSpore would only report at launch (no torch, no compiler)."""

import json

import pytest

from opforge.errors import ManifestError
from opforge.mindspore import CustomRegOp, DataType, parse_reg_info


def add_info():
    return (CustomRegOp("CustomAdd").input(0, "x1").input(1, "x2").output(0, "y")
            .dtype_format(DataType.F32_Default, DataType.F32_Default, DataType.F32_Default)
            .dtype_format(DataType.I32_None, DataType.I32_None, DataType.I32_None)
            .attr("scale", "required", "float", value=2.0).target("CPU").get_op_info())


def test_dictionary_has_mindsporesh_keys_and_values():
    info = add_info()
    assert info["op_name"] == "CustomAdd"
    assert info["target"] == "CPU"
    assert info["inputs"] == [{"index": 0, "name": "x1", "paramType": "required"},
                              {"index": 1, "name": "x2", "paramType": "required"}]
    assert info["outputs"] == [{"index": 0, "name": "y", "paramType": "required"}]
    assert info["dtype_format"] == [
        (("float32", "DefaultFormat"),) * 3, (("int32", ""),) * 3]
    assert info["attr"] == [{"name": "scale", "paramType": "required", "type": "float",
                             "value": 2.0}]


def test_parsed_from_dict_json_list_and_builder_alike():
    info = add_info()
    parsed = parse_reg_info(info, "t")
    assert parsed.inputs == ("x1", "x2") and parsed.outputs == ("y",)
    assert parsed.dtype_rows() == (("float32",) * 3, ("int32",) * 3)
    assert parse_reg_info(json.dumps(info), "t") == parsed
    gpu = dict(info, target="GPU")
    assert parse_reg_info([gpu, info], "t") == parsed


@pytest.mark.parametrize("mutate, words", [
    (lambda i: i["dtype_format"].append((DataType.F32_Default,) * 2), ["row 2", "has 2", "valid: 3"]),
    (lambda i: i["dtype_format"].append((("float8", "DefaultFormat"),) * 3), ["float8", "valid dtypes"]),
    (lambda i: i["dtype_format"].append((("float32", "FRACTAL_NZ"),) * 3), ["FRACTAL_NZ", "formats"]),
    (lambda i: i["inputs"][1].update(index=3), ["index 3", "position 1"]),
    (lambda i: i["inputs"][1].pop("name"), ["input 1", "no name"]),
    (lambda i: i["outputs"][0].update(name="x1"), ["'x1' is used twice"]),
    (lambda i: i.update(target="Ascend"), ["target 'Ascend'", "CPU"]),
    (lambda i: i["inputs"][1].update(paramType="dynamic"), ["paramType 'dynamic'", "required"]),
])
def test_malformed_reg_info_is_refused_with_what_and_fix(mutate, words):
    info = add_info()
    mutate(info)
    with pytest.raises(ManifestError) as e:
        parse_reg_info(info, "api")
    for word in words:
        assert word in str(e.value)
    assert "fix:" in str(e.value)


def test_builder_refuses_misuse_where_written():
    with pytest.raises(ManifestError, match="param_type"):
        CustomRegOp("A").input(0, "x", "sometimes")
    with pytest.raises(ManifestError, match="name"):
        CustomRegOp("A").input(0, "not a name")
    with pytest.raises(ManifestError, match="DataType"):
        CustomRegOp("A").dtype_format("float32")
    with pytest.raises(ManifestError, match="op_name"):
        CustomRegOp(3)
    with pytest.raises(ManifestError, match="not JSON"):
        parse_reg_info("{nope", "api")
    with pytest.raises(ManifestError, match="exactly one"):
        parse_reg_info([dict(add_info(), target="GPU")], "api")
