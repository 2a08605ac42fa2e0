"""Every bad input of the build stage and of native loading: one test each.

Needs a C++ compiler (skipped without one); no torch.
"""

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from opforge.native import build_library, include_dir
from opforge.errors import BuildError, KernelError, RegistrationError
from opforge.examples.my_ops import manifest_path
from opforge.manifest import parse_manifest
from opforge.runtime import KernelRegistry
from opforge.runtime.native import NativeLibrary, load_library

pytestmark = pytest.mark.skipif(shutil.which("c++") is None and shutil.which("g++") is None,
                                reason="needs a C++ compiler")

KERNELS = sorted((manifest_path().parent / "kernels").glob("*.cpp"))
MUL3 = """
- func: bad_ops::mul3.out(Tensor input, *, Tensor(a!) output) -> Tensor(a!)
  kernels:
    - arg_meta: null
      kernel_name: custom::mul3_out_impl
"""
GOOD = """
#include "opforge/kernel.h"
namespace custom { namespace native {
opforge::Tensor& mul3_out_impl(opforge::KernelContext& ctx, const opforge::Tensor& input,
                               opforge::Tensor& output) {
  if (input.scalar_type() != opforge::ScalarType::Float) { ctx.fail("float only, got %s", opforge::to_string(input.scalar_type())); return output; }
  for (int64_t i = 0; i < input.numel(); ++i) output.data_ptr<float>()[i] = 3 * input.const_data_ptr<float>()[i];
  return output;
}
}}
"""


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.getbasetemp() / "opforge-cache"


def _build(tmp_path, cache, source: str, manifest: str = MUL3, name="libbad.so"):
    (tmp_path / "kernel.cpp").write_text(source)
    return build_library(parse_manifest(manifest, "bad_ops.yaml"), [tmp_path / "kernel.cpp"],
                         tmp_path / name, cache_root=cache)


def test_syntax_error_shows_author_file_line_first(tmp_path, cache):
    source = GOOD.replace("return output;\n}", "return output\n}")  # missing ';' on line 8
    with pytest.raises(BuildError) as info:
        _build(tmp_path, cache, source)
    message = str(info.value)
    first = message.splitlines()[1].strip()
    assert first.startswith(f"{tmp_path / 'kernel.cpp'}:8:") and "error" in first, message


def test_kernel_named_in_manifest_but_not_defined(tmp_path, cache):
    source = GOOD.replace("mul3_out_impl", "mul_three")
    with pytest.raises(BuildError) as info:
        _build(tmp_path, cache, source)
    message = str(info.value)
    assert "bad_ops.yaml:2" in message and "custom::mul3_out_impl" in message
    assert ("opforge::Tensor& custom::native::mul3_out_impl(opforge::KernelContext& ctx, "
            "const opforge::Tensor& input, opforge::Tensor& output);") in message


def test_definition_with_wrong_argument_types(tmp_path, cache):
    source = GOOD.replace("const opforge::Tensor& input,", "const opforge::Tensor& input, int64_t extra,")
    with pytest.raises(BuildError) as info:
        _build(tmp_path, cache, source)
    message = str(info.value)
    assert "not defined" in message
    assert "custom::native::mul3_out_impl(opforge::KernelContext&, opforge::Tensor const&, long, " \
           "opforge::Tensor&)" in message  # the close definition, from nm -C


def test_definition_outside_the_native_namespace(tmp_path, cache):
    source = GOOD.replace("namespace custom { namespace native {", "namespace custom {").replace("}}", "}")
    with pytest.raises(BuildError) as info:
        _build(tmp_path, cache, source)
    message = str(info.value)
    assert "custom::mul3_out_impl(opforge::KernelContext&" in message
    assert "outside namespace custom::native" in message


def test_undefined_helper_fails_the_link(tmp_path, cache):
    source = GOOD.replace("#include \"opforge/kernel.h\"",
                          "#include \"opforge/kernel.h\"\nfloat helper(float);").replace(
        "3 * input", "helper(3) * input")
    with pytest.raises(BuildError) as info:
        _build(tmp_path, cache, source)
    assert "undefined symbol" in str(info.value) and "helper(float)" in str(info.value)


def test_library_for_another_abi_version_is_refused(tmp_path):
    source = tmp_path / "old.c"
    source.write_text(textwrap.dedent("""
        #include "opforge/kernel_abi.h"
        static opforge_library library = {99, sizeof(opforge_kernel_entry), "old", "opforge 9", 0, 0};
        OPFORGE_EXPORT const opforge_library* opforge_register_kernels(void) { return &library; }
    """))
    cc = shutil.which("cc") or shutil.which("gcc")
    subprocess.run([cc, "-shared", "-fPIC", "-I", str(include_dir()), str(source), "-o",
                    str(tmp_path / "libold.so")], check=True)
    with pytest.raises(BuildError, match=r"built for kernel ABI version 99.*implements version 1"):
        NativeLibrary(tmp_path / "libold.so")


def test_file_that_is_not_a_shared_object(tmp_path):
    path = tmp_path / "libnot.so"
    path.write_text("not a library\n")
    with pytest.raises(BuildError, match="not a shared object"):
        NativeLibrary(path)


@pytest.fixture(scope="module")
def good_lib(tmp_path_factory, cache):
    folder = tmp_path_factory.mktemp("good")
    return _build(folder, cache, GOOD, name="libgood.so").path


def test_truncated_library(good_lib, tmp_path):
    data = good_lib.read_bytes()
    for cut in (40, len(data) // 2, len(data) - 100):
        path = tmp_path / f"libcut{cut}.so"
        path.write_bytes(data[:cut])
        with pytest.raises(BuildError, match="truncated"):
            NativeLibrary(path)


def test_two_libraries_registering_the_same_op(good_lib, tmp_path):
    copy = tmp_path / "libgood_copy.so"
    shutil.copy(good_lib, copy)
    registry = KernelRegistry.portable()
    load_library(good_lib, registry)
    with pytest.raises(RegistrationError) as info:
        load_library(copy, registry)
    assert str(good_lib) in str(info.value) and str(copy) in str(info.value)


def test_kernel_reporting_failure_raises_kernel_error(good_lib):
    kernel = NativeLibrary(good_lib).kernel("bad_ops::mul3.out")
    with pytest.raises(KernelError, match=r"bad_ops::mul3.out.*reported failure: float only, got Long"):
        kernel(np.ones(2, np.int64), np.empty(2, np.int64))


def test_wrong_argument_kinds_are_refused_before_the_kernel(good_lib):
    kernel = NativeLibrary(good_lib).kernel("bad_ops::mul3.out")
    with pytest.raises(KernelError, match="expected 2 arguments"):
        kernel(np.ones(2, np.float32))
    # a number where the schema says Tensor goes to the kernel as a scalar (ATen's wrapped
    # number); this kernel's generated glue takes only a tensor and refuses it by name
    with pytest.raises(KernelError, match="argument 0 'input' expects Tensor, got int"):
        kernel(3, np.empty(2, np.float32))
    with pytest.raises(KernelError, match="expects a numpy array"):
        kernel("3", np.empty(2, np.float32))


def test_build_killed_halfway_leaves_nothing_and_next_build_succeeds(tmp_path, cache):
    from opforge.native.cache import BuildCache

    (tmp_path / "kernel.cpp").write_text(GOOD.replace("3 *", "3.0f *"))  # a fresh cache key
    (tmp_path / "bad_ops.yaml").write_text(MUL3)
    script = textwrap.dedent(f"""
        from opforge.native import build_library
        build_library({str(tmp_path / 'bad_ops.yaml')!r}, [{str(tmp_path / 'kernel.cpp')!r}],
                      {str(tmp_path / 'libkilled.so')!r}, cache_root={str(cache)!r})
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    tmp_dir = BuildCache(cache).root / "tmp"
    deadline = time.time() + 60
    while time.time() < deadline and not (tmp_dir.is_dir() and any(tmp_dir.glob("*/project"))):
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)  # the builder and its compiler, mid-build
    proc.wait()
    stale = list(tmp_dir.glob("*.*.*"))
    assert stale, "the killed build should have left its temp dir behind"
    assert not (tmp_path / "libkilled.so").exists()
    result = build_library(tmp_path / "bad_ops.yaml", [tmp_path / "kernel.cpp"],
                           tmp_path / "libkilled.so", cache_root=cache)
    assert not result.cached
    assert not any(p.exists() for p in stale)  # swept by the next builder of that key
    NativeLibrary(result.path).kernel("bad_ops::mul3.out")


def test_build_interrupted_in_process_caches_nothing(tmp_path, cache, monkeypatch):
    from opforge.native import driver
    from opforge.native.cache import BuildCache

    def interrupted(command, cwd):
        if "--build" in command:
            raise KeyboardInterrupt
        return real(command, cwd)

    real = driver._run
    monkeypatch.setattr(driver, "_run", interrupted)
    with pytest.raises(KeyboardInterrupt):
        _build(tmp_path, cache, GOOD.replace("3 *", "3.0f * 1 *"), name="libint.so")
    monkeypatch.setattr(driver, "_run", real)
    assert not any((BuildCache(cache).root / "tmp").glob("*"))
    result = _build(tmp_path, cache, GOOD.replace("3 *", "3.0f * 1 *"), name="libint.so")
    assert not result.cached


def test_failed_build_is_never_cached(tmp_path, cache):
    bad = GOOD.replace("return output;\n}", "return output\n}")
    for _ in range(2):  # the second attempt compiles again and fails again
        with pytest.raises(BuildError, match="compilation failed"):
            _build(tmp_path, cache, bad)
