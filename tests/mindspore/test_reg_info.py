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
        CustomRegOp("A").input(0, 7)
    with pytest.raises(ManifestError, match="DataType"):
        CustomRegOp("A").dtype_format("float32")
    with pytest.raises(ManifestError, match="target 3"):
        CustomRegOp("A").target(3)
    with pytest.raises(TypeError):  # what MindSpore raises for it
        CustomRegOp("A").target(3)
    with pytest.raises(ManifestError, match="defaultValue 2.5"):
        CustomRegOp("A").attr("scale", "required", "float", 2.5)
    with pytest.raises(ManifestError, match="fusion_type"):
        CustomRegOp("A").fusion_type(1)
    with pytest.raises(ManifestError, match="valid: 2, one per input \\(1\\) then per output \\(1\\)"):
        CustomRegOp("A").input(0, "x").output(0, "y").dtype_format(DataType.F32_Default)
    with pytest.raises(ManifestError, match="op_name"):
        CustomRegOp(3)
    with pytest.raises(ManifestError, match="not JSON"):
        parse_reg_info("{nope", "api")
    with pytest.raises(ManifestError, match="exactly one"):
        parse_reg_info([dict(add_info(), target="GPU")], "api")


# MindSpore's get_op_info() for each chain (its CustomRegOp: keys left None are absent,
# fusion_type "", target "UnKnown", the key order of its fields)
CHAINS = [
    (lambda: CustomRegOp(), {"op_name": "Custom", "inputs": [], "outputs": [], "attr": [],
                             "fusion_type": "", "dtype_format": [], "target": "UnKnown"}),
    (lambda: CustomRegOp("A").input(), {"inputs": [{"paramType": "required"}]}),
    (lambda: CustomRegOp("A").input(0, "x", None, extra=1),
     {"inputs": [{"index": 0, "name": "x", "extra": 1}]}),
    (lambda: CustomRegOp("A").output(1, "y-1", "optional"),
     {"outputs": [{"index": 1, "name": "y-1", "paramType": "optional"}]}),
    (lambda: CustomRegOp("A").attr(), {"attr": [{}]}),
    (lambda: CustomRegOp("A").attr("s", "required", "float", "1.0", value="2"),
     {"attr": [{"name": "s", "paramType": "required", "type": "float", "defaultValue": "1.0",
                "value": "2"}]}),
    (lambda: CustomRegOp("A").fusion_type("OPAQUE"), {"fusion_type": "OPAQUE"}),
    (lambda: CustomRegOp("A").target(), {"target": None}),
    (lambda: CustomRegOp("A").target("CPU"), {"target": "CPU"}),
    (lambda: CustomRegOp("A").input(0, "x").output(0, "y")
     .dtype_format(("float32", "DefaultFormat", "tensor"), DataType.F16_5HD),
     {"dtype_format": [(("float32", "DefaultFormat", "tensor"), ("float16", "NC1HWC0"))]}),
]


@pytest.mark.parametrize("chain, expected", CHAINS)
def test_every_builder_chain_gives_mindspores_dictionary(chain, expected):
    info = chain()
    got = info.get_op_info()
    assert list(got) == ["op_name", "inputs", "outputs", "attr", "fusion_type", "dtype_format",
                         "target"]
    for key, value in expected.items():
        assert got[key] == value, key


# MindSpore's DataType: the dtype of each name prefix and the format of each suffix
_PREFIX = {"None": "", "BOOL": "bool", "I8": "int8", "U8": "uint8", "I16": "int16",
           "U16": "uint16", "I32": "int32", "U32": "uint32", "I64": "int64", "U64": "uint64",
           "F16": "float16", "BF16": "bfloat16", "F32": "float32", "F64": "float64",
           "C64": "complex64", "C128": "complex128"}
_SUFFIX = {"None": ("",), "Default": ("DefaultFormat",), "5HD": ("NC1HWC0",),
           "FracZ": ("FRACTAL_Z",), "FracNZ": ("FRACTAL_NZ",),
           "FracZNLSTM": ("FRACTAL_ZN_LSTM",), "FracZNRNN": ("FRACTAL_ZN_RNN",),
           "ND_RNNBIAS": ("ND_RNN_BIAS",), "Default_Tuple": ("DefaultFormat", "tuple"),
           "Default_List": ("DefaultFormat", "list")}
_INTS_AND_FLOATS = ("BOOL", "I8", "U8", "I16", "U16", "I32", "U32", "I64", "U64", "F16",
                    "BF16", "F32", "F64")
_NAMES = (
    ["None_None", "None_Default", "C64_Default", "C128_Default", "C64_Default_Tuple",
     "C128_Default_Tuple"]
    + [f"{p}_{s}" for p in _INTS_AND_FLOATS
       for s in ("None", "Default", "5HD", "FracZ", "FracNZ", "C1HWNCoC0", "NCHW", "NHWC",
                 "HWCN", "NDHWC", "ChannelLast", "Default_Tuple", "Default_List")]
    + ["I8_NCDHW", "I8_NDC1HWC0", "I8_NC1HWC0", "U8_NCDHW", "U8_NDC1HWC0", "U8_NC1HWC0",
       "I32_NDC1HWC0", "I32_NCDHW"]
    + [f"{p}_{s}" for p in ("F16", "BF16", "F32")
       for s in ("NCDHW", "DHWCN", "NDC1HWC0", "FRACTAL_Z_3D", "FracZNLSTM", "FracZNRNN",
                 "ND_RNNBIAS")])


@pytest.mark.parametrize("name", _NAMES)
def test_data_type_name(name):
    prefix, _, suffix = name.partition("_")
    assert getattr(DataType, name) == (_PREFIX[prefix], *_SUFFIX.get(suffix, (suffix,)))


def test_data_type_has_mindspores_names_only():
    from opforge.mindspore.data_type import DATA_TYPES

    assert len(_NAMES) == len(set(_NAMES)) == 204
    assert set(DATA_TYPES) == set(_NAMES)


def test_tuple_and_list_rows_are_read_as_their_dtype_and_format():
    info = (CustomRegOp("A").input(0, "x").output(0, "y")
            .dtype_format(DataType.F32_Default_Tuple, DataType.F32_Default).get_op_info())
    assert parse_reg_info(info, "api").dtype_rows() == (("float32", "float32"),)
    bf16 = (CustomRegOp("A").input(0, "x").output(0, "y")
            .dtype_format(DataType.BF16_Default, DataType.BF16_Default).get_op_info())
    with pytest.raises(ManifestError, match="bfloat16"):
        parse_reg_info(bf16, "api")
