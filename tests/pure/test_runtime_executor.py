"""The lean runtime on hand-built programs (no torch): loading, binding, running, bad inputs,
missing kernels, kernel failures, allocation, threads and tracing."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest

import opforge.runtime
from opforge.errors import BackendError, KernelError, MissingKernelError, ProgramError, RegistrationError
from opforge.program import (
    ArenaStorage, ConstantStorage, DelegateBlob, DelegateCall, Free, IntValue, KernelCall,
    MemoryPlan, Method, Move, NoneValue, Operator, Program, ScalarType, Segment,
    TensorListValue, TensorValue, save, to_bytes,
)
from opforge.runtime import KernelRegistry, Tracer, load

F32, I64 = ScalarType.FLOAT32, ScalarType.INT64


def arena(shape, offset, dtype=F32):
    return TensorValue(dtype, shape, storage=ArenaStorage(0, offset))


def single(values, inputs, outputs, instructions, operators, size, name="forward", **kw):
    return Program(methods=(Method(name, tuple(values), inputs, outputs, tuple(instructions),
                                   tuple(Operator(*o.split(".")) for o in operators),
                                   MemoryPlan((size,))),), **kw)


def add_program(dtype=F32, shape=(4,)):
    """forward(x, y) = x + y via aten::add.out(self, other, *, alpha, out)."""
    step = -(-int(np.prod(shape)) * dtype.itemsize // 64) * 64
    values = [arena(shape, 0, dtype), arena(shape, step, dtype), IntValue(1),
              arena(shape, 2 * step, dtype)]
    return single(values, (0, 1), (3,), [KernelCall(0, (0, 1, 2, 3))], ["aten::add.out"],
                  3 * step)


def linear_program():
    """forward(x: f32[2, 4]) = relu(x @ W.T + b) with W, b constants, then a Move and a Free."""
    weight = (np.arange(12, dtype=np.float32).reshape(3, 4) - 5) / 10
    bias = np.array([0.5, -0.5, 0.25], dtype=np.float32)
    segment = np.zeros(64 + 16, dtype=np.uint8)
    segment[:48] = weight.view(np.uint8).ravel()
    segment[64:76] = bias.view(np.uint8)
    values = [
        arena((2, 4), 0),                                              # 0 x
        TensorValue(F32, (3, 4), storage=ConstantStorage(0, 0)),       # 1 W
        TensorValue(F32, (3,), storage=ConstantStorage(0, 64)),        # 2 b
        arena((2, 3), 64),                                             # 3 linear
        arena((2, 3), 128),                                            # 4 relu
        arena((2, 3), 192),                                            # 5 moved copy (output)
    ]
    instructions = [KernelCall(0, (0, 1, 2, 3)), Free(0), KernelCall(1, (3, 4)), Move(4, 5)]
    program = single(values, (0,), (5,), instructions, ["aten::linear.out", "aten::relu.out"],
                     256, segments=(Segment(segment),))
    return program, weight, bias


def _reference_linear(x, weight, bias):
    return np.maximum(x @ weight.T + bias, 0)


# --- running ---------------------------------------------------------------------------------

def test_public_surface():
    for name in opforge.runtime.__all__:
        assert getattr(opforge.runtime, name) is not None, name


def test_add_runs_repeatedly_with_fresh_outputs():
    forward = load(add_program()).method("forward")
    for k in range(3):
        x, y = np.arange(4, dtype=np.float32) + k, np.full(4, 2.0, np.float32)
        (out,) = forward(x, y)
        np.testing.assert_array_equal(out, x + y)
    first, = forward(x, y)
    second, = forward(x + 1, y)
    assert first[0] == x[0] + 2 and second[0] == x[0] + 3  # copies do not alias the arena


def test_views_return_the_arena_valid_until_the_next_call():
    forward = load(add_program()).method("forward")
    ones = np.ones(4, np.float32)
    (view,) = forward(ones, ones, views=True)
    assert view.tolist() == [2.0] * 4
    forward(ones, 2 * ones, views=True)
    assert view.tolist() == [3.0] * 4  # the same memory, overwritten by the next call


def test_constants_moves_and_frees_from_a_memory_mapped_file(tmp_path):
    program, weight, bias = linear_program()
    path = tmp_path / "linear.opf"
    save(program, path)
    loaded = load(path)
    assert loaded.method_names == ("forward",)
    forward = loaded.method("forward")
    assert forward.instructions == [(0, "aten::linear.out"), (2, "aten::relu.out"), (3, "move")]
    x = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
    (y,) = forward(x)
    np.testing.assert_allclose(y, _reference_linear(x, weight, bias), rtol=1e-6)
    # from bytes too, and the constant views are read-only
    (y2,) = load(to_bytes(program)).method()(x)
    np.testing.assert_array_equal(y, y2)


def test_tensor_lists_and_int_outputs():
    values = [arena((2,), 0), arena((3,), 64), TensorListValue((0, 1)), IntValue(0),
              arena((5,), 128), IntValue(7)]
    program = single(values, (0, 1), (4, 5), [KernelCall(0, (2, 3, 4))], ["aten::cat.out"], 192)
    a, b = np.array([1, 2], np.float32), np.array([3, 4, 5], np.float32)
    out, seven = load(program).method()(a, b)
    assert out.tolist() == [1, 2, 3, 4, 5] and seven == 7


def test_scalar_inputs_are_rebound_each_call():
    values = [arena((3,), 0), arena((3,), 64), IntValue(1), arena((3,), 128)]
    program = single(values, (0, 1, 2), (3,), [KernelCall(0, (0, 1, 2, 3))], ["aten::add.out"],
                     192)
    forward = load(program).method()
    x = np.ones(3, np.float32)
    assert forward(x, x, 2)[0].tolist() == [3, 3, 3]
    assert forward(x, x, 5)[0].tolist() == [6, 6, 6]
    with pytest.raises(ProgramError, match="input 2 — found str"):
        forward(x, x, "5")


# --- inputs that must work ----------------------------------------------------------------

def test_non_contiguous_input_works():
    forward = load(add_program(shape=(2, 3))).method()
    base = np.arange(12, dtype=np.float32).reshape(3, 4)
    x = base.T[:3, :2].T  # a transposed, strided view
    assert not x.flags.c_contiguous and x.shape == (2, 3)
    (out,) = forward(x, np.ones((2, 3), np.float32))
    np.testing.assert_array_equal(out, x + 1)


def test_read_only_input_works():
    forward = load(add_program()).method()
    x = np.arange(4, dtype=np.float32)
    x.flags.writeable = False
    (out,) = forward(x, x)
    np.testing.assert_array_equal(out, 2 * x)


def test_array_likes_are_converted():
    forward = load(add_program(dtype=I64)).method()
    (out,) = forward(np.arange(4), [1, 1, 1, 1])
    assert out.tolist() == [1, 2, 3, 4]


# --- inputs that must fail ----------------------------------------------------------------

def test_wrong_number_of_inputs():
    forward = load(add_program()).method()
    with pytest.raises(ProgramError) as info:
        forward(np.ones(4, np.float32))
    message = str(info.value)
    assert "found 1 input(s)" in message and "exactly 2" in message
    assert "float32 of shape (4,)" in message


def test_wrong_dtype_names_the_input_expected_and_found():
    forward = load(add_program()).method()
    with pytest.raises(ProgramError) as info:
        forward(np.ones(4, np.float32), np.ones(4, np.float64))
    message = str(info.value)
    assert "input 1" in message and "found dtype float64" in message
    assert "float32 of shape (4,)" in message and "astype" in message


def test_wrong_shape_names_the_input_expected_and_found():
    forward = load(add_program()).method()
    with pytest.raises(ProgramError) as info:
        forward(np.ones((2, 2), np.float32), np.ones(4, np.float32))
    message = str(info.value)
    assert "input 0" in message and "found shape (2, 2)" in message and "(4,)" in message


def test_unknown_method_lists_the_available_ones():
    with pytest.raises(ProgramError) as info:
        load(add_program()).method("encode")
    assert "'encode'" in str(info.value) and "valid: 'forward'" in str(info.value)


# --- missing kernels and failing kernels --------------------------------------------------

def test_missing_kernels_are_all_listed_at_load():
    x, y = arena((4,), 0), arena((4,), 64)
    i, j = arena((4,), 0, I64), arena((4,), 64, I64)
    values = [x, y, i, j]
    instructions = [KernelCall(0, (0, 1)), KernelCall(1, (0, 1)), KernelCall(2, (2, 3)),
                    KernelCall(0, (1, 0)), KernelCall(3, (0, 1))]
    ops = ["my_ops::mul3.out", "aten::relu.out", "aten::nonexistent.out", "aten::relu.outt"]
    program = single(values, (0,), (1,), instructions, ops, 128)
    with pytest.raises(MissingKernelError) as info:
        load(program)
    message = str(info.value)
    assert "3 operator(s)" in message
    assert "`my_ops::mul3.out` (method 'forward' instructions 0, 3; dtype float32)" in message
    assert "`aten::nonexistent.out` (method 'forward' instruction 2; dtype int64)" in message
    assert "`aten::relu.outt`" in message and "near names in the registry: `aten::relu.out`" \
        in message
    assert "opforge build" in message and "--mode aten" in message
    assert [m.key for m in info.value.missing] == [
        "my_ops::mul3.out", "aten::nonexistent.out", "aten::relu.outt"]


def test_dtype_specific_kernels_resolve_per_instruction():
    calls = []
    registry = KernelRegistry.portable()
    registry.register("aten::add.out", lambda *a: calls.append("f32") or np.add(a[0], a[1],
                      out=a[3]), origin="t", target="native", dtype_key="float32")
    loaded = load(add_program(), registry=registry)
    assert loaded.kernel_for("forward", 0).origin == "t"
    loaded.method()(np.ones(4, np.float32), np.ones(4, np.float32))
    assert calls == ["f32"]
    assert load(add_program(dtype=I64), registry=registry).kernel_for(
        "forward", 0).target == "portable"


def test_a_dtype_only_kernel_is_reported_with_its_dtypes():
    registry = KernelRegistry()
    registry.register("aten::add.out", np.add, origin="t", target="native", dtype_key="int64")
    with pytest.raises(MissingKernelError, match="only for dtype.s. int64"):
        load(add_program(), registry=registry)


def test_a_kernel_raising_is_a_kernel_error_naming_op_instruction_and_method():
    def broken(input, output):
        raise ZeroDivisionError("boom")

    registry = KernelRegistry.portable()
    registry.register("aten::relu.out", broken, origin="tests.broken", target="portable",
                      override=True)
    program, _, _ = linear_program()
    forward = load(program, registry=registry).method()
    with pytest.raises(KernelError) as info:
        forward(np.ones((2, 4), np.float32))
    message = str(info.value)
    assert "instruction 2 (aten::relu.out" in message and "tests.broken" in message
    assert ".method('forward')" in message and "ZeroDivisionError: boom" in message
    assert isinstance(info.value.__cause__, ZeroDivisionError)
    assert not isinstance(info.value, MissingKernelError)


def test_a_delegate_of_an_unknown_backend_is_refused_at_load():
    values = [arena((4,), 0), arena((4,), 64)]
    program = Program(
        methods=(Method("forward", tuple(values), (0,), (1,), (DelegateCall(0, (0, 1)),), (),
                        MemoryPlan((128,))),),
        segments=(Segment(b"blob"),), delegates=(DelegateBlob("no_such_backend", 0),))
    with pytest.raises(BackendError, match="needs backend 'no_such_backend'.*unknown.*valid: .*cpu"):
        load(program)


def test_bad_mode_and_bad_source():
    with pytest.raises(ProgramError, match="mode 'fast'"):
        load(add_program(), mode="fast")
    with pytest.raises(ProgramError, match="found int"):
        load(3)


def test_kernel_registrars_and_unknown_registrars():
    program = single([arena((4,), 0), arena((4,), 64)], (0,), (1,), [KernelCall(0, (0, 1))],
                     ["my_ops::mul3.out"], 128)
    loaded = load(program, kernels=["opforge.examples.my_ops_numpy:register_example_kernels"])
    assert loaded.method()(np.ones(4, np.float32))[0].tolist() == [3.0] * 4
    with pytest.raises(RegistrationError, match="cannot import"):
        load(program, kernels=["opforge.examples.nope:register"])


# --- performance properties -----------------------------------------------------------------

def _mul3(input, output):
    np.multiply(input, 3, out=output)


def _chain_program(n, size=4096):
    step = size * 4
    values = [arena((size,), step * i) for i in range(n + 1)]
    return single(values, (0,), (n,), [KernelCall(0, (i, i + 1)) for i in range(n)],
                  ["my_ops::mul3.out"], step * (n + 1))


def test_steady_state_call_allocates_nothing(allocations):
    registry = KernelRegistry()
    registry.register("my_ops::mul3.out", _mul3, origin="t", target="portable")
    forward = load(_chain_program(20), registry=registry).method()
    x = np.ones(4096, np.float32)  # one array of it would be 16 KiB
    peak, retained = allocations(lambda: forward(x, views=True), repeats=200)
    assert retained <= 0  # nothing kept
    # nothing transient either beyond NumPy's own few hundred bytes of bookkeeping in
    # np.copyto: no array (16 KiB), no per-call list of arguments
    assert peak < 1024
    assert forward(x)[0][0] == 3.0 ** 20  # copies: one array per output, as documented


def test_separate_instances_run_in_threads():
    loaded = load(add_program(shape=(64,)))
    errors = []

    def worker(seed):
        forward = loaded.method()
        rng = np.random.default_rng(seed)
        try:
            for _ in range(300):
                x = rng.standard_normal(64).astype(np.float32)
                y = rng.standard_normal(64).astype(np.float32)
                (out,) = forward(x, y, views=True)
                np.testing.assert_array_equal(out, x + y)
        except Exception as e:  # collected: a failure in a thread must fail the test
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


# --- tracing --------------------------------------------------------------------------------

def test_tracer_records_every_instruction_and_writes_a_chrome_trace(tmp_path):
    program, weight, bias = linear_program()
    forward = load(program).method()
    tracer = Tracer()
    x = np.ones((2, 4), np.float32)
    for _ in range(3):
        (y,) = forward.run([x], tracer=tracer)
    np.testing.assert_allclose(y, _reference_linear(x, weight, bias), rtol=1e-6)
    kernels = [e for e in tracer.events if e[1] >= 0]
    assert [e[1] for e in kernels] == [0, 2, 3] * 3
    assert sum(1 for e in tracer.events if e[1] == -1) == 3
    rows = {s.op: s for s in tracer.summary()}
    assert set(rows) == {"aten::linear.out", "aten::relu.out", "move"}
    assert all(s.calls == 3 for s in rows.values())
    assert abs(sum(s.share for s in rows.values()) - 1) < 1e-9
    path = tmp_path / "trace.json"
    tracer.save(path)
    trace = json.loads(path.read_text())
    event = next(e for e in trace["traceEvents"] if e["name"] == "aten::relu.out")
    assert event["ph"] == "X" and event["args"]["instruction"] == 2 and event["dur"] >= 0


def test_a_kernel_raising_while_traced_is_reported_the_same_way():
    registry = KernelRegistry()
    registry.register("aten::add.out", lambda *a: 1 / 0, origin="t", target="portable")
    forward = load(add_program(), registry=registry).method()
    with pytest.raises(KernelError, match="instruction 0 .aten::add.out"):
        forward.run([np.ones(4, np.float32)] * 2, tracer=Tracer())


def test_unplanned_zero_byte_tensors_and_none_values():
    values = [arena((0, 3), 0), TensorValue(F32, (0, 3)), NoneValue()]
    program = single(values, (0,), (1,), [KernelCall(0, (0, 2, 1))], ["aten::clone.out"], 64)
    (out,) = load(program).method()(np.zeros((0, 3), np.float32))
    assert out.shape == (0, 3)
