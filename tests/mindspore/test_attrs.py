"""Attribute values are parsed by their declared value_type, as MindSpore does: a string
default_value ("2.5") or a string value= for a float is 2.5 to Attr<float>, not 0; what does
not parse is refused when the op is defined; a missing attribute is an error, not T()."""

import numpy as np
import pytest

from mindspore_support import needs_cxx
from opforge.errors import ManifestError
from opforge.mindspore import AotKernel, CustomRegOp, DataType, define, parse_reg_info
from opforge.mindspore.attrs import parse_attr


def scale_info(**attr):
    return (CustomRegOp("ScaleCustom").input(0, "x").output(0, "y")
            .attr("scale", "required", "float", **attr)
            .dtype_format(DataType.F32_Default, DataType.F32_Default).target("CPU").get_op_info())


@needs_cxx
@pytest.mark.parametrize("attr", [{"default_value": "2.5"}, {"value": "2.5"}, {"value": 2.5},
                                  {"default_value": "1.0", "value": "2.5"}])
def test_string_values_reach_the_kernel_as_floats(extra_lib, attr):
    op = define(f"{extra_lib}:ScaleCustom", lambda x: x, lambda x: x, reg_info=scale_info(**attr))
    x = np.arange(7, dtype=np.float32)
    y = np.empty_like(x)
    AotKernel(op)(x, y)
    np.testing.assert_array_equal(y, x * 2.5)  # was 0 * x for the strings


@needs_cxx
def test_no_value_is_an_error_naming_the_attribute(extra_lib):
    from opforge.errors import KernelError

    op = define(f"{extra_lib}:ScaleCustom", lambda x: x, lambda x: x, reg_info=scale_info())
    with pytest.raises(KernelError, match="no attribute 'scale'"):
        AotKernel(op)(np.ones(3, np.float32), np.empty(3, np.float32))


@pytest.mark.parametrize("kind, raw, want", [
    ("int", "3", 3), ("int", " -4 ", -4), ("float", "2.5", 2.5), ("float", "1", 1.0),
    ("float", 2, 2.0), ("bool", "true", True), ("bool", "False", False), ("str", "x,y", "x,y"),
    ("listInt", "1,2,3", [1, 2, 3]), ("listInt", "[1, 2]", [1, 2]), ("listInt", "", []),
    ("listFloat", "0.5, 1", [0.5, 1.0]), ("listBool", "true,false", [True, False]),
    ("listStr", "a,b", ["a", "b"]), ("listListInt", "[[1,2],[3]]", [[1, 2], [3]]),
    ("listListFloat", [[1, 0.5]], [[1.0, 0.5]]), (None, 0.5, 0.5), (None, [1, 2], [1, 2]),
])
def test_each_value_type_parses(kind, raw, want):
    assert parse_attr("a", kind, raw, "api")[1] == want


@pytest.mark.parametrize("kind, raw", [
    ("float", "abc"), ("int", "2.5"), ("int", 2.5), ("bool", "yes"), ("bool", 1),
    ("listInt", "1,x"), ("listListInt", "1,2"), ("str", 3), ("tensor", "1"),
])
def test_values_that_do_not_parse_are_refused_at_definition(kind, raw):
    info = (CustomRegOp("A").input(0, "x").output(0, "y").attr("a", "required", kind, value=raw)
            .get_op_info())
    with pytest.raises(ManifestError, match="attribute 'a'") as e:
        parse_reg_info(info, "api")
    assert "fix:" in str(e.value)


@needs_cxx
def test_msop_prototype_yaml_with_a_string_float(tmp_path, cache):
    import shutil

    from opforge.mindspore import AotOp, read_package
    from opforge.mindspore.msop import build_vendor_package
    from mindspore_support import KERNELS

    host, kernel = tmp_path / "op_host", tmp_path / "op_kernel"
    host.mkdir(), kernel.mkdir()
    shutil.copy(KERNELS / "extra_ops.cc", kernel / "extra_ops.cc")
    (host / "scale.yaml").write_text(
        "op_name: ScaleCustom\ninputs: [x]\noutputs: [y]\n"
        "dtype_format: [[[float32, DefaultFormat], [float32, DefaultFormat]]]\n"
        "attr: [{name: scale, paramType: required, type: float, value: '0.5'}]\n"
        "out_shape: copy:copy\nout_dtype: copy:copy\n")
    built = build_vendor_package(host, kernel, vendor_name="attrs", cache_root=cache)
    (op,) = read_package(built.package)
    assert isinstance(op, AotOp)
    x = np.arange(4, dtype=np.float32)
    y = np.empty_like(x)
    AotKernel(op)(x, y)
    np.testing.assert_array_equal(y, x * 0.5)
