"""Build the example library (once per session via the shared cache) and run its kernels.

Needs a C++ compiler (skipped without one); no torch.
"""

import shutil
import subprocess
import time

import numpy as np
import pytest

from opforge.native import ABI_VERSION, build_library, include_dir
from opforge.examples.my_ops import manifest_path
from opforge.manifest import parse_manifest
from opforge.runtime import KernelRegistry
from opforge.runtime.native import NativeLibrary, load_library

pytestmark = pytest.mark.skipif(shutil.which("c++") is None and shutil.which("g++") is None,
                                reason="needs a C++ compiler")

KERNELS = sorted((manifest_path().parent / "kernels").glob("*.cpp"))


def test_header_abi_version_matches_python():
    text = (include_dir() / "opforge" / "kernel_abi.h").read_text()
    assert f"#define OPFORGE_ABI_VERSION {ABI_VERSION}\n" in text


def test_struct_layout_matches_ctypes(tmp_path):
    import ctypes

    from opforge.runtime import native

    probe = tmp_path / "probe.c"
    probe.write_text('#include <stdio.h>\n#include <stddef.h>\n#include "opforge/kernel_abi.h"\n'
                     'int main(void){printf("%zu %zu %zu %zu %zu %zu %zu\\n", sizeof(opforge_tensor),'
                     'sizeof(opforge_arg), offsetof(opforge_arg, v), sizeof(opforge_context),'
                     'sizeof(opforge_kernel_entry), sizeof(opforge_library),'
                     'offsetof(opforge_kernel_entry, fn));return 0;}\n')
    cc = shutil.which("cc") or shutil.which("gcc")
    subprocess.run([cc, "-I", str(include_dir()), str(probe), "-o", str(tmp_path / "probe")], check=True)
    sizes = [int(v) for v in subprocess.run([str(tmp_path / "probe")], capture_output=True,
                                            text=True, check=True).stdout.split()]
    assert sizes == [ctypes.sizeof(native.CTensor), ctypes.sizeof(native.CArg), native.CArg.v.offset,
                     ctypes.sizeof(native.CContext), ctypes.sizeof(native.CKernelEntry),
                     ctypes.sizeof(native.CLibrary), native.CKernelEntry.fn.offset]


def test_cold_then_warm_build(full, cache, tmp_path):
    assert full.path.is_file() and full.size > 0
    assert full.ops == ["my_ops::mul3.out", "my_ops::mul4.out", "my_ops::minmax.out",
                        "my_ops::scaled_sum.out"]
    start = time.perf_counter()
    again = build_library(manifest_path(), KERNELS, tmp_path / "libmy_ops.so", cache_root=cache)
    assert again.cached and again.key == full.key
    assert time.perf_counter() - start < 1.0
    assert again.path.read_bytes() == full.path.read_bytes()


def test_cache_key_changes_with_flags_and_sources(full, cache, tmp_path):
    src = tmp_path / "mul.cpp"
    src.write_text(KERNELS[1].read_text() + "\n// changed\n")
    from opforge.native.driver import _cache_key  # noqa: F401 (the key function exists)

    sources = [KERNELS[0], src, KERNELS[2]]
    changed = build_library(manifest_path(), sources, tmp_path / "libchanged.so", cache_root=cache)
    assert not changed.cached and changed.key != full.key


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64"])
@pytest.mark.parametrize("shape", [(), (0,), (7,), (3, 4), (2, 3, 5)])
def test_mul_kernels_on_numpy(full, dtype, shape):
    lib = NativeLibrary(full.path)
    x = np.asarray(np.random.default_rng(0).standard_normal(shape) * 100).astype(dtype)
    for key, factor in (("my_ops::mul3.out", 3), ("my_ops::mul4.out", 4)):
        out = np.empty_like(x)
        assert lib.kernel(key)(x, out) is None
        np.testing.assert_array_equal(out, x * np.asarray(factor, dtype))


def test_strided_inputs_are_not_copied_and_are_right(full):
    lib = NativeLibrary(full.path)
    base = np.arange(24, dtype=np.float64).reshape(4, 6)
    view = base[::2, ::-3]  # negative and non-unit strides
    out = np.empty(view.shape, np.float64)
    lib.kernel("my_ops::mul3.out")(view, out)
    np.testing.assert_array_equal(out, view * 3)
    lo, hi = np.empty(2), np.empty(2)
    lib.kernel("my_ops::minmax.out")(view, 1, lo, hi)
    np.testing.assert_array_equal(lo, view.min(1))
    np.testing.assert_array_equal(hi, view.max(1))


def test_scalar_and_int_list_arguments(full):
    lib = NativeLibrary(full.path)
    x = np.random.default_rng(1).standard_normal((2, 3, 4)).astype(np.float32)
    out = np.empty((2, 1, 1), np.float32)
    lib.kernel("my_ops::scaled_sum.out")(x, 0.5, (1, -1), True, out)
    np.testing.assert_allclose(out, x.sum(axis=(1, 2), keepdims=True) * 0.5, rtol=1e-5)
    out = np.empty((), np.float32)
    lib.kernel("my_ops::scaled_sum.out")(x, 2, (), False, out)
    np.testing.assert_allclose(out, x.sum() * 2, rtol=1e-5)


def test_bind_fast_path(full):
    kernel = NativeLibrary(full.path).kernel("my_ops::mul3.out")
    x, out = np.arange(4, dtype=np.int32), np.empty(4, np.int32)
    call, args = kernel.bind((x, out))
    x[:] = [1, 2, 3, 4]  # the bound views see new data
    call(*args)
    assert out.tolist() == [3, 6, 9, 12]


def test_load_into_runtime_registry(full):
    registry = KernelRegistry.portable()
    load_library(full.path, registry)
    kernel = registry.lookup("my_ops::mul3.out", "float32")
    assert kernel.target == "native" and kernel.origin == str(full.path)
    x, out = np.ones(3, np.float32), np.empty(3, np.float32)
    kernel.fn(x, out)
    assert out.tolist() == [3.0, 3.0, 3.0]


def test_standalone_cmake_build_of_the_generated_project(full, tmp_path):
    from opforge.native.toolchain import find_toolchain

    tools = find_toolchain()
    build = tmp_path / "standalone"
    subprocess.run([tools.cmake, "-S", str(full.project_dir), "-B", str(build), "-G", "Ninja",
                    f"-DCMAKE_MAKE_PROGRAM={tools.ninja}"], check=True, capture_output=True)
    subprocess.run([tools.cmake, "--build", str(build)], check=True, capture_output=True)
    lib = NativeLibrary(build / "libmy_ops.so")
    assert lib.keys() == full.ops


def test_only_the_registration_symbol_is_exported(full):
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("needs nm")
    out = subprocess.run([nm, "-D", "--defined-only", str(full.path)], capture_output=True,
                         text=True, check=True).stdout
    exported = [line.split()[-1] for line in out.splitlines() if " T " in line]
    assert exported == ["opforge_register_kernels"]


DTYPE_MANIFEST = """
- func: dt_ops::twice.out(Tensor x, *, Tensor(a!) out) -> Tensor(a!)
  type_alias: {T0: [Float]}
  kernels:
    - arg_meta: {x: [T0], out: [T0]}
      kernel_name: dt::twice_float
    - arg_meta: null
      kernel_name: dt::twice_any
"""
DTYPE_SOURCE = """
#include "opforge/kernel.h"
namespace dt { namespace native {
opforge::Tensor& twice_float(const opforge::Tensor& x, opforge::Tensor& out) {
  for (int64_t i = 0; i < x.numel(); ++i) out.data_ptr<float>()[i] = 2 * x.const_data_ptr<float>()[i] + 0.5f;
  return out;  // +0.5: tells the float kernel apart
}
opforge::Tensor& twice_any(opforge::KernelContext& ctx, const opforge::Tensor& x, opforge::Tensor& out) {
  OPFORGE_SWITCH_REAL_TYPES(ctx, x.scalar_type(), "twice", {
    for (int64_t i = 0; i < x.numel(); ++i)
      out.data_ptr<scalar_t>()[i] = static_cast<scalar_t>(2 * x.const_data_ptr<scalar_t>()[i]);
  });
  return out;
}
}}
"""


def test_arg_meta_kernels_dispatch_on_actual_dtypes(cache, tmp_path):
    (tmp_path / "dt.cpp").write_text(DTYPE_SOURCE)
    result = build_library(parse_manifest(DTYPE_MANIFEST, "dt.yaml"), [tmp_path / "dt.cpp"],
                           tmp_path / "libdt.so", cache_root=cache)
    assert {k[1] for k in result.kernels} == {"v1/6|6", "default"}
    kernel = NativeLibrary(result.path).kernel("dt_ops::twice.out")
    f, out = np.ones(2, np.float32), np.empty(2, np.float32)
    kernel(f, out)
    assert out.tolist() == [2.5, 2.5]
    d, out = np.ones(2, np.float64), np.empty(2, np.float64)
    kernel(d, out)
    assert out.tolist() == [2.0, 2.0]
    # --dtype selection drops the float kernel but keeps the fallback
    only = build_library(parse_manifest(DTYPE_MANIFEST, "dt.yaml"), [tmp_path / "dt.cpp"],
                         tmp_path / "libdt_double.so", cache_root=cache, dtypes=["Double"])
    assert [k[1] for k in only.kernels] == ["default"]


ATEN_MANIFEST = """
- op: add.out
  kernels:
    - arg_meta: null
      kernel_name: custom::add_out
"""
ATEN_SOURCE = """
#include "opforge/kernel.h"
namespace custom { namespace native {
opforge::Tensor& add_out(opforge::KernelContext& ctx, const opforge::Tensor& self,
                         const opforge::Tensor& other, const opforge::Scalar& alpha, opforge::Tensor& out) {
  OPFORGE_CHECK(ctx, self.scalar_type() == opforge::ScalarType::Float, out, "float only");
  const float a = alpha.to<float>();
  for (int64_t i = 0; i < out.numel(); ++i)
    out.data_ptr<float>()[i] = self.const_data_ptr<float>()[i] + a * other.const_data_ptr<float>()[i] + 1000;
  return out;  // +1000: tells this kernel apart from the portable one
}
}}
"""


def test_aten_op_with_own_kernel_overrides_portable(cache, tmp_path):
    (tmp_path / "add.cpp").write_text(ATEN_SOURCE)
    result = build_library(parse_manifest(ATEN_MANIFEST, "add.yaml"), [tmp_path / "add.cpp"],
                           tmp_path / "libmyadd.so", cache_root=cache)
    assert result.ops == ["aten::add.out"]
    registry = KernelRegistry.portable()
    portable = registry.lookup("aten::add.out")
    load_library(result.path, registry)
    kernel = registry.lookup("aten::add.out", "float32")
    assert kernel.target == "native" and kernel.override and kernel is not portable
    x, out = np.ones(2, np.float32), np.empty(2, np.float32)
    kernel.fn(x, x, 2, out)
    assert out.tolist() == [1003.0, 1003.0]


def test_native_loading_needs_no_torch(full, python_without_torch):
    code = f"""
        import numpy as np
        from opforge.runtime import KernelRegistry
        from opforge.runtime.native import load_library
        registry = KernelRegistry.portable()
        load_library({str(full.path)!r}, registry)
        out = np.empty(2, np.float32)
        registry.lookup("my_ops::mul3.out").fn(np.ones(2, np.float32), out)
        assert "torch" not in sys.modules and "jinja2" not in sys.modules
        print(out.tolist())
    """
    proc = python_without_torch(code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[3.0, 3.0]"
