"""Every mismatch between func, reg_info, the kernel library and inference is refused when
the op is defined (``opforge.mindspore.define``, the torch-free half of ``Custom``)."""

import shutil

import pytest

from mindspore_support import KERNELS, needs_cxx
from opforge.errors import BuildError, ManifestError
from opforge.mindspore import CustomRegOp, DataType, NameMismatchWarning, define

pytestmark = needs_cxx


def shape_of_x(x, y):
    return x


def add_reg(name="AddCustom", inputs=("x", "y"), outputs=("z",), rows=None):
    reg = CustomRegOp(name)
    for i, n in enumerate(inputs):
        reg.input(i, n)
    for i, n in enumerate(outputs):
        reg.output(i, n)
    for row in rows or [(DataType.F32_Default,) * (len(inputs) + len(outputs))]:
        reg.dtype_format(*row)
    return reg.target("CPU").get_op_info()


def test_library_kernel_with_cpp_inference(add_lib):
    op = define(f"{add_lib}:AddCustom", reg_info=add_reg())
    assert (op.name, op.inputs, op.outputs) == ("AddCustom", ("x", "y"), ("z",))
    assert op.out_shape == op.out_dtype == "cpp"
    assert op.infer([(2, 3), (2, 3)], ["float32", "float32"]) == ([(2, 3)], ["float32"])


def test_source_file_is_compiled_through_the_cache(cache, tmp_path):
    source = tmp_path / "add.cpp"
    shutil.copy(KERNELS.parent.parent.parent / "opforge/examples/mindspore/add_custom.cc", source)
    op = define(f"{source}:AddCustom", shape_of_x, shape_of_x, cache_root=cache)
    assert op.library.endswith("libadd.so") and str(cache) in op.library
    assert op.inputs == ("x0", "x1")  # no reg_info: the inputs are out_shape's parameters


@pytest.mark.parametrize("func, words", [
    ("{lib}", ["has no ':Name'", "dir_path/file_name:func_name"]),
    ("{lib}:Add Custom", ["not a C function name"]),
    ("/nonexistent/dir/libadd.so:AddCustom", ["does not exist", "fix: check the path"]),
    ("/nonexistent/kernel.cu:AddCustom", ["does not exist"]),
    ("{lib}:AddCustm", ["exports no function 'AddCustm'", "close names it exports: AddCustom",
                        "extern \"C\""]),
])
def test_func_forms_refused(add_lib, func, words):
    with pytest.raises(ManifestError) as e:
        define(func.format(lib=add_lib), shape_of_x, shape_of_x, reg_info=add_reg())
    for word in words:
        assert word in str(e.value)


def test_cuda_source_and_unknown_func_type_refused(tmp_path, add_lib):
    cu = tmp_path / "k.cu"
    cu.write_text("")
    with pytest.raises(ManifestError, match="CUDA source"):
        define(f"{cu}:K", shape_of_x, shape_of_x)
    with pytest.raises(ManifestError, match="func_type 'akg'.*valid: 'aot', 'pyfunc'"):
        define(f"{add_lib}:AddCustom", func_type="akg")
    not_elf = tmp_path / "fake.so"
    not_elf.write_text("hello")
    with pytest.raises(BuildError, match="not a shared object"):
        define(f"{not_elf}:K", shape_of_x, shape_of_x)


def test_mangled_cpp_name_is_not_found(extra_lib):
    with pytest.raises(ManifestError, match="exports no function 'MangledAdd'.*extern"):
        define(f"{extra_lib}:MangledAdd", shape_of_x, shape_of_x, reg_info=add_reg("MangledAdd"))


def test_name_mismatch_for_a_plain_library_warns_naming_both(add_lib):
    with pytest.warns(NameMismatchWarning, match="'CustomAdd'.*'AddCustom'"):
        op = define(f"{add_lib}:AddCustom", reg_info=add_reg("CustomAdd"))
    assert op.name == "AddCustom"


def test_name_mismatch_with_a_prototype_is_an_error(extra_lib):
    reg = add_reg("ProtoAddition", ("a", "b"), ("c",))
    with pytest.raises(ManifestError, match="'ProtoAddition'.*ProtoAddOpProto.*valid: 'ProtoAdd'"):
        define(f"{extra_lib}:ProtoAdd", shape_of_x, shape_of_x, reg_info=reg)


@pytest.mark.parametrize("inputs, outputs, words", [
    (("a",), ("c",), ["reg_info inputs (a)", "has 2 inputs: a, b"]),
    (("a", "bb"), ("c",), ["reg_info inputs (a, bb)", ".input(1, 'b')"]),
    (("a", "b"), ("out",), ["reg_info outputs (out)", "has 1 outputs: c"]),
])
def test_input_output_names_and_counts_against_the_prototype(extra_lib, inputs, outputs, words):
    with pytest.raises(ManifestError) as e:
        define(f"{extra_lib}:ProtoAdd", shape_of_x, shape_of_x,
               reg_info=add_reg("ProtoAdd", inputs, outputs))
    for word in words:
        assert word in str(e.value)


def test_dtype_rows_against_the_prototype(extra_lib):
    ok = define(f"{extra_lib}:ProtoAdd", shape_of_x, shape_of_x,
                reg_info=add_reg("ProtoAdd", ("a", "b"), ("c",)))
    assert ok.dtype_rows == (("float32",) * 3,)
    bare = {"op_name": "ProtoAdd", "inputs": ["a", "b"], "outputs": ["c"]}  # no rows
    assert define(f"{extra_lib}:ProtoAdd", shape_of_x, shape_of_x, reg_info=bare).dtype_rows \
        == (("float32",) * 3,)  # the prototype's rows are enforced
    reg = add_reg("ProtoAdd", ("a", "b"), ("c",), rows=[(DataType.F16_Default,) * 3])
    with pytest.raises(ManifestError, match="row 0 .float16/DefaultFormat.*not supported.*"
                                            "valid: .float32/ND"):
        define(f"{extra_lib}:ProtoAdd", shape_of_x, shape_of_x, reg_info=reg)


def test_missing_inference_is_refused_at_definition(extra_lib):
    with pytest.raises(ManifestError, match="out_shape=None.*exports no FailCustomInferShape"):
        define(f"{extra_lib}:FailCustom", None, "float32", reg_info=add_reg("FailCustom", ("x",), ("y",)))
    with pytest.raises(ManifestError, match="out_dtype=None.*exports no FailCustomInferType"):
        define(f"{extra_lib}:FailCustom", shape_of_x, None, reg_info=add_reg("FailCustom", ("x",), ("y",)))


def test_unknown_arity_is_refused(extra_lib):
    with pytest.raises(ManifestError, match="number of inputs is unknown"):
        define(f"{extra_lib}:FailCustom", [[3]], "float32")


def test_pyfunc_needs_python_inference():
    def double(x):
        return x * 2

    op = define(double, lambda x: x, lambda x: x,
                func_type="pyfunc")
    assert (op.name, op.inputs, op.func_type) == ("double", ("x0",), "pyfunc")
    with pytest.raises(ManifestError, match="pyfunc.*out_shape=None"):
        define(double, None, lambda x: x, func_type="pyfunc")
    with pytest.raises(ManifestError, match="func_type=\"pyfunc\" — func is int"):
        define(3, lambda x: x, lambda x: x, func_type="pyfunc")


def test_compiled_sources_are_cached_and_a_corrupt_entry_is_rebuilt(tmp_path):
    from opforge.mindspore.compile import compile_library

    source = tmp_path / "add.cc"
    shutil.copy(KERNELS.parent.parent.parent / "opforge/examples/mindspore/add_custom.cc", source)
    first = compile_library([source], "add", cache_root=tmp_path / "cache")
    stamp = first.stat().st_mtime_ns
    assert compile_library([source], "add", cache_root=tmp_path / "cache") == first
    assert first.stat().st_mtime_ns == stamp  # a hit: nothing compiled or copied
    first.write_bytes(first.read_bytes()[:100])  # rot in the cache
    again = compile_library([source], "add", cache_root=tmp_path / "cache")
    assert again.read_bytes()[:4] == b"\x7fELF" and again.stat().st_size > 100
    assert define(f"{again}:AddCustom", shape_of_x, shape_of_x).symbol == "AddCustom"
    source.write_text(source.read_text() + "\n// changed\n")
    assert compile_library([source], "add", cache_root=tmp_path / "cache") != first


def test_editing_an_included_header_rebuilds_the_compiled_source(tmp_path):
    # a header beside the source is not in the cache key; it is recorded and re-hashed
    import ctypes

    from opforge.mindspore.compile import compile_library

    (tmp_path / "value.h").write_text("#define VALUE 3\n")
    (tmp_path / "k.cc").write_text('#include "value.h"\nextern "C" int Value() { return VALUE; }\n')
    first = compile_library([tmp_path / "k.cc"], "value", cache_root=tmp_path / "cache")
    assert ctypes.CDLL(str(first)).Value() == 3
    assert compile_library([tmp_path / "k.cc"], "value", cache_root=tmp_path / "cache") == first
    (tmp_path / "value.h").write_text("#define VALUE 7\n")
    again = compile_library([tmp_path / "k.cc"], "value", cache_root=tmp_path / "cache")
    copy = tmp_path / "copy.so"  # a fresh path: dlopen would hand back the first mapping
    shutil.copy(again, copy)
    assert ctypes.CDLL(str(copy)).Value() == 7
