"""ExecuTorch kernel sources compile unchanged against an ExecuTorch-format YAML and run.

``executorch_kernels/`` holds kernels written as an ExecuTorch author writes them (the
custom-op example's ``mul3_out_impl``; portable-library-style ``add``/``clamp``/row sum)
and a ``custom_ops.yaml`` with no opforge keys. They include
``<executorch/runtime/kernel/kernel_includes.h>`` and use ExecuTorch's names; opforge's
compatibility headers map them onto its kernel API. Needs a C++ compiler; no torch.
"""

import shutil

import numpy as np
import pytest

from opforge.native import build_library, include_dir
from opforge.errors import KernelError
from opforge.runtime import KernelRegistry
from opforge.runtime.native import NativeLibrary, load_library

pytestmark = pytest.mark.skipif(shutil.which("c++") is None and shutil.which("g++") is None,
                                reason="needs a C++ compiler")

HERE = __import__("pathlib").Path(__file__).with_name("executorch_kernels")
MANIFEST = HERE / "custom_ops.yaml"
SOURCES = [HERE / "custom_ops_1_out.cpp", HERE / "op_add_alpha.cpp", HERE / "op_leaky_relu.cpp"]


@pytest.fixture(scope="module")
def lib(cache, tmp_path_factory):
    # -Wall -Wextra -Werror: the compatibility headers themselves must compile cleanly
    out = tmp_path_factory.mktemp("et") / "libet_ops.so"
    result = build_library(MANIFEST, SOURCES, out, cache_root=cache,
                           extra_flags=("-Wall", "-Wextra", "-Werror", "-Wno-sign-compare",
                                        "-Wno-unused-parameter"))
    assert result.ops == ["et_ops::mul3.out", "et_ops::add_alpha.out", "et_ops::clamp_min.out",
                          "et_ops::row_sum.out", "et_ops::leaky_relu.out", "et_ops::sum_all.out",
                          "et_ops::fill_value.out", "et_ops::fill_tensor_value.out"]
    return NativeLibrary(result.path)


def test_headers_ship_with_the_package():
    root = include_dir() / "executorch"
    for rel in ("runtime/kernel/kernel_includes.h", "runtime/core/exec_aten/exec_aten.h",
                "runtime/core/exec_aten/util/scalar_type_util.h",
                "runtime/core/exec_aten/util/tensor_util.h", "runtime/platform/assert.h",
                "kernels/portable/cpu/util/broadcast_util.h", "kernels/portable/cpu/scalar_utils.h",
                "kernels/portable/cpu/util/functional_util.h"):
        assert (root / rel).is_file(), rel
    assert (include_dir() / "c10" / "util" / "irange.h").is_file()


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64", "int8"])
@pytest.mark.parametrize("shape", [(), (0,), (7,), (3, 4)])
def test_mul3_example_kernel(lib, dtype, shape):
    x = np.asarray(np.random.default_rng(0).standard_normal(shape) * 20).astype(dtype)
    out = np.empty_like(x)
    lib.kernel("et_ops::mul3.out")(x, out)  # resize_tensor to the planned shape: Error::Ok
    np.testing.assert_array_equal(out, (x * np.asarray(3, dtype)).astype(dtype))


def test_mul3_in_the_lean_runtime_registry(lib):
    registry = KernelRegistry.portable()
    load_library(lib.path, registry)
    x, out = np.arange(6, dtype=np.float32).reshape(2, 3), np.empty((2, 3), np.float32)
    registry.lookup("et_ops::mul3.out", "float32").fn(x, out)
    np.testing.assert_array_equal(out, x * 3)


def test_et_check_msg_is_a_kernel_error_not_an_abort(lib):
    # ET_CHECK_MSG aborts in ExecuTorch; here the call fails with its text, file and line
    with pytest.raises(KernelError, match=r"ET_CHECK failed at custom_ops_1_out\.cpp:\d+: "
                                          r"\(in\.scalar_type\(\) != ScalarType::Bool\): "
                                          r"Expected a numeric in tensor, but got dtype 11 \(Bool\)"):
        lib.kernel("et_ops::mul3.out")(np.ones(3, bool), np.empty(3, bool))
    x = np.ones(3, np.float32)  # and the library still works
    out = np.empty(3, np.float32)
    lib.kernel("et_ops::mul3.out")(x, out)
    assert out.tolist() == [3.0, 3.0, 3.0]


def test_et_switch_refuses_a_dtype_outside_its_set(lib):
    with pytest.raises(KernelError, match="mul3.out: unsupported dtype Half"):
        lib.kernel("et_ops::mul3.out")(np.ones(3, np.float16), np.empty(3, np.float16))
    with pytest.raises(KernelError, match="clamp_min.out: unsupported dtype Int"):
        lib.kernel("et_ops::clamp_min.out")(np.ones(3, np.int32), 0, np.empty(3, np.int32))


def test_et_kernel_check_fails_the_context(lib):
    x = np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2]  # not contiguous
    with pytest.raises(KernelError, match=r"custom_ops_1_out\.cpp:\d+: check failed "
                                          r"\(executorch::runtime::tensor_is_contiguous\(in\)\)"):
        lib.kernel("et_ops::mul3.out")(x, np.empty((3, 2), np.float32))


# `self` has the out's shape: an ExecuTorch YAML has no fake, and opforge's default fake
# plans every out like the first tensor input (an op broadcasting `self` needs `fake:`)
@pytest.mark.parametrize("shapes", [((3, 4), (3, 4)), ((3, 4), (4,)), ((2, 3, 4), (3, 1)),
                                    ((5,), ()), ((0, 3), (3,)), ((2, 3), (1, 1))])
@pytest.mark.parametrize("dtype", ["float32", "float64", "int64", "float16"])
def test_portable_style_add_with_scalar_and_broadcasting(lib, shapes, dtype):
    rng = np.random.default_rng(1)
    a = np.asarray(rng.standard_normal(shapes[0]) * 10).astype(dtype)
    b = np.asarray(rng.standard_normal(shapes[1]) * 10).astype(dtype)
    alpha = 2 if dtype == "int64" else 0.5
    out = np.empty(np.broadcast_shapes(a.shape, b.shape), dtype)
    lib.kernel("et_ops::add_alpha.out")(a, b, alpha, out)
    want = (a + np.asarray(alpha, dtype) * b).astype(dtype)
    if dtype == "float16":
        np.testing.assert_allclose(out.astype(np.float32), want.astype(np.float32), rtol=2e-3, atol=1e-2)
    else:
        np.testing.assert_allclose(out, want, rtol=1e-6)


def test_portable_style_add_refuses_a_float_alpha_for_ints(lib):
    a, b = np.ones((2, 3), np.int64), np.ones(3, np.int64)
    with pytest.raises(KernelError, match=r"extract_scalar\(alpha, &alpha_val\)") as info:
        lib.kernel("et_ops::add_alpha.out")(a, b, 0.5, np.empty((2, 3), np.int64))
    # the kernel's earlier shape probe (false: a broadcast) is not this failure's reason
    assert "shapes differ" not in str(info.value)


def test_clamp_with_a_scalar_matches_numpy(lib):
    x = np.linspace(-3, 3, 13, dtype=np.float64)
    out = np.empty_like(x)
    lib.kernel("et_ops::clamp_min.out")(x, -1, out)
    np.testing.assert_array_equal(out, np.maximum(x, -1))


def test_resize_to_another_shape_is_a_clean_error(lib):
    # the planned out (the default fake: the input's shape) is not the row sums' shape
    x = np.ones((3, 4), np.float32)
    with pytest.raises(KernelError) as info:
        lib.kernel("et_ops::row_sum.out")(x, np.empty((3, 4), np.float32))
    text = str(info.value)
    assert "Failed to resize output tensor." in text
    assert "resize_tensor: the kernel resizes a tensor of planned shape (3, 4) to (3,)" in text
    assert "static shapes" in text


def test_broadcast_resize_to_a_wrong_planned_shape_is_a_clean_error(lib):
    a, b = np.ones((3, 4), np.float32), np.ones((4,), np.float32)
    # the default fake plans out like `self` (3, 4): fine; an out of (4,) the glue refuses
    with pytest.raises(KernelError, match="first input's shape"):
        lib.kernel("et_ops::add_alpha.out")(a, b, 1, np.empty(4, np.float32))


def test_portable_style_add_on_strided_views(lib):
    base = np.arange(48, dtype=np.float64).reshape(6, 8)
    a, b = base[::2, ::-2], base[1, ::2]  # negative and non-unit strides, b broadcast
    out = np.empty((3, 4), np.float64)
    lib.kernel("et_ops::add_alpha.out")(a, b, -1.5, out)
    np.testing.assert_array_equal(out, a - 1.5 * b)


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
def test_portable_library_style_kernel_in_torch_executor_native(lib, dtype):
    x = np.linspace(-4, 4, 17).astype(dtype)
    out = np.empty_like(x)
    lib.kernel("et_ops::leaky_relu.out")(x, 0.25, out)
    np.testing.assert_array_equal(out, np.where(x > 0, x, (x * np.asarray(0.25, dtype)).astype(dtype)))


def test_portable_library_style_reduction(lib):
    x = np.arange(1, 13, dtype=np.int64).reshape(3, 4)
    out = np.empty((3, 4), np.int64)
    lib.kernel("et_ops::sum_all.out")(x, out)
    assert out.ravel().tolist() == [78] + [0] * 11


def test_scalar_overflow_checks(lib):
    kernel = lib.kernel("et_ops::fill_value.out")
    out = np.empty(3, np.int8)
    kernel(np.zeros(3, np.int8), -128, out)
    assert out.tolist() == [-128] * 3
    with pytest.raises(KernelError, match=r"check failed \(casted\.has_value\(\)\)"):
        kernel(np.zeros(3, np.int8), 128, out)  # out of int8's range
    half = np.empty(2, np.float16)
    kernel(np.zeros(2, np.float16), 65504.0, half)
    assert half.tolist() == [65504.0] * 2
    with pytest.raises(KernelError, match="casted"):
        kernel(np.zeros(2, np.float16), 70000.0, half)
    flags = np.empty(2, bool)
    kernel(np.zeros(2, bool), True, flags)
    assert flags.tolist() == [True, True]


def test_scalar_tensor_extraction(lib):
    kernel = lib.kernel("et_ops::fill_tensor_value.out")
    out = np.empty((2, 2), np.int32)
    kernel(np.zeros((2, 2), np.int32), np.array(7, np.int64), out)
    assert out.ravel().tolist() == [7] * 4
    with pytest.raises(KernelError, match=r"ET_CHECK failed .*value could not be extracted"):
        kernel(np.zeros((2, 2), np.int32), np.array(2.5), out)  # a float into an int
    with pytest.raises(KernelError, match=r"check failed \(tensor_is_scalar\(value\)\)"):
        kernel(np.zeros((2, 2), np.int32), np.array([7]), out)
    floats = np.empty(3, np.float64)
    kernel(np.zeros(3), np.array(-3, np.int16), floats)  # an integer into a float: fine
    assert floats.tolist() == [-3.0] * 3


def test_half_and_bfloat16_conversions_round_to_nearest_even(tmp_path):
    # Half and BFloat16 are the compatibility headers' own; NumPy's float16 is the reference
    # for Half, and rounding float32's bits to nearest even the one for bfloat16
    import subprocess

    rng = np.random.default_rng(3)
    values = np.concatenate([
        np.array([0.0, -0.0, 1.0, -2.5, 65504.0, 65519.0, 65520.0, 1e-8, 6e-8, 3e-5, 6.1e-5,
                  np.inf, -np.inf, 1e30, 3.4e38], np.float32),
        (rng.standard_normal(200) * 10.0 ** rng.integers(-9, 6, 200)).astype(np.float32)])
    probe = tmp_path / "probe.cpp"
    probe.write_text(
        '#include <cstdio>\n#include <cstdlib>\n'
        '#include <executorch/runtime/core/exec_aten/exec_aten.h>\n'
        'int main(int argc, char** argv) {\n'
        '  for (int i = 1; i < argc; ++i) {\n'
        '    float f = std::strtof(argv[i], nullptr);\n'
        '    executorch::aten::Half h(f);\n'
        '    executorch::aten::BFloat16 b(f);\n'
        '    std::printf("%u %u %a\\n", (unsigned)h.x, (unsigned)b.x, (double)(float)h);\n'
        '  }\n}\n')
    cxx = shutil.which("c++") or shutil.which("g++")
    subprocess.run([cxx, "-std=c++17", "-I", str(include_dir()), str(probe), "-o",
                    str(tmp_path / "probe")], check=True)
    lines = subprocess.run([str(tmp_path / "probe"), *[repr(float(v)) for v in values]],
                           capture_output=True, text=True, check=True).stdout.split("\n")
    bits = values.view(np.uint32).astype(np.uint64)
    bf16 = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    with np.errstate(over="ignore"):
        halves = values.astype(np.float16)
    for v, half, line, want_b in zip(values, halves, lines, bf16):
        half_bits, b_bits, back = line.split()
        assert int(half_bits) == int(half.view(np.uint16)), v
        assert int(b_bits) == int(want_b), v
        assert float.fromhex(back) == float(half), v  # and back to float


def test_dim_order_checks_refuse_views_executorch_never_passes(lib):
    # ExecuTorch's tensors are dense; its kernels check the dim order and walk memory
    # linearly, so a transposed or sliced view must be refused, not read in the wrong order
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    for view in (x.T, x[:, ::2]):
        with pytest.raises(KernelError, match=r"check failed .*tensors_have_same_dim_order"):
            lib.kernel("et_ops::clamp_min.out")(view, 2, np.empty(view.shape, np.float32))
    # dense channels-last (4-d) on both sides is one dim order: accepted and right
    nchw = np.random.default_rng(4).standard_normal((2, 3, 4, 5))
    cl_in = np.ascontiguousarray(nchw.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    cl_out = np.empty((2, 4, 5, 3)).transpose(0, 3, 1, 2)
    lib.kernel("et_ops::clamp_min.out")(cl_in, 0.0, cl_out)
    np.testing.assert_array_equal(cl_out, np.maximum(nchw, 0.0))
    with pytest.raises(KernelError, match="tensors_have_same_dim_order"):  # mixed orders
        lib.kernel("et_ops::clamp_min.out")(cl_in, 0.0, np.empty((2, 3, 4, 5)))
