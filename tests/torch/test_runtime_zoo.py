"""Every zoo model, exported with opforge.export, runs on the runtime in lean and ATen mode
and matches eager PyTorch; so does a model built from the custom my_ops operators.

Tolerances: float32 end to end. ATen mode runs the very kernels eager runs, but export
decomposes composite ops (linear → permute + addmm, batch norm → its decomposition, ...),
so rounding may differ by a few ulps per op; lean mode adds NumPy's BLAS and convolution
summation order. Over a few dozen ops that stays far below rtol 1e-4 / atol 1e-5 (measured:
max abs error under 1e-6 on every model), while any wrong index, stride or plan overlap
gives errors of order 1.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from opforge.examples.custom_model import custom_op_model
from opforge.examples.my_ops_numpy import register_example_kernels
from opforge.examples.zoo import ZOO
from opforge.export import export
from opforge.program import to_bytes
from opforge.runtime import KernelRegistry, load

RTOL, ATOL = 1e-4, 1e-5


@pytest.fixture(scope="module", params=sorted(ZOO))
def zoo_program(request):
    model, inputs = ZOO[request.param]()
    with torch.no_grad():
        expected = model(*inputs).numpy()
    return request.param, to_bytes(export(model, inputs)), inputs, expected


@pytest.mark.parametrize("mode", ["lean", "aten"])
def test_zoo_model_matches_eager(zoo_program, mode):
    name, data, inputs, expected = zoo_program
    forward = load(data, mode=mode).method("forward")
    arrays = [t.numpy() for t in inputs]
    for _ in range(2):  # a second call on the same arena gives the same answer
        (got,) = forward(*arrays)
        np.testing.assert_allclose(got, expected, rtol=RTOL, atol=ATOL, err_msg=f"{name}/{mode}")


@pytest.mark.parametrize("name", ["mlp", "transformer_layer"])
def test_zoo_model_exported_for_portable_kernels_matches_eager(name):
    model, inputs = ZOO[name]()
    with torch.no_grad():
        expected = model(*inputs).numpy()
    program = export(model, inputs, kernels="portable")  # keeps aten::linear whole
    assert "aten::linear.out" in {o.key for o in program.method("forward").operators}
    for mode in ("lean", "aten"):
        (got,) = load(program, mode=mode).method()(*[t.numpy() for t in inputs])
        np.testing.assert_allclose(got, expected, rtol=RTOL, atol=ATOL)


@pytest.fixture(scope="module")
def custom_program():
    model, inputs = custom_op_model()
    with torch.no_grad():
        expected = model(*inputs).numpy()
    return export(model, inputs), inputs[0].numpy(), expected


def test_custom_op_model_in_lean_mode_uses_the_numpy_example_kernels(custom_program):
    program, x, expected = custom_program
    keys = {o.key for o in program.method("forward").operators}
    assert {"my_ops::mul3.out", "my_ops::mul4.out", "my_ops::minmax.out",
            "my_ops::scaled_sum.out"} <= keys
    registry = KernelRegistry.portable()
    register_example_kernels(registry)
    loaded = load(program, registry=registry)
    assert loaded.kernel_for("forward", 2).origin.startswith("opforge.examples.my_ops_numpy")
    (got,) = loaded.method()(x)
    np.testing.assert_allclose(got, expected, rtol=RTOL, atol=ATOL)


def test_custom_op_model_in_aten_mode_uses_torch_ops(custom_program):
    program, x, expected = custom_program
    loaded = load(program, mode="aten")
    assert loaded.kernel_for("forward", 2).origin == "torch.ops.my_ops.mul3.out"
    (got,) = loaded.method()(x)
    np.testing.assert_allclose(got, expected, rtol=RTOL, atol=ATOL)


def test_custom_op_model_in_lean_mode_without_kernels_lists_all_four(custom_program):
    from opforge.errors import MissingKernelError

    with pytest.raises(MissingKernelError) as info:
        load(custom_program[0])
    assert [m.key for m in info.value.missing] == [
        "my_ops::mul3.out", "my_ops::minmax.out", "my_ops::mul4.out", "my_ops::scaled_sum.out"]


@pytest.mark.parametrize("shape, dim", [((3, 5), 1), ((2, 3, 4), 0), ((6,), 0)])
def test_example_numpy_kernels_match_the_references(shape, dim):
    from opforge.examples import my_ops, my_ops_numpy as k

    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    a = x.numpy()
    out = np.empty(shape, np.float32)
    k.mul3_out(a, out)
    np.testing.assert_array_equal(out, my_ops.mul3_reference(x).numpy())
    k.mul4_out(a, out)
    np.testing.assert_array_equal(out, my_ops.mul4_reference(x).numpy())
    lo_ref, hi_ref = my_ops.minmax_reference(x, dim)
    lo, hi = np.empty(lo_ref.shape, np.float32), np.empty(hi_ref.shape, np.float32)
    k.minmax_out(a, dim, lo, hi)
    np.testing.assert_array_equal(lo, lo_ref.numpy())
    np.testing.assert_array_equal(hi, hi_ref.numpy())
    for dims, keepdim in [((dim,), False), ((dim,), True), ((), False)]:
        ref = my_ops.scaled_sum_reference(x, 0.5, list(dims), keepdim).numpy()
        got = np.empty(ref.shape, np.float32)
        k.scaled_sum_out(a, 0.5, dims, keepdim, got)
        np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-6)
