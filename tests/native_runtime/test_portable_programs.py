"""Whole programs on the portable C++ kernels: an exported zoo model run by the lean runtime
with C++ kernels overriding the NumPy ones, against the NumPy kernels alone.

Two runs: with this module's families only (copies, shapes, indexing, factories: the
outputs must be the same bits), and with every C++ kernel (the matmuls and reductions of
the other families round differently). The second is skipped, naming the keys, while a
kernel the model calls is not written yet or cannot take the program's arguments (the
families are written concurrently)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")

from opforge.errors import KernelError  # noqa: E402
from opforge.kernels.portable import factory, indexing, quantized, resample, shape, sorting, view_copy  # noqa: E402
from opforge.runtime.native import NativeLibrary  # noqa: E402

OURS = {key for module in (factory, indexing, quantized, resample, shape, sorting, view_copy)
        for key in module.KERNELS}


@pytest.fixture(scope="module")
def library(native_runtime):
    return NativeLibrary(native_runtime.portable_library)


def _program(name):
    from opforge.examples.zoo import ZOO
    from opforge.export import export

    model, example = ZOO[name]()
    return export(model, example), [t.numpy() for t in example]


@pytest.mark.parametrize("name", ["transformer_layer", "gpt_decoder"])
def test_zoo_model_on_cpp_copy_kernels(library, name):
    from opforge.runtime import KernelRegistry, load

    program, inputs = _program(name)
    called = {op.key for m in program.methods for op in m.operators}
    ours = sorted(called & OURS & set(library.keys()))
    assert ours, "the model calls none of the kernels this test is about"
    registry = KernelRegistry.portable()
    for key in ours:
        registry.register(key, library.kernel(key), origin=library.path, target="native", override=True)
    expected = load(program).method("forward")(*inputs)
    got = load(program, registry=registry).method("forward")(*inputs)
    for e, g in zip(expected, got):
        assert e.shape == g.shape and e.dtype == g.dtype and e.tobytes() == g.tobytes()


@pytest.mark.parametrize("name", ["transformer_layer", "gpt_decoder"])
def test_zoo_model_on_all_cpp_kernels(native_runtime, library, name):
    from opforge.runtime import load

    program, inputs = _program(name)
    called = {op.key for m in program.methods for op in m.operators}
    missing = sorted(called - set(library.keys()))
    if missing:
        pytest.skip(f"{name}: no C++ kernel yet for {', '.join(missing)}")
    expected = load(program).method("forward")(*inputs)
    try:
        got = load(program, kernels=[str(native_runtime.portable_library)]).method("forward")(*inputs)
    except KernelError as e:
        if any(key in str(e) for key in OURS):
            raise
        pytest.skip(f"{name}: another family's C++ kernel refused the program: {str(e)[:300]}")
    for e, g in zip(expected, got):
        assert e.shape == g.shape and e.dtype == g.dtype
        # the copies are exact; the matmuls and reductions of the other C++ families sum in
        # another order than NumPy's BLAS: float32 rounding of O(1) values over a few layers
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name,scheme", [("mlp", "8a8w"), ("transformer_layer", "8a8w"),
                                         ("cnn", "16a4w_block")])
def test_quantized_model_on_cpp_kernels(library, name, scheme):
    """A converted model's quantize / dequantize (per tensor, per channel, torchao block-wise)
    and copies on the C++ kernels give the NumPy kernels' bits."""
    from opforge.examples.zoo import ZOO
    from opforge.runtime import KernelRegistry, load
    from tests.quantize.quantize_support import quantized_zoo

    program = quantized_zoo(name, scheme).export()
    inputs = [x.numpy() for x in ZOO[name]()[1]]
    called = {op.key for m in program.methods for op in m.operators}
    ours = sorted(called & OURS)
    assert any("quantize_per_tensor" in key for key in ours)
    registry = KernelRegistry.portable()
    for key in ours:
        registry.register(key, library.kernel(key), origin=library.path, target="native", override=True)
    expected = load(program).method("forward")(*inputs)
    got = load(program, registry=registry).method("forward")(*inputs)
    for e, g in zip(expected, got):
        assert e.shape == g.shape and e.dtype == g.dtype and e.tobytes() == g.tobytes()
