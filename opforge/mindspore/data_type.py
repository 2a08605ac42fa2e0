"""``DataType``: MindSpore's named ``(dtype, format)`` pairs, generated from one table.

MindSpore's ``mindspore.ops.DataType`` names each pair ``<DTYPE>_<FORMAT>``:
``F32_Default = ("float32", "DefaultFormat")``, ``F16_5HD = ("float16", "NC1HWC0")``;
``<DTYPE>_Default_Tuple`` / ``_List`` are 3-element ``(dtype, "DefaultFormat", "tuple")``.
The names and values are MindSpore's: the 204 of MindSpore 2.10's ``op_info_register.py``
(compared name by name with the wheel's file; ``BF16_*`` follows the float16 row). Every dtype has the eleven common formats, some a few more,
the complex types DefaultFormat and Tuple only. opforge runs CPU kernels on dense arrays,
so ``parse_reg_info`` accepts the DefaultFormat/NCHW/NHWC/ND/"" rows and refuses the
Ascend layouts (NC1HWC0, FRACTAL_Z, ...) and bfloat16 with an error that says so; the names
exist so that a MindSpore file imports and builds its registration info unchanged.
"""

from __future__ import annotations

__all__ = ["DataType", "DATA_TYPES", "FORMAT_NAMES"]

# The part of a name after the dtype → MindSpore's format string (and object type).
FORMAT_NAMES: dict[str, tuple[str, ...]] = {
    "None": ("",), "Default": ("DefaultFormat",), "5HD": ("NC1HWC0",),
    "FracZ": ("FRACTAL_Z",), "FracNZ": ("FRACTAL_NZ",), "C1HWNCoC0": ("C1HWNCoC0",),
    "NCHW": ("NCHW",), "NHWC": ("NHWC",), "HWCN": ("HWCN",), "NDHWC": ("NDHWC",),
    "ChannelLast": ("ChannelLast",), "NDC1HWC0": ("NDC1HWC0",), "NC1HWC0": ("NC1HWC0",),
    "NCDHW": ("NCDHW",), "DHWCN": ("DHWCN",), "FRACTAL_Z_3D": ("FRACTAL_Z_3D",),
    "FracZNLSTM": ("FRACTAL_ZN_LSTM",), "FracZNRNN": ("FRACTAL_ZN_RNN",),
    "ND_RNNBIAS": ("ND_RNN_BIAS",), "Default_Tuple": ("DefaultFormat", "tuple"),
    "Default_List": ("DefaultFormat", "list"),
}

_COMMON = ("None", "Default", "5HD", "FracZ", "FracNZ", "C1HWNCoC0", "NCHW", "NHWC", "HWCN",
           "NDHWC", "ChannelLast")
_SEQUENCES = ("Default_Tuple", "Default_List")
_FLOAT = _COMMON + ("NCDHW", "DHWCN", "NDC1HWC0", "FRACTAL_Z_3D", "FracZNLSTM", "FracZNRNN",
                    "ND_RNNBIAS") + _SEQUENCES

# name prefix → (MindSpore's dtype string, the format parts it has)
_TABLE: dict[str, tuple[str, tuple[str, ...]]] = {
    "None": ("", ("None", "Default")),
    "BOOL": ("bool", _COMMON + _SEQUENCES),
    "I8": ("int8", _COMMON + ("NCDHW", "NDC1HWC0", "NC1HWC0") + _SEQUENCES),
    "U8": ("uint8", _COMMON + ("NCDHW", "NDC1HWC0", "NC1HWC0") + _SEQUENCES),
    "I16": ("int16", _COMMON + _SEQUENCES),
    "U16": ("uint16", _COMMON + _SEQUENCES),
    "I32": ("int32", _COMMON + ("NDC1HWC0", "NCDHW") + _SEQUENCES),
    "U32": ("uint32", _COMMON + _SEQUENCES),
    "I64": ("int64", _COMMON + _SEQUENCES),
    "U64": ("uint64", _COMMON + _SEQUENCES),
    "F16": ("float16", _FLOAT),
    "BF16": ("bfloat16", _FLOAT),
    "F32": ("float32", _FLOAT),
    "F64": ("float64", _COMMON + _SEQUENCES),
    "C64": ("complex64", ("Default", "Default_Tuple")),
    "C128": ("complex128", ("Default", "Default_Tuple")),
}

# every name → its (dtype, format[, object type]) tuple
DATA_TYPES: dict[str, tuple[str, ...]] = {
    f"{prefix}_{part}": (dtype, *FORMAT_NAMES[part])
    for prefix, (dtype, parts) in _TABLE.items() for part in parts
}


class DataType:
    """``(dtype, format)`` pairs as MindSpore names them: ``DataType.F32_Default`` is
    ``("float32", "DefaultFormat")`` (the full list: ``DATA_TYPES``)."""


for _name, _pair in DATA_TYPES.items():
    setattr(DataType, _name, _pair)
del _name, _pair
