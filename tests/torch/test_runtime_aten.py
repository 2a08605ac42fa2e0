"""The ATen-mode adapter (opforge.kernels.aten): torch's out overloads behind the portable
calling convention, zero-copy into the arena, converted once at bind."""

from __future__ import annotations

import numpy as np
import pytest

from opforge.errors import KernelError, ProgramError
from opforge.kernels.aten import AtenOpKernel, aten_kernel, torch_op
from opforge.program import (
    ArenaStorage, BoolValue, ConstantStorage, IntValue, KernelCall, MemoryPlan, Method, NoneValue,
    Operator, Program, ScalarType, ScalarTypeValue, Segment, TensorValue,
)
from opforge.runtime import KernelRegistry, load

F32 = ScalarType.FLOAT32


def test_a_kernel_is_callable_with_numpy_arrays_and_writes_in_place():
    kernel = aten_kernel("aten::add.out")
    assert kernel.target == "aten" and kernel.origin == "torch.ops.aten.add.out"
    out = np.zeros(3, np.float32)
    kernel.fn(np.ones(3, np.float32), np.arange(3, dtype=np.float32), 2, out)
    assert out.tolist() == [1.0, 3.0, 5.0]


def test_bind_converts_once_and_shares_memory():
    out = np.zeros(3, np.float32)
    x = np.ones(3, np.float32)
    fn, args = aten_kernel("aten::mul.out").fn.bind((x, x, out))
    x[:] = 4  # the bound tensors are views of the same memory
    fn(*args)
    assert out.tolist() == [16.0] * 3


def test_unknown_ops_are_none_and_custom_ops_appear_once_registered():
    assert aten_kernel("aten::no_such_op.out") is None
    assert aten_kernel("nosuchns::op.out") is None
    assert torch_op("aten::add.no_such_overload") is None
    from opforge.examples.my_ops import register_examples

    register_examples()
    assert aten_kernel("my_ops::mul3.out") is not None
    assert "my_ops::mul3.out" in KernelRegistry.aten()


def test_scalar_type_and_memory_format_arguments_are_converted():
    to_copy = aten_kernel("aten::_to_copy.out").fn  # (self, *, non_blocking, memory_format, out)
    out = np.zeros(3, np.int64)
    to_copy(np.array([1.5, 2.5, -3.5], np.float32), False, 0, out)
    assert out.tolist() == [1, 2, -3]
    ones = np.zeros((2, 2), np.float64)
    aten_kernel("aten::full.out").fn((2, 2), 1.5, ones)
    assert ones.tolist() == [[1.5, 1.5], [1.5, 1.5]]
    assert isinstance(aten_kernel("aten::clone.out").fn, AtenOpKernel)


def _program(out_storage, operator=("aten::neg", "out"), extra=()):
    values = (TensorValue(F32, (4,), storage=ArenaStorage(0, 0)),
              TensorValue(F32, (4,), storage=out_storage)) + tuple(extra)
    return Program(methods=(Method("forward", values, (0,), (1,), (KernelCall(0, (0, 1)),),
                                   (Operator(*operator),), MemoryPlan((128,))),),
                   segments=(Segment(bytes(64)),))


def test_aten_mode_writes_straight_into_the_arena():
    forward = load(_program(ArenaStorage(0, 64)), mode="aten").method()
    (view,) = forward(np.arange(4, dtype=np.float32), views=True)
    assert view.tolist() == [0.0, -1.0, -2.0, -3.0]
    assert np.shares_memory(view, forward._arenas[0])


def test_writing_into_a_read_only_constant_is_refused_at_load_not_a_crash():
    with pytest.raises(ProgramError, match="a constant tensor, where the kernel writes"):
        load(_program(ConstantStorage(0, 0)), mode="aten")


def test_writing_into_a_read_only_array_is_refused_at_bind():
    # the bind-time guard behind the load-time one: a read-only array handed to the kernel
    kernel = aten_kernel("aten::neg.out")
    out = np.zeros(3, np.float32)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="read-only array"):
        kernel.fn.bind((np.ones(3, np.float32), out))


def test_aten_and_lean_agree_with_scalar_type_arguments():
    values = (TensorValue(F32, (4,), storage=ArenaStorage(0, 0)), IntValue(0),
              ScalarTypeValue(ScalarType.FLOAT64), TensorValue(ScalarType.FLOAT64, (),
                                                               storage=ArenaStorage(0, 64)),
              NoneValue())
    # sum.IntList_out(self, int[1]? dim, bool keepdim=False, *, ScalarType? dtype=None, out)
    program = Program(methods=(Method(
        "forward", values + (BoolValue(False),), (0,), (3,),
        (KernelCall(0, (0, 4, 5, 2, 3)),), (Operator("aten::sum", "IntList_out"),),
        MemoryPlan((128,))),))
    x = np.array([1, 2, 3, 4.5], np.float32)
    lean = load(program).method()(x)[0]
    aten = load(program, mode="aten").method()(x)[0]
    assert lean.dtype == aten.dtype == np.float64 and lean == aten == 10.5


@pytest.mark.parametrize("bias", [True, False])
def test_linear_of_a_vector_writes_its_out_without_a_resize(bias, capfd):
    import warnings

    """ATen's linear.out resizes a 1-D input's out to (1, N) and back (a deprecated resize
    that a later torch refuses); ATen mode hands it the (1, N) view of the same memory."""
    import torch

    from opforge.export import export

    model = torch.nn.Linear(6, 7, bias=bias).eval()
    x = torch.randn(6)
    program = export(model, (x,))
    forward = load(program, mode="aten").method("forward")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        (got,) = forward(x.numpy())
    assert not [w for w in caught if "resized" in str(w.message)]
    with torch.no_grad():
        want = model.double()(x.double()).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert "resized" not in capfd.readouterr().err


@pytest.mark.parametrize("shapes", [((5,), (5, 1)), ((8,), (8, 4))])
def test_matmul_of_a_vector_and_a_matrix_writes_its_out_without_a_resize(shapes, capfd):
    """ATen's matmul.out of (K,) @ (K, N) resizes its (N,) out to (1, N) and squeezes it
    back (the differential tester's seeds 4707 and 4745). The planned (N,) is matmul's
    shape; ATen mode hands it the (1, N) view of the same memory."""
    import warnings

    import torch

    from opforge.export import export

    class MatMul(torch.nn.Module):
        def forward(self, a, b):
            return torch.matmul(a, b)

    a, b = torch.randn(shapes[0]), torch.randn(shapes[1])
    program = export(MatMul(), (a, b), kernels="portable")  # keeps matmul whole
    loaded = load(program, mode="aten")
    calls = range(len(program.method("forward").instructions))
    assert [loaded.kernel_for("forward", i).key for i in calls] == ["aten::matmul.out"]
    forward = loaded.method("forward")
    capfd.readouterr()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):  # the second call runs over the first call's memory
            (got,) = forward(a.numpy(), b.numpy())
            assert got.shape == torch.matmul(a, b).shape
            np.testing.assert_allclose(got, (a.double() @ b.double()).numpy(),
                                       rtol=1e-5, atol=1e-6)
    assert not [w for w in caught if "resized" in str(w.message)]
    assert "resized" not in capfd.readouterr().err
