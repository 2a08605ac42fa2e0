"""One C++ source serves eager PyTorch, export, the lean runtime and `opforge check`.

Needs a C++ compiler and torch.
"""

import shutil
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from opforge.native import build_library  # noqa: E402
from opforge.errors import MissingKernelError  # noqa: E402
from opforge.export import ExportMissingKernelError  # noqa: E402
from opforge.examples.my_ops import manifest_path, register_examples  # noqa: E402
from opforge.runtime.native import NativeLibrary  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("c++") is None and shutil.which("g++") is None,
                                reason="needs a C++ compiler")

KERNELS = sorted((manifest_path().parent / "kernels").glob("*.cpp"))


@pytest.fixture(scope="module")
def native_ops(full):
    from opforge.torch_bridge.native_eager import stop_using_native_library, use_native_library

    register_examples()
    use_native_library(full.path)
    yield torch.ops.my_ops
    stop_using_native_library(full.path)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int32, torch.int64])
@pytest.mark.parametrize("shape", [(), (0,), (7,), (3, 4)])
def test_eager_ops_run_the_native_kernels(native_ops, dtype, shape):
    x = (torch.randn(shape) * 10).to(dtype)
    torch.testing.assert_close(native_ops.mul3(x), x * 3, rtol=0, atol=0)
    torch.testing.assert_close(native_ops.mul4(x.t() if x.dim() == 2 else x),
                               (x.t() if x.dim() == 2 else x) * 4, rtol=0, atol=0)
    if x.dim() and x.numel():
        lo, hi = native_ops.minmax(x, -1)
        torch.testing.assert_close((lo, hi), (x.amin(-1), x.amax(-1)), rtol=0, atol=0)


def test_eager_native_failure_is_kernel_error(native_ops):
    from opforge.errors import KernelError

    with pytest.raises(KernelError, match="unsupported dtype Int"):
        native_ops.scaled_sum(torch.ones(3, dtype=torch.int32), 2, [0])


def test_out_variant_writes_into_the_callers_tensor(native_ops):
    x = torch.randn(5, 6)
    out = torch.empty(5, 6)
    pointer = out.data_ptr()
    assert native_ops.mul3.out(x, output=out) is out
    assert out.data_ptr() == pointer
    torch.testing.assert_close(out, x * 3, rtol=0, atol=0)
    s = torch.empty(6)
    native_ops.scaled_sum.out(x, 0.5, [0], out=s)
    torch.testing.assert_close(s, x.sum(0) * 0.5)


def test_one_source_serves_eager_export_and_runtime(native_ops, full, cache, tmp_path):
    from opforge.export import export
    from opforge.program import save
    from opforge.runtime import load

    class Model(torch.nn.Module):
        def forward(self, x):
            y = torch.ops.my_ops.mul3(x) + 1
            return torch.ops.my_ops.minmax(y, 1)[1]

    x = torch.randn(3, 4)
    program = export(Model(), (x,), kernels=["portable", set(full.ops)])
    # the library itself can be the export-time kernel set: its table names its ops
    assert export(Model(), (x,), kernels=["portable", str(full.path)]).methods == program.methods
    with pytest.raises(ExportMissingKernelError, match="my_ops::minmax.out"):
        export(Model(), (x,), kernels=["portable"])
    save(program, tmp_path / "model.opf")
    forward = load(tmp_path / "model.opf", kernels=[full.path]).method("forward")
    (y,) = forward(x.numpy())
    np.testing.assert_array_equal(y, Model()(x).numpy())

    # selective build from that program: only its custom ops; smaller; a program needing
    # an op left out is refused at load with the missing-operator message
    selected = build_library(manifest_path(), KERNELS, tmp_path / "libselected.so",
                             programs=[tmp_path / "model.opf"],
                             cache_root=cache)
    assert selected.ops == ["my_ops::mul3.out", "my_ops::minmax.out"]
    assert "aten::add.out" in selected.unserved
    only_mul4 = build_library(manifest_path(), KERNELS, tmp_path / "libmul4.so",
                              ops=["my_ops::mul4"], cache_root=cache)
    assert only_mul4.size < full.size
    with pytest.raises(MissingKernelError, match="my_ops::minmax.out") as info:
        load(tmp_path / "model.opf", kernels=[only_mul4.path])
    assert "my_ops::mul3.out" in str(info.value)


def test_opforge_check_passes_on_the_examples(full):
    ops = ["my_ops::mul3", "my_ops::mul4", "my_ops::minmax", "my_ops::scaled_sum"]
    command = [sys.executable, "-m", "opforge", "check", str(manifest_path()), "--kernels",
               str(full.path)] + [a for op in ops for a in ("--op", op)]
    proc = subprocess.run(command, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "4 op(s) passed" in proc.stdout


def test_opforge_check_minmax_fake_on_0d():
    from opforge.examples.my_ops import minmax_fake

    x = torch.tensor(1.0)
    assert minmax_fake(x, 0)[0].shape == torch.amin(x, 0).shape


def test_opforge_check_fails_on_a_wrong_kernel(cache, tmp_path):
    wrong = tmp_path / "mul.cpp"
    wrong.write_text((manifest_path().parent / "kernels" / "mul.cpp").read_text()
                     .replace("scale(&ctx, \"my_ops::mul3.out\", input, output, 3)",
                              "scale(&ctx, \"my_ops::mul3.out\", input, output, 2)"))
    sources = [KERNELS[0], wrong, KERNELS[2]]
    lib = build_library(manifest_path(), sources, tmp_path / "libwrong.so", cache_root=cache)
    proc = subprocess.run([sys.executable, "-m", "opforge", "check", str(manifest_path()),
                           "--kernels", str(lib.path), "--op", "my_ops::mul3"],
                          capture_output=True, text=True)
    assert proc.returncode != 0
    assert "kernel vs reference" in proc.stdout and "FAIL" in proc.stdout


def test_native_library_callable_alone(full):
    lib = NativeLibrary(full.path)
    x = np.arange(4, dtype=np.float32)
    out = np.empty_like(x)
    lib.kernel("my_ops::mul3.out")(x, out)
    assert out.tolist() == [0.0, 3.0, 6.0, 9.0]
