"""The native executor (libopforge_runtime: load, method instances, execute) against the
Python lean runtime on hand-built programs.

Both runtimes run the same compiled kernels (a native library loaded into each, or the
portable C++ kernels), so outputs compare bit for bit. Needs a C++ compiler, CMake and
Ninja; no torch.
"""

import ctypes
import os
import threading
import time

import numpy as np
import pytest

from opforge.errors import OpforgeError
from opforge.examples.my_ops import manifest_path
from opforge.manifest import parse_manifest
from opforge.native import build_library
from opforge.program import (
    ArenaStorage, BoolValue, ConstantStorage, DelegateBlob, DelegateCall, DoubleValue, Free, Guard,
    IntValue, KernelCall, MemoryPlan, Method, Move, Operator, Program, ScalarType, Segment,
    SizeExpr, StateSlot, Symbol, SymbolicValue, TensorValue, pack_int4, to_bytes,
)
from opforge.program.values import PACKING_INT4, PACKING_SPLAT
from opforge.runtime import load

from tests.native_runtime._executor_api import (
    TEST_MANIFEST, TEST_SOURCE, MethodOptions, NativeError, Runtime,
)

F32 = ScalarType.FLOAT32


@pytest.fixture(scope="module")
def rt(native_runtime):
    return Runtime(native_runtime.runtime_library)


@pytest.fixture(scope="module")
def my_ops(tmp_path_factory):
    kernels = sorted((manifest_path().parent / "kernels").glob("*.cpp"))
    return build_library(manifest_path(), kernels, tmp_path_factory.mktemp("my_ops") / "libmy_ops.so").path


@pytest.fixture(scope="module")
def test_ops(tmp_path_factory):
    folder = tmp_path_factory.mktemp("test_ops")
    (folder / "test_ops.cpp").write_text(TEST_SOURCE)
    return build_library(parse_manifest(TEST_MANIFEST, "test_ops.yaml"), [folder / "test_ops.cpp"],
                         folder / "libtest_ops.so").path


@pytest.fixture(scope="module")
def registry(rt, my_ops, test_ops):
    handle = rt.registry([my_ops, test_ops])
    yield handle
    rt.lib.opf_registry_free(handle)


def arena(shape, offset, dtype=F32, mem_id=0, order=None):
    return TensorValue(dtype, shape, order, storage=ArenaStorage(mem_id, offset))


def program_of(*methods, **kw):
    return Program(methods=tuple(methods), **kw)


def both(rt, registry, program, libraries, inputs, method="forward"):
    """(native outputs, Python lean outputs) of one call."""
    handle = rt.load(to_bytes(program), registry)
    try:
        instance = rt.method(handle, method)
        native = rt.run(instance, *inputs)
        rt.lib.opf_method_free(instance)
    finally:
        rt.lib.opf_program_free(handle)
    python = load(program, kernels=[str(p) for p in libraries]).method(method)(*inputs)
    return native, list(python)


def refused(rt, fn, *args):
    with pytest.raises(NativeError) as info:
        rt.check(fn(*args))
    return info.value


# --- a static program end to end -------------------------------------------------------

def chain(n_ops, shape=(2, 3)):
    """x → mul3 → mul4 → mul3 → ... (n_ops kernels), two slots reused."""
    nbytes = int(np.prod(shape)) * 4
    slot = (nbytes + 63) // 64 * 64
    values = [arena(shape, 0), arena(shape, slot), arena(shape, 2 * slot)]
    instructions = [KernelCall(0, (0, 1))]
    for k in range(1, n_ops):
        src, dst = (1, 2) if k % 2 else (2, 1)
        instructions.append(KernelCall(k % 2, (src, dst)))
    out = 1 if n_ops % 2 else 2
    return Method("forward", tuple(values), (0,), (out,), tuple(instructions),
                  (Operator("my_ops::mul3", "out"), Operator("my_ops::mul4", "out")),
                  MemoryPlan((3 * slot,)))


def test_static_chain_matches_lean_runtime(rt, registry, my_ops):
    x = np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5
    native, python = both(rt, registry, program_of(chain(5)), [my_ops], [x])
    assert native[0].dtype == np.float32 and native[0].shape == (2, 3)
    np.testing.assert_array_equal(native[0], python[0])  # the same kernels: bit for bit
    np.testing.assert_array_equal(native[0], x * 3 * 4 * 3 * 4 * 3)


def test_portable_kernels_elementwise_chain(rt, my_ops):
    registry = rt.registry()
    try:
        keys = set(rt.operators(registry))
        if not {"aten::add.out", "aten::mul.out"} <= keys:
            pytest.skip("the portable add/mul kernels are not in this build yet")
        x, y, t, u = arena((4,), 0), arena((4,), 64), arena((4,), 128), arena((4,), 192)
        alpha = IntValue(1)
        values = (x, y, t, u, alpha)
        forward = Method("forward", values, (0, 1), (3,),
                         (KernelCall(0, (0, 1, 4, 2)), KernelCall(1, (2, 0, 3))),
                         (Operator("aten::add", "out"), Operator("aten::mul", "out")), MemoryPlan((256,)))
        # u = (x + y) * x
        a = np.array([1.5, -2.0, 3.25, 0.0], np.float32)
        b = np.array([0.5, 4.0, -1.0, 2.0], np.float32)
        handle = rt.load(to_bytes(program_of(forward)), registry)
        instance = rt.method(handle)
        native = rt.run(instance, a, b)
        python = load(program_of(forward)).method("forward")(a, b)
        np.testing.assert_array_equal(native[0], python[0])
        rt.lib.opf_method_free(instance)
        rt.lib.opf_program_free(handle)
    finally:
        rt.lib.opf_registry_free(registry)


def test_scalar_inputs_reach_the_kernel(rt, registry, test_ops):
    x, out = arena((2, 2), 0), arena((2, 2), 64)
    forward = Method("forward", (x, out, DoubleValue(1.0), IntValue(0)), (0, 2, 3), (1,),
                     (KernelCall(0, (0, 2, 3, 1)),), (Operator("test_ops::affine", "out"),), MemoryPlan((128,)))
    a = np.array([[1, 2], [3, 4]], np.float32)
    native, python = both(rt, registry, program_of(forward), [test_ops], [a, 0.5, 7])
    np.testing.assert_array_equal(native[0], python[0])
    np.testing.assert_array_equal(native[0], a * 0.5 + 7)
    handle = rt.load(to_bytes(program_of(forward)), registry)
    instance = rt.method(handle)
    first = rt.run(instance, a, 2.0, 1)[0]
    second = rt.run(instance, a, -1.0, 3)[0]  # a new scalar reaches the bound call
    np.testing.assert_array_equal(first, a * 2 + 1)
    np.testing.assert_array_equal(second, -a + 3)
    rt.lib.opf_method_free(instance)
    rt.lib.opf_program_free(handle)


def test_move_and_free(rt, registry, my_ops):
    x, y, z = arena((3,), 0), arena((3,), 64), arena((3,), 128)
    forward = Method("forward", (x, y, z), (0,), (2,),
                     (KernelCall(0, (0, 1)), Move(1, 2), Free(1), KernelCall(1, (2, 1))),
                     (Operator("my_ops::mul3", "out"), Operator("my_ops::mul4", "out")), MemoryPlan((192,)))
    forward = Method("forward", (x, y, z), (0,), (2, 1), forward.instructions, forward.operators,
                     forward.memory_plan)
    a = np.array([1, -2, 3], np.float32)
    native, python = both(rt, registry, program_of(forward), [my_ops], [a])
    for n, p in zip(native, python):
        np.testing.assert_array_equal(n, p)
    np.testing.assert_array_equal(native[0], a * 3)
    np.testing.assert_array_equal(native[1], a * 12)


def test_constants_plain_and_int4(rt, registry, my_ops):
    weights = np.array([[-8, 7, 0], [1, -1, 5]], np.int8)
    packed = pack_int4(weights.reshape(-1))
    plain = np.array([0.25, -4.0, 8.0], np.float32)
    segment = np.zeros(128, np.uint8)
    segment[:len(packed)] = np.frombuffer(packed, np.uint8)
    segment[64:76] = plain.view(np.uint8)
    w = TensorValue(ScalarType.INT8, (2, 3), storage=ConstantStorage(0, 0, PACKING_INT4))
    c = TensorValue(F32, (3,), storage=ConstantStorage(0, 64))
    wout = arena((2, 3), 0, ScalarType.INT8)
    cout = arena((3,), 64)
    x = arena((1,), 128)
    forward = Method("forward", (w, c, wout, cout, x), (4,), (2, 3),
                     (KernelCall(0, (0, 2)), KernelCall(0, (1, 3))),
                     (Operator("my_ops::mul3", "out"),), MemoryPlan((192,)))
    program = program_of(forward, segments=(Segment(segment.tobytes()),))
    native, python = both(rt, registry, program, [my_ops], [np.zeros(1, np.float32)])
    for n, p in zip(native, python):
        np.testing.assert_array_equal(n, p)
    np.testing.assert_array_equal(native[0], (weights * 3).astype(np.int8))  # unpacked, then int8 wraps
    np.testing.assert_array_equal(native[1], plain * 3)


def test_caller_arenas_and_zero_copy_input(rt, registry, my_ops):
    program = program_of(chain(2))
    handle = rt.load(to_bytes(program), registry)
    size, count = (ctypes.c_int64 * 4)(), ctypes.c_int64()
    rt.check(rt.lib.opf_program_arena_sizes(handle, b"forward", size, 4, ctypes.byref(count)))
    assert count.value == 1 and size[0] == program.methods[0].memory_plan.arena_sizes[0]
    raw = np.zeros(size[0] + 64, np.uint8)
    block = raw[-raw.ctypes.data % 64:][:size[0]]
    arenas = (ctypes.c_void_p * 1)(block.ctypes.data)
    options = MethodOptions(ctypes.sizeof(MethodOptions), 1, 1, arenas, size)
    instance = rt.method(handle, options=options)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert np.array_equal(rt.run(instance, x)[0], x * 12)
    assert np.frombuffer(block[:24].tobytes(), np.float32).tolist() == x.reshape(-1).tolist()  # the caller's memory
    # zero-copy: the instance reads the caller's (aligned) buffer in place, call after call
    raw_in = np.zeros(6 * 4 + 64, np.uint8)
    given = raw_in[-raw_in.ctypes.data % 64:][:24].view(np.float32).reshape(2, 3)
    given[...] = 1.0
    rt.set_input(instance, 0, given, zero_copy=True)
    rt.check(rt.lib.opf_method_execute(instance))
    assert np.all(rt.output(instance, 0) == 12.0)
    given[...] = 2.0  # no set_input: the pointer stays
    rt.check(rt.lib.opf_method_execute(instance))
    assert np.all(rt.output(instance, 0) == 24.0)
    misaligned = raw_in[1:25].view(np.float32) if raw_in.ctypes.data % 64 else raw_in[4:28].view(np.float32)
    error = refused(rt, rt.lib.opf_method_set_input, instance, 0, misaligned.ctypes.data, 6, 2,
                    (ctypes.c_int64 * 2)(2, 3), 1)
    assert error.name == "OPF_ERR_INPUT" and "64-byte aligned" in error.message
    rt.lib.opf_method_free(instance)
    short = (ctypes.c_int64 * 1)(size[0] - 64)
    error = refused(rt, rt.lib.opf_method_new, handle, b"forward",
                    ctypes.byref(MethodOptions(ctypes.sizeof(MethodOptions), 1, 1, arenas, short)),
                    ctypes.byref(ctypes.c_void_p()))
    assert error.name == "OPF_ERR_INVALID_ARGUMENT" and "arena 0" in error.message
    rt.lib.opf_program_free(handle)


# --- state -------------------------------------------------------------------------------

def stateful_program():
    """Two methods sharing state "cache" (a zero splat at first): prefill sets it (a Move of
    mul3(x) into it); decode scales it in place (mul3 with the state as input and out), then
    moves mul4 of it into it. Both return mul4(cache)."""
    def method(name):
        cache = TensorValue(F32, (4,), storage=ConstantStorage(0, 0, PACKING_SPLAT))
        x, t, out = arena((4,), 0), arena((4,), 64), arena((4,), 128)
        if name == "prefill":
            body = (KernelCall(0, (1, 2)), Move(2, 0), KernelCall(1, (0, 3)))
        else:
            body = (KernelCall(0, (0, 0)), KernelCall(1, (0, 2)), Move(2, 0), KernelCall(1, (0, 3)))
        return Method(name, (cache, x, t, out), (1,), (3,), body,
                      (Operator("my_ops::mul3", "out"), Operator("my_ops::mul4", "out")),
                      MemoryPlan((192,)), state=(StateSlot("cache", 0),))

    return program_of(method("prefill"), method("decode"), segments=(Segment(bytes(64)),))


def test_state_shared_by_two_methods(rt, registry, my_ops):
    program = stateful_program()
    handle = rt.load(to_bytes(program), registry)
    prefill, decode = rt.method(handle, "prefill"), rt.method(handle, "decode")
    decode2 = rt.method(handle, "decode")  # a second instance sees the same live copy
    lean = load(program, kernels=[str(my_ops)])
    py_prefill, py_decode = lean.method("prefill"), lean.method("decode")
    x = np.array([1, 2, -3, 0.5], np.float32)
    steps = [(prefill, py_prefill), (decode, py_decode), (decode2, py_decode), (decode, py_decode)]
    for native_m, python_m in steps:
        np.testing.assert_array_equal(rt.run(native_m, x)[0], python_m(x)[0])
    live = np.zeros(4, np.float32)
    rt.check(rt.lib.opf_program_state_read(handle, b"cache", live.ctypes.data, 16))
    np.testing.assert_array_equal(live, lean.read_state("cache"))
    np.testing.assert_array_equal(live, x * 3 * (3 * 4) ** 3)
    # write, reset, refusals
    mine = np.full(4, 2.0, np.float32)
    rt.check(rt.lib.opf_program_state_write(handle, b"cache", mine.ctypes.data, 16))
    np.testing.assert_array_equal(rt.run(decode, x)[0], mine * 3 * 4 * 4)
    rt.check(rt.lib.opf_program_state_reset(handle, None))
    rt.check(rt.lib.opf_program_state_read(handle, b"cache", live.ctypes.data, 16))
    assert not live.any()
    error = refused(rt, rt.lib.opf_program_state_read, handle, b"kv", live.ctypes.data, 16)
    assert error.name == "OPF_ERR_STATE" and "'cache'" in error.message
    error = refused(rt, rt.lib.opf_program_state_write, handle, b"cache", live.ctypes.data, 12)
    assert error.name == "OPF_ERR_STATE" and "16" in error.message
    for m in (prefill, decode, decode2):
        rt.lib.opf_method_free(m)
    rt.lib.opf_program_free(handle)


def test_state_is_per_loaded_program(rt, registry):
    data = to_bytes(stateful_program())
    one, two = rt.load(data, registry), rt.load(data, registry)
    m1 = rt.method(one, "prefill")
    rt.run(m1, np.ones(4, np.float32))
    live = np.ones(4, np.float32)
    rt.check(rt.lib.opf_program_state_read(two, b"cache", live.ctypes.data, 16))
    assert not live.any()
    rt.lib.opf_method_free(m1)
    rt.lib.opf_program_free(one)
    rt.lib.opf_program_free(two)


# --- dynamic shapes ----------------------------------------------------------------------

def dynamic_program(grow=False):
    """x: (s, 3), y: (2*s, 3) (a derived dimension), guard s != 5; out = mul3(x), out2 =
    mul4(y). With grow=True, s grows (no upper bound) and the tensors live outside arenas."""
    s = Symbol("s", 1, 2**31 - 1 if grow else 8, grow=grow)
    if grow:
        x, y, o1, o2 = (TensorValue(F32, (n, 3)) for n in (2, 4, 2, 4))
        plan = MemoryPlan(())
    else:
        x, y, o1, o2 = arena((8, 3), 0), arena((16, 3), 128), arena((8, 3), 320), arena((16, 3), 448)
        plan = MemoryPlan((640,))
    e = SizeExpr.parse
    symbolic = (SymbolicValue(0, (e("s"), e("3"))), SymbolicValue(1, (e("(2 * s)"), e("3"))),
                SymbolicValue(2, (e("s"), e("3"))), SymbolicValue(3, (e("(2 * s)"), e("3"))))
    return program_of(Method("forward", (x, y, o1, o2), (0, 1), (2, 3),
                             (KernelCall(0, (0, 2)), KernelCall(1, (1, 3))),
                             (Operator("my_ops::mul3", "out"), Operator("my_ops::mul4", "out")), plan,
                             symbols=(s,), symbolic_values=symbolic,
                             guards=(Guard(e("s"), "!=", e("5")),)))


def test_symbolic_sizes_accept_and_refuse(rt, registry, my_ops):
    program = dynamic_program()
    handle = rt.load(to_bytes(program), registry)
    instance = rt.method(handle)
    lean = load(program, kernels=[str(my_ops)]).method("forward")
    rng = np.random.default_rng(0)
    for n in (3, 8, 1, 3, 7, 3):  # new shapes, a repeated one, cached ones
        x = rng.standard_normal((n, 3)).astype(np.float32)
        y = rng.standard_normal((2 * n, 3)).astype(np.float32)
        native = rt.run(instance, x, y)
        python = lean(x, y)
        assert native[0].shape == (n, 3) and native[1].shape == (2 * n, 3)
        for a, b in zip(native, python):
            np.testing.assert_array_equal(a, b)
    x5, y10 = np.zeros((5, 3), np.float32), np.zeros((10, 3), np.float32)
    error = refused(rt, lambda: _run_status(rt, instance, x5, y10))
    assert error.name == "OPF_ERR_INPUT" and "guard s != 5" in error.message and "s=5" in error.message
    with pytest.raises(OpforgeError, match="guard"):
        lean(x5, y10)
    # a derived dimension that disagrees, and a size over the symbol's range
    error = refused(rt, lambda: _run_status(rt, instance, np.zeros((2, 3), np.float32), np.zeros((6, 3), np.float32)))
    assert error.name == "OPF_ERR_INPUT" and "input 1 dimension 0" in error.message and "(2 * s)" in error.message
    error = refused(rt, rt.lib.opf_method_set_input, instance, 0, x5.ctypes.data, 6, 2,
                    (ctypes.c_int64 * 2)(9, 3), 0)
    assert error.name == "OPF_ERR_INPUT" and "s in [1, 8]" in error.message
    error = refused(rt, rt.lib.opf_method_set_input, instance, 0, x5.ctypes.data, 6, 2,
                    (ctypes.c_int64 * 2)(2, 4), 0)
    assert error.name == "OPF_ERR_INPUT" and "dimension 1" in error.message
    # after refusals the instance still runs
    x, y = np.ones((4, 3), np.float32), np.ones((8, 3), np.float32)
    np.testing.assert_array_equal(rt.run(instance, x, y)[1], y * 4)
    info = _input_info(rt, handle, 1)
    assert info == ([16, 3], [2, 3], [16, 3])
    rt.lib.opf_method_free(instance)
    rt.lib.opf_program_free(handle)


def _run_status(rt, instance, *inputs):
    try:
        rt.run(instance, *inputs)
    except NativeError as e:
        return e.status
    return 0


def _input_info(rt, handle, index):
    from tests.native_runtime._executor_api import IoInfo

    info = IoInfo()
    rt.check(rt.lib.opf_program_input_info(handle, b"forward", index, ctypes.byref(info)))
    return ([info.sizes[d] for d in range(info.rank)], [info.min_sizes[d] for d in range(info.rank)],
            [info.max_sizes[d] for d in range(info.rank)])


def test_growing_symbol(rt, registry, my_ops):
    program = dynamic_program(grow=True)
    handle = rt.load(to_bytes(program), registry, max_memory=1 << 20)
    instance = rt.method(handle)
    lean = load(program, kernels=[str(my_ops)]).method("forward")
    assert _input_info(rt, handle, 0)[2] == [2**63 - 1, 3]  # grows unbounded
    for n in (1, 2, 40, 3, 1000, 7):
        x = np.arange(n * 3, dtype=np.float32).reshape(n, 3)
        y = np.arange(2 * n * 3, dtype=np.float32).reshape(2 * n, 3) - 4
        native = rt.run(instance, x, y)
        for a, b in zip(native, lean(x, y)):
            np.testing.assert_array_equal(a, b)
    # beyond the memory limit: refused, and the instance keeps running at sizes that fit
    big = np.zeros((1 << 17, 3), np.float32)  # 1.5 MiB of input alone
    with pytest.raises(NativeError) as info:
        rt.set_input(instance, 1, big)
    error = info.value
    assert error.name == "OPF_ERR_MEMORY" and "growing" in error.message and "opf_method_set_input" in error.message
    x, y = np.ones((6, 3), np.float32), np.ones((12, 3), np.float32)
    np.testing.assert_array_equal(rt.run(instance, x, y)[0], x * 3)
    # inputs given in place (nothing grows at set_input): the outputs' growth is refused at
    # execute, again at the same shape, and the instance still runs at a size that fits
    n = 40000  # outputs of 480 KB and 960 KB, beyond 1 MiB with the rest
    raw = np.zeros(n * 9 * 4 + 128, np.uint8)
    start = -raw.ctypes.data % 64
    big_x = raw[start:start + n * 12].view(np.float32).reshape(n, 3)
    big_y = raw[start + n * 12 + 64 - (n * 12) % 64:][:n * 24].view(np.float32).reshape(2 * n, 3)
    rt.set_input(instance, 0, big_x, zero_copy=True)
    rt.set_input(instance, 1, big_y, zero_copy=True)
    for _ in range(2):
        error = refused(rt, rt.lib.opf_method_execute, instance)
        assert error.name == "OPF_ERR_MEMORY" and "s=40000" in error.message
    np.testing.assert_array_equal(rt.run(instance, x, y)[1], y * 4)
    rt.lib.opf_method_free(instance)
    rt.lib.opf_program_free(handle)


# --- refusals ----------------------------------------------------------------------------

def test_missing_kernels_listed_at_once(rt, registry, my_ops):
    def method(name, ops):
        x, y = arena((2,), 0), arena((2,), 64)
        return Method(name, (x, y), (0,), (1,), tuple(KernelCall(i, (0, 1)) for i in range(len(ops))),
                      tuple(Operator(op, "out") for op in ops), MemoryPlan((128,)))

    program = program_of(method("forward", ["nope::first", "my_ops::mul3", "nope::second"]),
                         method("other", ["nope::first", "my_ops::mul5"]))
    error = refused(rt, rt.lib.opf_program_load_buffer, to_bytes(program), len(to_bytes(program)), 1,
                    registry, None, ctypes.byref(ctypes.c_void_p()))
    assert error.name == "OPF_ERR_MISSING_KERNEL"
    assert "3 operator(s)" in error.message
    for text in ("`nope::first.out` (method 'forward' instruction 0; method 'other' instruction 0",
                 "`nope::second.out` (method 'forward' instruction 2", "`my_ops::mul5.out`", "my_ops::mul3.out"):
        assert text in error.message, text
    with pytest.raises(OpforgeError, match="3 operator"):
        load(program, kernels=[str(my_ops)])
    # verify-only loading takes it, and an instance of it says what is missing
    handle = rt.load(to_bytes(program), registry, flags=1)
    error = refused(rt, rt.lib.opf_method_new, handle, b"forward", None, ctypes.byref(ctypes.c_void_p()))
    assert error.name == "OPF_ERR_MISSING_KERNEL" and "nope::first" in error.message
    rt.lib.opf_program_free(handle)


def test_delegate_of_unknown_backend_refused(rt, registry):
    x, y = arena((2,), 0), arena((2,), 64)
    forward = Method("forward", (x, y), (0,), (1,), (DelegateCall(0, (0, 1)),), (), MemoryPlan((128,)))
    program = program_of(forward, segments=(Segment(b"blob"),), delegates=(DelegateBlob("no_such_backend", 0),))
    data = to_bytes(program)
    error = refused(rt, rt.lib.opf_program_load_buffer, data, len(data), 1, registry, None,
                    ctypes.byref(ctypes.c_void_p()))
    assert error.name == "OPF_ERR_UNSUPPORTED" and "no_such_backend" in error.message


def test_memory_limit(rt, registry, monkeypatch):
    program = program_of(chain(2, shape=(256, 256)))  # 3 slots of 256 KiB
    data = to_bytes(program)
    error = refused(rt, rt.lib.opf_program_load_buffer, data, len(data), 1, registry,
                    ctypes.byref(__import__("tests.native_runtime._executor_api", fromlist=["x"]).LoadOptions(16, 0, 1 << 19)),
                    ctypes.byref(ctypes.c_void_p()))
    assert error.name == "OPF_ERR_MEMORY" and "memory plan" in error.message and "524288 bytes" in error.message
    monkeypatch.setenv("OPFORGE_MAX_MEMORY", "512K")
    error = refused(rt, rt.lib.opf_program_load_buffer, data, len(data), 1, registry, None,
                    ctypes.byref(ctypes.c_void_p()))
    assert error.name == "OPF_ERR_MEMORY" and "512.0 KiB" in error.message
    with pytest.raises(OpforgeError, match="memory limit"):
        load(program)
    monkeypatch.setenv("OPFORGE_MAX_MEMORY", "12 parsecs")
    error = refused(rt, rt.lib.opf_program_load_buffer, data, len(data), 1, registry, None,
                    ctypes.byref(ctypes.c_void_p()))
    assert error.name == "OPF_ERR_INVALID_ARGUMENT" and "OPFORGE_MAX_MEMORY" in error.message
    monkeypatch.setenv("OPFORGE_MAX_MEMORY", "1M")
    handle = rt.load(data, registry)
    rt.lib.opf_program_free(handle)


def test_second_thread_gets_busy(rt, registry, test_ops):
    x, y = arena((2,), 0), arena((2,), 64)
    forward = Method("forward", (x, y), (0,), (1,), (KernelCall(0, (0, 1)),),
                     (Operator("test_ops::slow", "out"),), MemoryPlan((128,)))
    handle = rt.load(to_bytes(program_of(forward)), registry)
    instance = rt.method(handle)
    a = rt.set_input(instance, 0, np.ones(2, np.float32))
    statuses = []
    worker = threading.Thread(target=lambda: statuses.append(rt.lib.opf_method_execute(instance)))
    worker.start()
    time.sleep(0.1)  # the kernel sleeps 300 ms
    error = refused(rt, rt.lib.opf_method_execute, instance)
    assert error.name == "OPF_ERR_BUSY" and "one call at a time" in error.message
    error = refused(rt, rt.lib.opf_method_set_input, instance, 0, a.ctypes.data, 6, 1, (ctypes.c_int64 * 1)(2), 0)
    assert error.name == "OPF_ERR_BUSY"
    worker.join()
    assert statuses == [0]
    rt.check(rt.lib.opf_method_execute(instance))  # free again
    rt.lib.opf_method_free(instance)
    rt.lib.opf_program_free(handle)


def test_bad_inputs_refused(rt, registry):
    handle = rt.load(to_bytes(program_of(chain(1))), registry)
    instance = rt.method(handle)
    error = refused(rt, rt.lib.opf_method_execute, instance)
    assert error.name == "OPF_ERR_INPUT" and "input 0 — not set" in error.message
    x = np.zeros((2, 3), np.float64)
    error = refused(rt, rt.lib.opf_method_set_input, instance, 0, x.ctypes.data, 7, 2, (ctypes.c_int64 * 2)(2, 3), 0)
    assert error.name == "OPF_ERR_INPUT" and "dtype float64" in error.message and "float32" in error.message
    error = refused(rt, rt.lib.opf_method_set_input, instance, 0, x.ctypes.data, 6, 1, (ctypes.c_int64 * 1)(6), 0)
    assert error.name == "OPF_ERR_INPUT" and "rank 1" in error.message
    error = refused(rt, rt.lib.opf_method_set_input, instance, 0, x.ctypes.data, 6, 2, (ctypes.c_int64 * 2)(3, 2), 0)
    assert error.name == "OPF_ERR_INPUT" and "shape (3, 2)" in error.message and "(2, 3)" in error.message
    error = refused(rt, rt.lib.opf_method_set_input, instance, 1, x.ctypes.data, 6, 2, (ctypes.c_int64 * 2)(2, 3), 0)
    assert error.name == "OPF_ERR_INVALID_ARGUMENT" and "input 1" in error.message
    error = refused(rt, rt.lib.opf_method_set_input_int, instance, 0, 3)
    assert error.name == "OPF_ERR_INPUT" and "a tensor" in error.message
    error = refused(rt, rt.lib.opf_method_new, handle, b"backward", None, ctypes.byref(ctypes.c_void_p()))
    assert error.name == "OPF_ERR_INVALID_ARGUMENT" and "'forward'" in error.message
    error = refused(rt, rt.lib.opf_method_output, instance, 5, ctypes.byref(
        __import__("tests.native_runtime._executor_api", fromlist=["x"]).TensorView()))
    assert error.name == "OPF_ERR_INVALID_ARGUMENT"
    assert refused(rt, rt.lib.opf_method_execute, None).name == "OPF_ERR_INVALID_ARGUMENT"
    rt.lib.opf_method_free(instance)
    rt.lib.opf_program_free(handle)


def test_kernel_failure_names_method_instruction_and_op(rt, registry, test_ops):
    x, y, z = arena((3,), 0), arena((3,), 64), arena((3,), 128)
    forward = Method("forward", (x, y, z), (0,), (2,),
                     (KernelCall(0, (0, 1)), KernelCall(0, (1, 2))),
                     (Operator("test_ops::check_positive", "out"),), MemoryPlan((192,)))
    handle = rt.load(to_bytes(program_of(forward)), registry)
    instance = rt.method(handle)
    np.testing.assert_array_equal(rt.run(instance, np.ones(3, np.float32))[0], np.ones(3))
    with pytest.raises(NativeError) as info:
        rt.run(instance, np.array([1, -2, 3], np.float32))
    error = info.value
    assert error.name == "OPF_ERR_KERNEL"
    for text in ("opf_method_execute('forward')", "instruction 0", "test_ops::check_positive.out",
                 "element 1 is negative", "float32(3,)"):
        assert text in error.message, text
    np.testing.assert_array_equal(rt.run(instance, np.full(3, 2, np.float32))[0], np.full(3, 2))  # recovers
    rt.lib.opf_method_free(instance)
    rt.lib.opf_program_free(handle)
    # with a debug table, the message and the profile name the node too
    from opforge.program.debug import DebugCapture, DebugInfo, DebugNode, MethodDebug, with_debug_handles

    nodes = (DebugNode("first_check", "test_ops.check_positive.default", "model.py:3"),
             DebugNode("second_check", "test_ops.check_positive.default", ""))
    table = DebugInfo({"forward": MethodDebug(nodes, (DebugCapture(0, 1, 0), DebugCapture(1, 2, 1)), {})})
    handle = rt.load(to_bytes(with_debug_handles(program_of(forward), table)), registry)
    instance = rt.method(handle)
    with pytest.raises(NativeError) as info:
        rt.run(instance, np.array([-1, 2, 3], np.float32))
    assert "instruction 0 (" in info.value.message and "node 'first_check'" in info.value.message
    node = ctypes.c_char_p()
    rt.check(rt.lib.opf_method_instruction_profile(instance, 1, None, ctypes.byref(node), None))
    assert node.value == b"second_check"
    rt.lib.opf_method_free(instance)
    rt.lib.opf_program_free(handle)


def test_profiling(rt, registry):
    x, y, z = arena((3,), 0), arena((3,), 64), arena((3,), 128)
    forward = Method("forward", (x, y, z), (0,), (2,),
                     (KernelCall(0, (0, 1)), Move(1, 2), Free(1)),
                     (Operator("my_ops::mul3", "out"),), MemoryPlan((192,)))
    handle = rt.load(to_bytes(program_of(forward)), registry)
    instance = rt.method(handle)
    assert rt.lib.opf_method_num_instructions(instance) == 3

    def profile():
        rows = []
        for i in range(3):
            label, node, ns = ctypes.c_char_p(), ctypes.c_char_p(), ctypes.c_int64()
            rt.check(rt.lib.opf_method_instruction_profile(instance, i, ctypes.byref(label), ctypes.byref(node),
                                                           ctypes.byref(ns)))
            rows.append((label.value.decode(), ns.value))
        return rows

    rt.run(instance, np.ones(3, np.float32))
    assert [r[1] for r in profile()] == [-1, -1, -1]
    rt.check(rt.lib.opf_method_set_profiling(instance, 1))
    np.testing.assert_array_equal(rt.run(instance, np.ones(3, np.float32))[0], np.full(3, 3))
    rows = profile()
    assert [r[0] for r in rows] == ["my_ops::mul3.out", "move", "free"]
    assert rows[0][1] >= 0 and rows[1][1] >= 0 and rows[2][1] == -1
    rt.lib.opf_method_free(instance)
    rt.lib.opf_program_free(handle)


def test_load_from_path_and_fd(rt, registry, tmp_path):
    from opforge.program import save

    path = tmp_path / "chain.opf"
    save(program_of(chain(3)), path)
    handle = ctypes.c_void_p()
    rt.check(rt.lib.opf_program_load_path(str(path).encode(), registry, None, ctypes.byref(handle)))
    x = np.ones((2, 3), np.float32)
    instance = rt.method(handle)
    np.testing.assert_array_equal(rt.run(instance, x)[0], x * 36)
    rt.lib.opf_method_free(instance)
    rt.lib.opf_program_free(handle)
    fd = os.open(path, os.O_RDONLY)
    try:
        load_fd = rt.lib.opf_program_load_fd
        load_fd.argtypes, load_fd.restype = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                             ctypes.POINTER(ctypes.c_void_p)], ctypes.c_int32
        rt.check(load_fd(fd, registry, None, ctypes.byref(handle)))
    finally:
        os.close(fd)  # the program keeps its own descriptor
    instance = rt.method(handle)
    np.testing.assert_array_equal(rt.run(instance, x)[0], x * 36)
    rt.lib.opf_method_free(instance)
    rt.lib.opf_program_free(handle)
    error = refused(rt, rt.lib.opf_program_load_path, str(tmp_path / "none.opf").encode(), registry, None,
                    ctypes.byref(handle))
    assert error.name == "OPF_ERR_IO" and "none.opf" in error.message
    truncated = path.read_bytes()[:100]
    error = refused(rt, rt.lib.opf_program_load_buffer, truncated, len(truncated), 1, registry, None,
                    ctypes.byref(handle))
    assert error.name == "OPF_ERR_PROGRAM"


def test_library_refusals(rt, my_ops, tmp_path):
    registry = rt.registry([my_ops])
    try:
        error = refused(rt, rt.lib.opf_registry_load_library, registry, str(my_ops).encode(), 0)
        assert error.name == "OPF_ERR_LIBRARY" and "my_ops::mul3.out already has a kernel" in error.message
        rt.check(rt.lib.opf_registry_load_library(registry, str(my_ops).encode(), 1))  # overriding: fine once
        error = refused(rt, rt.lib.opf_registry_load_library, registry, str(my_ops).encode(), 1)
        assert error.name == "OPF_ERR_LIBRARY" and "overriding kernel" in error.message
        # a table of another ABI version, or of another entry size, is refused before its
        # entries are read (they point nowhere here)
        from opforge.runtime.native import CKernelEntry, CLibrary

        add = rt.lib.opf_registry_add_library
        add.argtypes, add.restype = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32], ctypes.c_int32
        bogus = ctypes.cast(ctypes.c_void_p(16), ctypes.POINTER(CKernelEntry))
        for version, size, text in ((2, ctypes.sizeof(CKernelEntry), "kernel ABI version 2"),
                                    (1, ctypes.sizeof(CKernelEntry) + 8, "entries are")):
            table = CLibrary(version, size, b"other", b"someone", 5, bogus)
            error = refused(rt, add, registry, ctypes.addressof(table), 0)
            assert error.name == "OPF_ERR_LIBRARY" and text in error.message
        junk = tmp_path / "junk.so"
        junk.write_bytes(b"\x7fELF not really")
        error = refused(rt, rt.lib.opf_registry_load_library, registry, str(junk).encode(), 0)
        assert error.name == "OPF_ERR_LIBRARY" and "junk.so" in error.message
    finally:
        rt.lib.opf_registry_free(registry)


def test_lists_and_symbolic_int_lists(rt):
    """cat of a tensor list and view_copy whose size list is symbolic ([2 * s, 2]): the list
    items' sizes and the int list follow each call's shape (portable C++ kernels)."""
    registry = rt.registry()
    try:
        if not {"aten::cat.out", "aten::view_copy.out"} <= set(rt.operators(registry)):
            pytest.skip("the portable cat/view_copy kernels are not in this build yet")
        e = SizeExpr.parse
        x, cat_out, view_out = arena((6, 4), 0), arena((12, 4), 128), arena((12, 2), 320)
        from opforge.program import IntListValue, TensorListValue

        values = (x, TensorListValue((0, 0)), IntValue(0), cat_out, IntListValue((12, 2)), view_out)
        forward = Method("forward", values, (0,), (3, 5),
                         (KernelCall(0, (1, 2, 3)), KernelCall(1, (0, 4, 5))),
                         (Operator("aten::cat", "out"), Operator("aten::view_copy", "out")), MemoryPlan((448,)),
                         symbols=(Symbol("s", 1, 6),),
                         symbolic_values=(SymbolicValue(0, (e("s"), e("4"))),
                                          SymbolicValue(3, (e("(2 * s)"), e("4"))),
                                          SymbolicValue(4, (e("(2 * s)"), e("2"))),
                                          SymbolicValue(5, (e("(2 * s)"), e("2")))))
        program = program_of(forward)
        handle = rt.load(to_bytes(program), registry)
        instance = rt.method(handle)
        lean = load(program).method("forward")
        for n in (6, 2, 5, 2):
            a = np.arange(n * 4, dtype=np.float32).reshape(n, 4)
            native, python = rt.run(instance, a), lean(a)
            assert native[0].shape == (2 * n, 4) and native[1].shape == (2 * n, 2)
            for got, want in zip(native, python):
                np.testing.assert_array_equal(got, want)
        rt.lib.opf_method_free(instance)
        rt.lib.opf_program_free(handle)
    finally:
        rt.lib.opf_registry_free(registry)


def test_channels_last_input(rt):
    """An input planned channels-last (dim order 0, 2, 3, 1) is given dense in that order;
    the kernel sees the logical sizes with the strides of that layout."""
    registry = rt.registry()
    try:
        if "aten::clone.out" not in rt.operators(registry):
            pytest.skip("the portable clone kernel is not in this build yet")
        x = arena((2, 3, 2, 2), 0, order=(0, 2, 3, 1))
        out = arena((2, 3, 2, 2), 128)
        from opforge.program import NoneValue

        forward = Method("forward", (x, NoneValue(), out), (0,), (2,), (KernelCall(0, (0, 1, 2)),),
                         (Operator("aten::clone", "out"),), MemoryPlan((256,)))
        program = program_of(forward)
        a = np.arange(24, dtype=np.float32).reshape(2, 3, 2, 2)
        handle = rt.load(to_bytes(program), registry)
        instance = rt.method(handle)
        rt.set_input(instance, 0, a.transpose(0, 2, 3, 1), shape=a.shape)
        rt.check(rt.lib.opf_method_execute(instance))
        np.testing.assert_array_equal(rt.output(instance, 0), a)
        np.testing.assert_array_equal(rt.output(instance, 0), load(program).method("forward")(a)[0])
        rt.lib.opf_method_free(instance)
        rt.lib.opf_program_free(handle)
    finally:
        rt.lib.opf_registry_free(registry)


def test_instances_in_threads_do_not_share_arenas(rt, registry, my_ops):
    """Two instances of one method, one per thread, called at once: each gets its own
    results (only state is shared by design)."""
    handle = rt.load(to_bytes(program_of(chain(7))), registry)
    instances = [rt.method(handle) for _ in range(2)]
    failures = []

    def work(k):
        x = np.full((2, 3), k + 1, np.float32)
        want = x * 3 ** 4 * 4 ** 3
        for _ in range(300):
            got = rt.run(instances[k], x)[0]
            if not np.array_equal(got, want):
                failures.append((k, got))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures
    # a growing input whose byte count overflows int64 is an input error, not a crash
    program = dynamic_program(grow=True)
    grow = rt.load(to_bytes(program), registry)
    instance = rt.method(grow)
    error = refused(rt, rt.lib.opf_method_set_input, instance, 0, None, 6, 2,
                    (ctypes.c_int64 * 2)(2**62, 3), 0)
    assert error.name == "OPF_ERR_INPUT" and "2**48 bytes" in error.message
    for m in instances + [instance]:
        rt.lib.opf_method_free(m)
    rt.lib.opf_program_free(handle)
    rt.lib.opf_program_free(grow)
