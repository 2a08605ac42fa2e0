"""From a MindSpore library to a lean run: an op whose out_shape/out_dtype are Python
lambdas (MindSpore's most common form) is packaged with "program" inference and its
exported program runs lean; `--kernels lib.so` with a MindSpore AOT library says how to
load it (a vendor package), not "rebuild it with opforge build"."""

import numpy as np
import pytest

from mindspore_support import KERNELS, needs_cxx

torch = pytest.importorskip("torch")
pytestmark = needs_cxx


class Model(torch.nn.Module):
    def __init__(self, op):
        super().__init__()
        self.op = op

    def forward(self, x, y):
        return self.op(x * 2.0, y) + 1.0


def test_lambda_inference_runs_lean_from_a_package(cache, tmp_path, monkeypatch):
    from opforge.export import export
    from opforge.mindspore import Custom, read_package, write_package
    from opforge.program import to_bytes
    from opforge.runtime import load

    op = Custom(f"{KERNELS / 'plain_add.cc'}:PlainAdd", out_shape=lambda x, y: x,
                out_dtype=lambda x, y: x, func_type="aot", cache_root=cache)
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    program = export(Model(op), (x, y))
    folder = write_package([op.op], tmp_path / "vendors" / "lambdas")  # refused before
    (stored,) = read_package(folder)
    assert stored.out_shape == stored.out_dtype == "program"
    monkeypatch.setenv("OPFORGE_CUSTOM_OPP_PATH", str(tmp_path))
    (lean,) = load(to_bytes(program), kernels=["opforge.mindspore:register_vendor_ops"]
                   ).method("forward")(x.numpy(), y.numpy())
    np.testing.assert_allclose(lean, (x * 2 + y + 1).numpy(), rtol=1e-6)
    with pytest.raises(Exception, match="could not store"):
        stored.infer([(3, 4), (3, 4)], ["float32", "float32"])  # eager use says why not


def test_kernels_option_with_a_mindspore_library_names_the_way(add_lib):
    from opforge.errors import BuildError
    from opforge.runtime import KernelRegistry
    from opforge.runtime.native import load_library

    with pytest.raises(BuildError) as e:
        load_library(add_lib, KernelRegistry.portable())
    message = str(e.value)
    assert "MindSpore AOT kernel library (kernel(s) AddCustom)" in message
    assert "write_package" in message and "register_vendor_ops" in message
    assert "rebuild it with `opforge build`" not in message
