"""The torch-free adapter: MindSpore AOT kernels called from NumPy, checked against their
inference before they run, in a program on the lean runtime, and without torch at all."""

import json
import shutil

import numpy as np
import pytest

from mindspore_support import needs_cxx
from opforge.errors import KernelError, ProgramError
from opforge.mindspore import AotKernel, define, load_package, write_package
from opforge.program import (ArenaStorage, ConstantStorage, KernelCall, MemoryPlan, Method,
                             Operator, Program, ScalarType, Segment, TensorValue)
from opforge.runtime import KernelRegistry, load

pytestmark = needs_cxx

F32 = ScalarType.FLOAT32


ADD_REG = {"op_name": "AddCustom", "inputs": ["x", "y"], "outputs": ["z"]}


def add_op(add_lib, **kw):
    kw.setdefault("reg_info", ADD_REG)
    return define(f"{add_lib}:AddCustom", **kw)


def test_kernel_matches_numpy_for_each_dtype_and_shape(add_lib):
    kernel = AotKernel(add_op(add_lib))
    rng = np.random.default_rng(0)
    for dtype in (np.float32, np.float64, np.int32, np.int64):
        for shape in [(), (0,), (5,), (3, 4), (2, 3, 4)]:
            x = np.asarray((rng.standard_normal(shape) * 100).astype(dtype))
            y = np.asarray((rng.standard_normal(shape) * 100).astype(dtype))
            z = np.empty(shape, dtype)
            kernel(x, y, z)
            np.testing.assert_array_equal(z, x + y)


def test_strided_arguments_go_through_contiguous_copies(add_lib):
    kernel = AotKernel(add_op(add_lib))
    x = np.arange(24, dtype=np.float32).reshape(4, 6)[:, ::2]
    y = np.arange(12, dtype=np.float32).reshape(3, 4).T
    z = np.zeros((4, 6), np.float32)[:, 1::2]
    kernel(x, y, z)
    np.testing.assert_array_equal(z, x + y)


def test_multi_output_cpp_inference_and_kernel(extra_lib):
    op = define(f"{extra_lib}:MinMaxCustom", reg_info={
        "op_name": "MinMaxCustom", "inputs": ["x"], "outputs": ["lo", "hi"],
        "dtype_format": [[["float32", "DefaultFormat"]] * 3]})
    assert op.infer([(2, 3, 5)], ["float32"]) == ([(2, 3), (2, 3)], ["float32", "float32"])
    x = np.random.default_rng(1).standard_normal((2, 3, 5)).astype(np.float32)
    lo, hi = np.empty((2, 3), np.float32), np.empty((2, 3), np.float32)
    AotKernel(op)(x, lo, hi)
    np.testing.assert_array_equal(lo, x.min(-1))
    np.testing.assert_array_equal(hi, x.max(-1))


def test_init_workspace_and_attribute(extra_lib):
    op = define(f"{extra_lib}:ScaleCustom", lambda x: x, lambda x: x, reg_info=(
        {"op_name": "ScaleCustom", "inputs": ["x"], "outputs": ["y"],
         "attr": [{"name": "scale", "paramType": "required", "type": "float", "value": 2.5}],
         "dtype_format": [[["float32", ""]] * 2]}))
    x = np.arange(7, dtype=np.float32)
    y = np.empty_like(x)
    AotKernel(op)(x, y)
    np.testing.assert_array_equal(y, x * 2.5)



def _workspace_kernel(extra_lib, nbytes):
    return AotKernel(define(f"{extra_lib}:WorkspaceCustom", lambda x: x, lambda x: x, reg_info=(
        {"op_name": "WorkspaceCustom", "inputs": ["x"], "outputs": ["y"],
         "attr": [{"name": "bytes", "paramType": "required", "type": "int", "value": nbytes}],
         "dtype_format": [[["float32", ""]] * 2]})))


@pytest.mark.parametrize("nbytes, limit", [(2**62, None), (2**20, 2**16)])
def test_init_workspace_sizes_count_against_the_memory_limit(extra_lib, monkeypatch, nbytes,
                                                             limit):
    # 2**62 bytes: a raw MemoryError before; 1 MiB under a 64 KiB limit: really allocated
    from opforge.runtime.limits import MAX_MEMORY_ENV

    if limit is not None:
        monkeypatch.setenv(MAX_MEMORY_ENV, str(limit))
    x = np.arange(7, dtype=np.float32)
    with pytest.raises(KernelError, match=rf"WorkspaceCustomInit asked for with SetWorkSpace "
                                          rf"\({nbytes} bytes, .*needs {nbytes} bytes"):
        _workspace_kernel(extra_lib, nbytes)(x, np.empty_like(x))
    y = np.empty_like(x)
    _workspace_kernel(extra_lib, 1024)(x, y)  # within the limit: runs
    np.testing.assert_array_equal(y, x)

@pytest.mark.parametrize("make, words", [
    (lambda: (np.ones(3, np.float32), np.ones(3, np.float32), np.empty(4, np.float32)),
     ["output z — found float32[4]", "valid: float32[3]"]),
    (lambda: (np.ones(3, np.float32), np.ones(3, np.float32), np.empty(3, np.float64)),
     ["output z — found float64[3]"]),
    (lambda: (np.ones(3, np.float32), np.ones(3, np.float32),
              np.frombuffer(bytes(12), np.float32)), ["read-only"]),
    (lambda: (np.ones(3, np.int32), np.ones(3, np.int32), np.empty(3, np.int32)),
     ["input dtypes (int32, int32)", "valid (reg_info dtype_format): float32, float32"]),
    (lambda: (np.ones(3, np.float32), np.empty(3, np.float32)), ["2 arguments", "valid: 3"]),
])
def test_adapter_refuses_buffers_that_do_not_fit_before_the_call(add_lib, make, words):
    reg = {"op_name": "AddCustom", "inputs": ["x", "y"], "outputs": ["z"],
           "dtype_format": [[["float32", "DefaultFormat"]] * 3]}
    kernel = AotKernel(add_op(add_lib, reg_info=reg))
    with pytest.raises(KernelError) as e:
        kernel(*make())
    for word in words:
        assert word in str(e.value)


def _program(op_key, shapes, out_shape, *, constant_out=False, n_in=1):
    values = []
    offset = 0
    for s in shapes:
        values.append(TensorValue(F32, s, storage=ArenaStorage(0, offset)))
        offset += 64
    out_storage = ConstantStorage(0, 0) if constant_out else ArenaStorage(0, offset)
    values.append(TensorValue(F32, out_shape, storage=out_storage))
    offset += 4 * int(np.prod(out_shape))
    n = len(values)
    forward = Method("forward", tuple(values), tuple(range(n - 1)), (n - 1,),
                     (KernelCall(0, tuple(range(n))),), (Operator(op_key.rpartition(".")[0],
                                                                  "out"),),
                     MemoryPlan((offset,)))
    return Program(methods=(forward,))


@pytest.fixture
def package(tmp_path, add_lib, extra_lib, monkeypatch):
    ops = [add_op(add_lib, out_shape="opforge.examples.mindspore_add:add_custom_shape",
                  out_dtype="opforge.examples.mindspore_add:add_custom_dtype",
                  reg_info={"op_name": "AddCustom", "inputs": ["x", "y"], "outputs": ["z"]}),
           define(f"{extra_lib}:FailCustom", [[3]], ["float32"],
                  reg_info={"op_name": "FailCustom", "inputs": ["x"], "outputs": ["y"]})]
    folder = write_package(ops, tmp_path / "vendors" / "test")
    monkeypatch.setenv("OPFORGE_CUSTOM_OPP_PATH", str(tmp_path))
    return folder


def test_program_runs_on_the_lean_runtime_through_the_registrar(package):
    data = json.loads((package / "op_info.json").read_text())
    assert data["ops"][0]["library"] == "lib/libadd_custom.so"  # relative: the package moves
    program = _program("mindspore::AddCustom.out", [(2, 3), (2, 3)], (2, 3))
    loaded = load(program, kernels=["opforge.mindspore:register_vendor_ops"])
    x, y = np.ones((2, 3), np.float32), np.arange(6, dtype=np.float32).reshape(2, 3)
    (z,) = loaded.method("forward")(x, y)
    np.testing.assert_array_equal(z, x + y)
    assert loaded.kernel_for("forward", 0).target == "native"


def test_hostile_program_output_shape_is_refused_before_the_kernel_runs(package):
    program = _program("mindspore::AddCustom.out", [(2, 3), (2, 3)], (64,))
    loaded = load(program, kernels=["opforge.mindspore:register_vendor_ops"])
    with pytest.raises(KernelError, match=r"output z — found float32\[64\] — valid: float32\[2, 3\]"):
        loaded.method("forward")


def test_program_writing_a_constant_is_refused_at_load(package):
    program = _program("mindspore::FailCustom.out", [(3,)], (3,), constant_out=True)
    program = Program(methods=program.methods, segments=(Segment(bytes(64)),))
    with pytest.raises(ProgramError, match="a constant tensor, where the kernel writes"):
        load(program, kernels=["opforge.mindspore:register_vendor_ops"])


def test_nonzero_return_is_a_kernel_error_naming_op_and_instruction(package):
    program = _program("mindspore::FailCustom.out", [(3,)], (3,))
    forward = load(program, kernels=["opforge.mindspore:register_vendor_ops"]).method("forward")
    (y,) = forward(np.array([1, 2, 3], np.float32))
    np.testing.assert_array_equal(y, [1, 2, 3])
    with pytest.raises(KernelError) as e:
        forward(np.array([1, -2, 3], np.float32))
    message = str(e.value)
    assert "instruction 0" in message and "mindspore::FailCustom.out" in message
    assert "kernel FailCustom" in message and "returned 7" in message


def test_one_package_registered_twice_is_refused(package):
    registry = KernelRegistry.portable()
    load_package(package, registry)
    with pytest.raises(Exception, match="already registered"):
        load_package(package, registry)


def test_lean_runtime_runs_the_package_without_torch(package, python_without_torch):
    result = python_without_torch(f"""
        import os, sys
        import numpy as np
        os.environ["OPFORGE_CUSTOM_OPP_PATH"] = {str(package)!r}
        from opforge.mindspore import register_vendor_ops
        from opforge.runtime import KernelRegistry
        registry = KernelRegistry.portable()
        keys = register_vendor_ops(registry)
        x = np.arange(4, dtype=np.float32).reshape(2, 2)
        z = np.empty_like(x)
        registry.lookup("mindspore::AddCustom.out").fn(x, x, z)
        assert (z == 2 * x).all(), z
        assert "torch" not in sys.modules
        print(sorted(keys))
    """)
    assert result.returncode == 0, result.stderr
    assert "mindspore::AddCustom.out" in result.stdout


def test_package_keeps_two_libraries_of_one_name_apart(tmp_path, add_lib, extra_lib):
    same = tmp_path / "other" / "libadd_custom.so"
    same.parent.mkdir()
    shutil.copy(extra_lib, same)
    ops = [add_op(add_lib), define(f"{same}:FailCustom", [[3]], ["float32"],
                                   reg_info={"op_name": "FailCustom", "inputs": ["x"],
                                             "outputs": ["y"]})]
    folder = write_package(ops, tmp_path / "pkg")
    registry = KernelRegistry.portable()
    load_package(folder, registry)
    x = np.ones((3,), np.float32)
    z = np.empty_like(x)
    registry.lookup("mindspore::AddCustom.out").fn(x, x, z)
    np.testing.assert_array_equal(z, 2 * x)
    registry.lookup("mindspore::FailCustom.out").fn(x, z)
    np.testing.assert_array_equal(z, x)


def test_init_refusal_is_a_kernel_error_before_the_kernel(extra_lib):
    op = define(f"{extra_lib}:BadInitCustom", lambda x: x, lambda x: x,
                reg_info={"op_name": "BadInitCustom", "inputs": ["x"], "outputs": ["y"]})
    with pytest.raises(KernelError, match="BadInitCustomInit returned 5") as e:
        AotKernel(op)(np.ones(2, np.float32), np.empty(2, np.float32))
    assert "99" not in str(e.value)
