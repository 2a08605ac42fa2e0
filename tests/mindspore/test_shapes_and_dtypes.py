"""Custom ops whose outputs differ from every input, in shape and in dtype, with Python and
with C++ inference: the fake (torch.export's view), the exported program (lean and ATen)
and eager must all have the inferred shape and dtype and the right values. Identity
``out_shape``s hide a fake that copies input 0's shape; widening casts hide nothing only
if every MindSpore TypeId number opforge passes is the header's.
"""

import re
import shutil
import subprocess

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from mindspore_support import KERNELS, needs_cxx  # noqa: E402
from opforge.export import export  # noqa: E402
from opforge.mindspore import Custom, CustomRegOp, DataType, write_package  # noqa: E402
from opforge.mindspore.compile import include_dir  # noqa: E402
from opforge.mindspore.dtypes import TYPE_IDS  # noqa: E402
from opforge.program import to_bytes  # noqa: E402
from opforge.runtime import load  # noqa: E402

pytestmark = needs_cxx

SOURCE = KERNELS / "shape_ops.cc"


def row_sum_shape(x):
    return [x[0]]


def matmul_shape(x, w):
    return [x[0], w[1]]


def same_dtype(*dtypes):
    return dtypes[0]


def _reg(name, inputs, rows):
    reg = CustomRegOp(name)
    for i, n in enumerate(inputs):
        reg.input(i, n)
    reg.output(0, "y")
    for row in rows:
        reg.dtype_format(*row)
    return reg.target("CPU").get_op_info()


F32 = DataType.F32_Default


def row_sum(infer: str, cache):
    shape, dtype = (row_sum_shape, same_dtype) if infer == "python" else (None, same_dtype)
    return Custom(f"{SOURCE}:RowSum", out_shape=shape, out_dtype=dtype, func_type="aot",
                  reg_info=_reg("RowSum", ["x"], [(F32, F32)]), cache_root=cache)


def matmul(infer: str, cache):
    shape = matmul_shape if infer == "python" else None
    return Custom(f"{SOURCE}:MatMulCustom", out_shape=shape, out_dtype=same_dtype, func_type="aot",
                  reg_info=_reg("MatMulCustom", ["x", "w"], [(F32, F32, F32)]), cache_root=cache)


class Model(torch.nn.Module):
    def __init__(self, op, kind):
        super().__init__()
        self.op, self.kind = op, kind
        torch.manual_seed(0)
        self.w = torch.nn.Parameter(torch.randn(5, 3), requires_grad=False)

    def forward(self, x):
        if self.kind == "row_sum":
            return self.op(x * 2.0) + 1.0
        return self.op(x * 2.0, self.w) + 1.0


def _reference(kind, x, w):
    return (2 * x).sum(1) + 1 if kind == "row_sum" else (2 * x) @ w + 1


@pytest.mark.parametrize("infer", ["python", "cpp"])
@pytest.mark.parametrize("kind", ["row_sum", "matmul"])
def test_output_shape_differs_from_every_input(kind, infer, cache, tmp_path, monkeypatch):
    op = (row_sum if kind == "row_sum" else matmul)(infer, cache)
    x = torch.randn(4, 5)
    want_shape = (4,) if kind == "row_sum" else (4, 3)
    model = Model(op, kind).eval()
    # fake inference, as torch.export sees it
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fx = mode.from_tensor(torch.empty(7, 5))
        fake = op(fx) if kind == "row_sum" else op(fx, mode.from_tensor(torch.empty(5, 2)))
    assert tuple(fake.shape) == ((7,) if kind == "row_sum" else (7, 2))
    # eager
    want = _reference(kind, x.double(), model.w.double()).numpy()
    eager = model(x)
    assert tuple(eager.shape) == want_shape
    np.testing.assert_allclose(eager.numpy(), want, rtol=1e-5, atol=1e-5)
    # the exported program: its output value has the inferred shape, lean and ATen run it
    program = export(model, (x,))
    out_value = program.method("forward").values[program.method("forward").outputs[0]]
    assert tuple(out_value.sizes) == want_shape
    write_package([op.op], tmp_path / "vendors" / "shapes")
    monkeypatch.setenv("OPFORGE_CUSTOM_OPP_PATH", str(tmp_path))
    data = to_bytes(program)
    (lean,) = load(data, kernels=["opforge.mindspore:register_vendor_ops"]).method("forward")(x.numpy())
    (aten,) = load(data, mode="aten").method("forward")(x.numpy())
    for got in (lean, aten):
        assert got.shape == want_shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_every_type_id_is_the_headers():
    """Each TYPE_IDS entry against the enumerator custom_aot_extra.h ships, compiled."""
    cxx = shutil.which("c++") or shutil.which("g++")
    names = {"bool": "Bool", "int8": "Int8", "int16": "Int16", "int32": "Int32", "int64": "Int64",
             "uint8": "UInt8", "uint16": "UInt16", "uint32": "UInt32", "uint64": "UInt64",
             "float16": "Float16", "float32": "Float32", "float64": "Float64",
             "bfloat16": "BFloat16", "complex64": "Complex64", "complex128": "Complex128"}
    assert set(names) == set(TYPE_IDS)
    body = "".join(f'  std::printf("{k} %d\\n", (int)kNumberType{v});\n' for k, v in names.items())
    probe = f'#include <cstdio>\n#include "custom_aot_extra.h"\nint main() {{\n{body}  return 0;\n}}\n'
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "probe.cc").write_text(probe)
        subprocess.run([cxx, "-std=c++17", f"-I{include_dir()}", "-o", f"{tmp}/probe",
                        f"{tmp}/probe.cc"], check=True)
        out = subprocess.run([f"{tmp}/probe"], capture_output=True, text=True, check=True).stdout
    header = {k: int(v) for k, v in re.findall(r"(\w+) (\d+)", out)}
    assert header == TYPE_IDS


WIDEN = {"float16": ("float32", DataType.F16_Default, DataType.F32_Default),
         "uint8": ("int16", DataType.U8_Default, DataType.I16_Default),
         "int16": ("int32", DataType.I16_Default, DataType.I32_Default)}


@pytest.mark.parametrize("dtype", sorted(WIDEN))
def test_cpp_type_inference_sees_the_right_type_ids(dtype, cache):
    wide, din, dout = WIDEN[dtype]
    rows = [(v[1], v[2]) for v in WIDEN.values()]
    op = Custom(f"{SOURCE}:WidenCustom", out_shape=lambda x: x, out_dtype=None, func_type="aot",
                reg_info=_reg("WidenCustom", ["x"], rows), cache_root=cache)
    assert op.op.infer([(2, 3)], [dtype]) == ([(2, 3)], [wide])
    x = (torch.arange(6).reshape(2, 3) * 7 % 50).to(getattr(torch, dtype))
    y = op(x)
    assert y.dtype == getattr(torch, wide)
    np.testing.assert_array_equal(y.numpy(), x.numpy().astype(wide))
