"""ExecuTorch kernel sources, compiled unchanged, as eager PyTorch ops: compared with torch.

Needs a C++ compiler and torch. The kernels and their ExecuTorch-format YAML are those of
test_native_executorch_sources.py (namespace et_ops).
"""

import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from opforge.native import build_library  # noqa: E402
from opforge.errors import KernelError  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("c++") is None and shutil.which("g++") is None,
                                reason="needs a C++ compiler")

HERE = Path(__file__).with_name("executorch_kernels")


@pytest.fixture(scope="module")
def et_ops(cache, tmp_path_factory):
    from opforge.torch_bridge.native_eager import stop_using_native_library, use_native_library

    sources = sorted(HERE.glob("*.cpp"))
    lib = build_library(HERE / "custom_ops.yaml", sources,
                        tmp_path_factory.mktemp("et_eager") / "libet_ops.so", cache_root=cache)
    use_native_library(lib.path, manifest=HERE / "custom_ops.yaml")
    yield torch.ops.et_ops
    stop_using_native_library(lib.path)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int32, torch.int64])
def test_mul3(et_ops, dtype):
    x = (torch.randn(4, 5) * 10).to(dtype)
    torch.testing.assert_close(et_ops.mul3(x), x * 3, rtol=0, atol=0)


# (bfloat16 tensors cannot cross into NumPy, so eager mode cannot pass them to a kernel)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
@pytest.mark.parametrize("other_shape", [(3, 4), (4,), (1, 4), ()])
def test_add_with_alpha_and_broadcasting_matches_torch(et_ops, dtype, other_shape):
    a = torch.randn(3, 4).to(dtype)
    b = torch.randn(other_shape).to(dtype)
    torch.testing.assert_close(et_ops.add_alpha(a, b, alpha=0.5), torch.add(a, b, alpha=0.5))


def test_leaky_relu_matches_torch(et_ops):
    x = torch.randn(64)
    torch.testing.assert_close(et_ops.leaky_relu(x, 0.2),
                               torch.nn.functional.leaky_relu(x, 0.2))
    torch.testing.assert_close(et_ops.leaky_relu(x), torch.nn.functional.leaky_relu(x))


def test_a_failed_et_check_is_a_kernel_error_in_eager_mode(et_ops):
    with pytest.raises(KernelError, match="ET_CHECK failed"):
        et_ops.mul3(torch.ones(3, dtype=torch.bool))
