"""``DataType``: MindSpore's named ``(dtype, format)`` pairs, generated from one table.

MindSpore's ``mindspore.ops.DataType`` names each pair ``<DTYPE>_<FORMAT>``:
``F32_Default = ("float32", "DefaultFormat")``, ``F16_5HD = ("float16", "NC1HWC0")``. The
names and values below are MindSpore's (its ``op_info_register.py``, the version this
table was taken from: 156 names). Every dtype has the eleven common formats, some have a
few more, and the complex types only DefaultFormat. opforge runs CPU kernels on dense
arrays, so ``parse_reg_info`` accepts the DefaultFormat/NCHW/NHWC/ND/"" rows and refuses the
Ascend layouts (NC1HWC0, FRACTAL_Z, ...) with an error that says so; the names exist so
that a MindSpore file imports and builds its registration info unchanged.
"""

from __future__ import annotations

__all__ = ["DataType", "DATA_TYPES", "FORMAT_NAMES"]

# The part of a name after the dtype → MindSpore's format string.
FORMAT_NAMES: dict[str, str] = {
    "None": "", "Default": "DefaultFormat", "5HD": "NC1HWC0", "FracZ": "FRACTAL_Z",
    "FracNZ": "FRACTAL_NZ", "C1HWNCoC0": "C1HWNCoC0", "NCHW": "NCHW", "NHWC": "NHWC",
    "HWCN": "HWCN", "NDHWC": "NDHWC", "ChannelLast": "ChannelLast", "NDC1HWC0": "NDC1HWC0",
    "NC1HWC0": "NC1HWC0", "NCDHW": "NCDHW", "DHWCN": "DHWCN", "FRACTAL_Z_3D": "FRACTAL_Z_3D",
    "FracZNLSTM": "FRACTAL_ZN_LSTM", "FracZNRNN": "FRACTAL_ZN_RNN",
    "ND_RNNBIAS": "ND_RNN_BIAS",
}

_COMMON = ("None", "Default", "5HD", "FracZ", "FracNZ", "C1HWNCoC0", "NCHW", "NHWC", "HWCN",
           "NDHWC", "ChannelLast")
_FLOAT_EXTRA = ("NCDHW", "DHWCN", "NDC1HWC0", "FRACTAL_Z_3D", "FracZNLSTM", "FracZNRNN",
                "ND_RNNBIAS")

# name prefix → (MindSpore's dtype string, the format parts it has)
_TABLE: dict[str, tuple[str, tuple[str, ...]]] = {
    "None": ("", ("None", "Default")),
    "BOOL": ("bool", _COMMON),
    "I8": ("int8", _COMMON + ("NDC1HWC0", "NC1HWC0")),
    "U8": ("uint8", _COMMON + ("NDC1HWC0", "NC1HWC0")),
    "I16": ("int16", _COMMON),
    "U16": ("uint16", _COMMON),
    "I32": ("int32", _COMMON + ("NDC1HWC0", "NCDHW")),
    "U32": ("uint32", _COMMON),
    "I64": ("int64", _COMMON),
    "U64": ("uint64", _COMMON),
    "F16": ("float16", _COMMON + _FLOAT_EXTRA),
    "F32": ("float32", _COMMON + _FLOAT_EXTRA),
    "F64": ("float64", _COMMON),
    "C64": ("complex64", ("Default",)),
    "C128": ("complex128", ("Default",)),
}

# every name → its (dtype, format) pair
DATA_TYPES: dict[str, tuple[str, str]] = {
    f"{prefix}_{part}": (dtype, FORMAT_NAMES[part])
    for prefix, (dtype, parts) in _TABLE.items() for part in parts
}


class DataType:
    """``(dtype, format)`` pairs as MindSpore names them: ``DataType.F32_Default`` is
    ``("float32", "DefaultFormat")`` (the full list: ``DATA_TYPES``)."""


for _name, _pair in DATA_TYPES.items():
    setattr(DataType, _name, _pair)
del _name, _pair
