"""What MindSpore accepts, opforge accepts: a fixed out_shape without reg_info (the form of
MindSpore's own docstring), float16 inputs to a float32-only reg_info (MindSpore casts),
add_prim_attr, param_type=None, input names such as "x-1", 3-element dtype tuples; and a
wrong number of inputs at call time is an opforge error naming the op."""

import numpy as np
import pytest

from mindspore_support import KERNELS, needs_cxx
from opforge.errors import KernelError
from opforge.mindspore import CustomRegOp, DataType

torch = pytest.importorskip("torch")
pytestmark = needs_cxx


def _custom(*args, **kwargs):
    from opforge.mindspore import Custom

    return Custom(*args, **kwargs)


@pytest.mark.parametrize("out_dtype", [torch.float32, "float32"])
def test_fixed_out_shape_without_reg_info_is_defined_by_its_first_call(cache, out_dtype):
    op = _custom(f"{KERNELS / 'plain_add.cc'}:PlainAdd", out_shape=[4], out_dtype=out_dtype,
                 func_type="aot", cache_root=cache)
    x, y = torch.arange(4.0), torch.ones(4)
    assert op(x, y).tolist() == [1.0, 2.0, 3.0, 4.0]
    assert op.op.inputs == ("x0", "x1")
    with pytest.raises(KernelError, match="called with 3 input"):
        op(x, y, y)


def test_float16_inputs_are_cast_to_a_float32_only_row(cache):
    info = (CustomRegOp("PlainAdd").input(0, "x").input(1, "y").output(0, "z")
            .dtype_format(DataType.F32_Default, DataType.F32_Default, DataType.F32_Default)
            .target("CPU").get_op_info())
    op = _custom(f"{KERNELS / 'plain_add.cc'}:PlainAdd", out_shape=lambda x, y: x,
                 out_dtype=lambda x, y: x, reg_info=info, cache_root=cache)
    x = torch.tensor([1.5, 2.25], dtype=torch.float16)
    z = op(x, x)
    # as MindSpore 2.10 (scripts/mindspore_conformance.py): the inference sees float16, the
    # kernel runs on float32 copies, its float32 result is cast back to float16
    assert z.dtype == torch.float16 and z.tolist() == [3.0, 4.5]
    y = op(torch.tensor([1.0], dtype=torch.float64), torch.tensor([2.0], dtype=torch.float64))
    assert y.dtype == torch.float64 and y.tolist() == [3.0]  # float64 → float32 → float64
    with pytest.raises(Exception, match="input dtypes \\(int32, int32\\)"):
        op(torch.ones(2, dtype=torch.int32), torch.ones(2, dtype=torch.int32))


def test_add_prim_attr_reaches_the_kernel(extra_lib):
    info = (CustomRegOp("ScaleCustom").input(0, "x").output(0, "y")
            .attr("scale", "required", "float")
            .dtype_format(DataType.F32_Default, DataType.F32_Default).target("CPU").get_op_info())
    op = _custom(f"{extra_lib}:ScaleCustom", out_shape=lambda x: x, out_dtype=lambda x: x,
                 reg_info=info)
    assert op.add_prim_attr("scale", 3.0) is op
    assert op(torch.arange(3.0)).tolist() == [0.0, 3.0, 6.0]
    op.add_prim_attr("scale", "0.5")  # a string, parsed by the declared type
    assert op(torch.arange(3.0)).tolist() == [0.0, 0.5, 1.0]


def test_param_type_none_odd_names_and_three_element_pairs(cache):
    f32 = ("float32", "DefaultFormat", "tensor")
    info = (CustomRegOp("PlainAdd").input(0, "x-1", None).input(1, "x 2", None)
            .output(0, "out", None).dtype_format(f32, f32, f32).target("CPU").get_op_info())
    assert info["inputs"][0] == {"index": 0, "name": "x-1"}
    op = _custom(f"{KERNELS / 'plain_add.cc'}:PlainAdd", out_shape=lambda x, y: x,
                 out_dtype=lambda x, y: x, reg_info=info, cache_root=cache)
    assert op(torch.ones(2), torch.ones(2)).tolist() == [2.0, 2.0]
    assert "Tensor x_1, Tensor x_2" in op.op.schema
    with pytest.raises(KernelError, match="called with 1 input.*valid: 2 \\(x-1, x 2\\)"):
        op(torch.ones(2))
