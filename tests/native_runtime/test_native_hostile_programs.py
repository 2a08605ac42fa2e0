"""Native twins of the Python runtime's hostile-program tests: the native runtime
(``load(..., executor="native")``) refuses with a clear error where the lean runtime does,
naming the same subject, and never crashes.

Twins of tests/native/test_native_hostile_programs.py (outputs in constants, read-only
outputs, wrong-shape and wrong-dtype outputs of elementwise and minmax kernels, a FIFO as a
kernel library), tests/pure/test_runtime_memory_limits.py, test_kernels_window_bounds.py,
test_program_symbolic.py and test_program_debug_table.py, built with those modules' own
program builders; the regressions fuzz/native_exec_fuzz.py found; and the bound on the
memory a file's tables expand to (a one-byte None value is a ~200-byte ``Value``).

Where the two runtimes refuse at different times, said per test: the native loader checks
every kernel's written arguments at load (the lean one, native kernels' only), and a
portable C++ kernel checks its parameters when it runs (the lean one binds at load).
Needs a C++ compiler, CMake and Ninja; no torch.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import opforge.program as P
from opforge.errors import KernelError, ProgramError
from opforge.examples.my_ops import manifest_path
from opforge.native import build_library
from opforge.program._sample import (
    growing_program, reseal, sample_program, symbolic_program, unverified_bytes,
)
from opforge.runtime import load

from tests.native.test_native_hostile_programs import _minmax, _unary
from tests.pure import test_kernels_window_bounds as WB
from tests.pure import test_program_debug_table as DT
from tests.pure import test_program_symbolic as SY
from tests.pure import test_runtime_memory_limits as ML

EXECUTORS = ("lean", "native")
F32 = P.ScalarType.FLOAT32


@pytest.fixture(scope="module")
def my_ops(tmp_path_factory):
    kernels = sorted((manifest_path().parent / "kernels").glob("*.cpp"))
    out = tmp_path_factory.mktemp("my_ops") / "libmy_ops.so"
    return str(build_library(manifest_path(), kernels, out).path)


def _load(source, executor: str, kernels=(), **options):
    if executor == "native":
        return load(source, executor="native", kernels=list(kernels), **options)
    return load(source, kernels=list(kernels), **options)


def _subject(error: Exception) -> str:
    """The field a message names (after the API prefixes, before ' — ')."""
    return str(error).split("`: ")[-1].split(" — ")[0]


def _both_refuse(source, error=ProgramError, kernels=(), call=None, **options) -> list[str]:
    """Each runtime refuses ``source`` (at load, or at ``call(loaded)``) with ``error``;
    the two messages."""
    messages = []
    for executor in EXECUTORS:
        with pytest.raises(error) as info:
            loaded = _load(source, executor, kernels, **options)
            if call is not None:
                call(loaded)
        messages.append(str(info.value))
    return messages


# --- tests/native/test_native_hostile_programs.py -------------------------------------------

@pytest.mark.parametrize("op", ["my_ops::mul3", "my_ops::mul4", "aten::relu"])
@pytest.mark.parametrize("source", ["path", "bytes", "program"])
def test_output_in_a_constant_is_refused_at_load(my_ops, tmp_path, op, source):
    # aten::relu: a portable kernel; the lean runtime leaves it to NumPy's read-only views
    # (refused when the call writes), the native loader refuses it at load like a native one
    program = _unary(op, (4,), (4,), output_constant=True)
    data = P.to_bytes(program)
    frozen = bytes(data)
    if source == "path":
        P.save(program, tmp_path / "p.opf")
    given = tmp_path / "p.opf" if source == "path" else data if source == "bytes" else program
    with pytest.raises(ProgramError, match="constant tensor, where the kernel writes"):
        _load(given, "native", [my_ops])
    if op != "aten::relu":
        with pytest.raises(ProgramError, match="constant tensor, where the kernel writes"):
            _load(given, "lean", [my_ops])
    else:
        with pytest.raises((KernelError, ValueError), match="read-only"):
            _load(given, "lean", [my_ops]).method()(np.ones(4, np.float32))
    assert data == frozen  # the caller's bytes are untouched


@pytest.mark.parametrize("op", ["my_ops::mul3", "my_ops::mul4"])
@pytest.mark.parametrize("shapes", [((2**22,), (4,)), ((4,), (2**20,)), ((2, 3), (3, 2)),
                                    ((6,), (2, 3))])
def test_elementwise_output_of_another_shape_is_refused(my_ops, op, shapes):
    input_shape, output_shape = shapes
    x = np.ones(input_shape, np.float32)
    for message in _both_refuse(_unary(op, input_shape, output_shape), KernelError, [my_ops],
                                call=lambda loaded: loaded.method()(x)):
        assert "first input's shape" in message


def test_elementwise_output_of_another_dtype_is_refused(my_ops):
    program = _unary("my_ops::mul4", (8,), (8,))
    m = program.methods[0]
    out = dataclasses.replace(m.values[1], dtype=P.ScalarType.FLOAT64)
    bad = dataclasses.replace(program, methods=(dataclasses.replace(
        m, values=(m.values[0], out)),))
    x = np.ones(8, np.float32)
    for message in _both_refuse(bad, KernelError, [my_ops],
                                call=lambda loaded: loaded.method()(x)):
        assert "first input's dtype" in message


def test_elementwise_same_shape_runs_the_same(my_ops):
    x = np.arange(15, dtype=np.float32).reshape(5, 3)
    for op, factor in (("my_ops::mul3", 3), ("my_ops::mul4", 4)):
        outs = [_load(_unary(op, (5, 3), (5, 3)), e, [my_ops]).method()(x)[0] for e in EXECUTORS]
        np.testing.assert_array_equal(outs[0], outs[1])  # the same kernel: bit for bit
        np.testing.assert_array_equal(outs[1], x * factor)


@pytest.mark.parametrize("input_shape, out_shape, dim", [
    ((2, 3), (100,), 0), ((2, 3), (4,), 0), ((2, 3), (2,), 0), ((4, 5, 6), (4, 7), 1),
    ((4, 5, 6), (5, 6), 1),
])
def test_minmax_outputs_of_the_wrong_shape_are_refused(my_ops, input_shape, out_shape, dim):
    x = np.ones(input_shape, np.float32)
    for message in _both_refuse(_minmax(input_shape, out_shape, dim), KernelError, [my_ops],
                                call=lambda loaded: loaded.method()(x)):
        assert "input's shape without dim" in message


def test_minmax_right_shape_runs_the_same(my_ops):
    x = np.random.default_rng(0).standard_normal((4, 5, 6)).astype(np.float32)
    lean, native = (_load(_minmax((4, 5, 6), (4, 6), 1), e, [my_ops]).method()(x)
                    for e in EXECUTORS)
    for a, b in zip(lean, native):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(native[0], x.min(1))


def test_a_fifo_as_a_kernel_library_is_refused_without_blocking(native_runtime, tmp_path):
    fifo = tmp_path / "lib.so"
    os.mkfifo(fifo)
    code = ("from opforge.runtime import load\n"
            "from opforge.program._sample import sample_program\n"
            f"load(sample_program(), executor='native', kernels=[{str(fifo)!r}])\n")
    env = dict(os.environ, OPFORGE_RUNTIME_LIBRARY=str(native_runtime.runtime_library))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env=env)
    assert done.returncode == 1
    assert "BuildError" in done.stderr and "not a regular file" in done.stderr, done.stderr


# --- tests/pure/test_runtime_memory_limits.py ----------------------------------------------

def test_an_arena_larger_than_its_tensors_is_refused_naming_the_same_field():
    data = ML._with_arena_size(ML._program((4096,), (0, 0), (0, 64)), 4096, 1 << 30)
    lean, native = _both_refuse(data)
    assert _subject(native) == _subject(lean) == "method 'forward' memory_plan.arena_sizes[0]"
    assert "found 1073741824 bytes" in native


@pytest.mark.parametrize("arena, placements, sizes, ok", [
    (10_112, ((0, 0), (0, 64)), (2500,), True), (10_113, ((0, 0), (0, 64)), (2500,), False),
    (1 << 40, ((0, 0), (0, 64)), (2500,), False), (12_288, ((0, 0), (0, 0)), (2500,), True),
    (12_352, ((0, 0), (0, 0)), (2500,), False), (8192, ((0, 0), (0, 64)), (4,), False),
])
def test_the_arena_bound_is_the_same(arena, placements, sizes, ok):
    data = unverified_bytes(ML._program((arena,), *placements, sizes=sizes))
    if ok:
        x = -np.arange(sizes[0], dtype=np.float32)
        outs = [_load(data, e).method()(x)[0] for e in EXECUTORS]
        np.testing.assert_array_equal(outs[0], outs[1])
    else:
        lean, native = _both_refuse(data)
        assert _subject(native) == _subject(lean)


def test_a_tiny_file_asking_for_a_terabyte_is_refused_at_load():
    data = P.to_bytes(ML._huge(1 << 40))
    lean, native = _both_refuse(data)
    for message in (lean, native):
        assert "method 'forward' memory plan (1 arena(s)) — needs 1099511627840 bytes (1.0 TiB)" \
            in message
    assert "at most the memory limit, 8589934592 bytes (8.0 GiB)" in native


def test_over_the_limit_is_refused_and_under_it_runs():
    program = ML._huge(2 << 20)
    for message in _both_refuse(program, max_memory=1 << 20):
        assert "needs 2097216 bytes" in message and "memory limit, 1048576 bytes" in message
    x = np.arange(2 << 18, dtype=np.float32)
    outs = [_load(program, e, max_memory=4 << 20).method()(x)[0] for e in EXECUTORS]
    np.testing.assert_array_equal(outs[0], outs[1])


@pytest.mark.parametrize("bad", [0, -1, 1.5, "8G", True])
def test_a_bad_max_memory_is_a_program_error(bad):
    for message in _both_refuse(ML._huge(64), max_memory=bad):
        assert "max_memory — found" in message


def test_an_empty_tensor_whose_other_sizes_overflow_is_refused_at_read():
    # the file of sizes (1, 2**20, 0, 5), patched to (1, 2**62 + 4, 0, 5) (no constructor
    # takes them): Python refuses them at read, so must the native reader
    x = P.TensorValue(P.ScalarType.INT64, (1, 2**20, 0, 5), storage=P.ArenaStorage(0, 0))
    program = P.Program(methods=(P.Method("forward", (x,), (0,), (0,), (),
                                          memory_plan=P.MemoryPlan((64,))),))
    data = P.to_bytes(program)
    old, new = (2**20).to_bytes(8, "little"), (2**62 + 4).to_bytes(8, "little")
    assert data.count(old) == 1
    lean, native = _both_refuse(reseal(data.replace(old, new)))
    assert "zero sizes counted as 1" in lean and "zero sizes counted as 1" in native


# --- tests/pure/test_kernels_window_bounds.py ----------------------------------------------
# The lean runtime binds convolution and pooling at load (its binder refuses); the portable
# C++ kernels check the same parameters when they run: the native runtime refuses the call.

def _window_refused(program, key: str, inputs) -> None:
    with pytest.raises(KernelError, match=rf"{key}.*cannot bind"):
        _load(program, "lean").method()
    native = _load(program, "native").method()
    for _ in range(2):  # a second call is refused the same way (nothing half-bound)
        with pytest.raises(KernelError, match=rf"instruction 0 \({key}"):
            native(*inputs)


@pytest.mark.parametrize("padding, dilation, stride", [
    ((WB.BIG, WB.BIG), (1, 1), (1, 1)), ((0, 0), (WB.BIG, WB.BIG), (1, 1)),
    ((WB.BIG, 0), (1, 1), (2 * WB.BIG, 1)), ((0, 0), (1, 1), (0, 1)), ((-1, 0), (1, 1), (1, 1)),
])
def test_hostile_convolution_parameters_are_refused(padding, dilation, stride):
    inputs = (np.ones((1, 1, 4, 4), np.float32), np.ones((1, 1, 3, 3), np.float32))
    program = WB._conv_program(padding, dilation, stride)
    if padding == (-1, 0) or stride == (0, 1):  # refused by the Python value check at bind
        with pytest.raises(KernelError, match=r"aten::convolution\.out"):
            _load(program, "lean").method()
        with pytest.raises(KernelError, match=r"aten::convolution\.out"):
            _load(program, "native").method()(*inputs)
        return
    _window_refused(program, r"aten::convolution\.out", inputs)


@pytest.mark.parametrize("padding, dilation", [((WB.BIG, WB.BIG), (1, 1)),
                                               ((0, 0), (WB.BIG, WB.BIG)), ((0, 0), (0, 1))])
def test_hostile_max_pool_parameters_are_refused(padding, dilation):
    _window_refused(WB._pool_program(padding, dilation), r"aten::max_pool2d_with_indices\.out",
                    (np.ones((1, 1, 4, 4), np.float32),))


def test_a_sane_window_program_runs_the_same():
    x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    w = np.ones((1, 1, 3, 3), np.float32)
    for program, inputs in ((WB._conv_program((0, 0), (1, 1)), (x, w)),
                            (WB._pool_program((0, 0), (1, 1)), (x,))):
        lean, native = (_load(program, e).method()(*inputs)[0] for e in EXECUTORS)
        np.testing.assert_array_equal(lean, native)  # integers in float32: exact


def test_convolution_groups_past_int32_are_refused():
    # fuzz/exec_fuzz.py's finding in the lean runtime (a 13.5 TiB columns buffer)
    program = WB._conv_program((0, 0), (1, 1))
    m = program.methods[0]
    values = m.values[:8] + (P.IntValue(2**31),) + m.values[9:]
    bad = dataclasses.replace(program, methods=(dataclasses.replace(m, values=values),))
    inputs = (np.ones((1, 1, 4, 4), np.float32), np.ones((1, 1, 3, 3), np.float32))
    with pytest.raises(KernelError, match=r"aten::convolution\.out"):
        _load(bad, "lean").method()(*inputs)
    with pytest.raises(KernelError, match=r"aten::convolution\.out"):
        _load(bad, "native").method()(*inputs)


# --- tests/pure/test_program_symbolic.py ---------------------------------------------------

@pytest.mark.parametrize("change", [
    dict(exprs=("s1",)), dict(exprs=("(s0 + 1)",)), dict(exprs=("floordiv(8, (s0 - 1))",)),
    dict(exprs=("(s0 * 9223372036854775807)",), sizes=(8,)),
    dict(symbols=(P.Symbol("s0", 1, 8), P.Symbol("s0", 1, 4))),
    dict(exprs=("(s0 * s0)",), sizes=(64,)),
], ids=["undeclared", "past-sizes", "zero-divisor", "int64", "symbol-twice", "unbound"])
def test_hostile_expressions_are_refused_naming_the_same_field(change):
    lean, native = _both_refuse(unverified_bytes(SY._dynamic_abs(**change)))
    assert _subject(native) == _subject(lean)


@pytest.mark.parametrize("old, new", [
    (b"(2 * s)", b"(2 / s)"), (b"(2 * s)", b"(2 * t)"), (b"(2 * s)", b"(2  *s)"),
    (b"mod(s, 16)", b"mod(s, 00)"), (b"mod(s, 16)", b"mod(s, -1)"),
])
def test_hostile_expression_text_is_refused_naming_the_same_field(old, new):
    lean, native = _both_refuse(SY._file_with(old, new))
    assert _subject(native) == _subject(lean)


def test_a_version_3_table_in_an_older_file_is_refused():
    data = bytearray(P.to_bytes(symbolic_program()))
    data[8:12] = (2).to_bytes(4, "little")
    _both_refuse(reseal(bytes(data)))


def test_a_hostile_growing_symbol_index_is_refused():
    data = bytearray(P.to_bytes(growing_program()))
    at = bytes(data).rindex((1).to_bytes(4, "little") + (0).to_bytes(4, "little"))
    data[at + 4:at + 8] = (7).to_bytes(4, "little")
    for message in _both_refuse(reseal(bytes(data))):
        assert "growing symbol — found index 7" in message


def test_state_rules_are_the_same():
    program = SY._state_program()
    m = program.methods[0]
    fields = {f: getattr(m, f) for f in ("name", "values", "inputs", "outputs", "operators",
                                         "memory_plan")}
    not_constant = P.Program(methods=(P.Method(**fields, instructions=m.instructions[:1],
                                               state=(P.StateSlot("count", 1),)),),
                             segments=program.segments)
    into_constant = P.Program(methods=(P.Method(**fields, instructions=m.instructions),),
                              segments=program.segments)
    other = program.methods[1]
    values = (P.TensorValue(P.ScalarType.INT32, (1,), storage=P.ConstantStorage(0, 0)),
              *other.values[1:])
    mixed = P.Program(methods=(m, dataclasses.replace(other, values=values)),
                      segments=program.segments)
    for bad in (not_constant, into_constant, mixed):
        lean, native = _both_refuse(unverified_bytes(bad))
        assert _subject(native) == _subject(lean)


def test_guards_and_bounds_are_checked_per_call():
    guard = P.Guard(P.SizeExpr.parse("mod(s0, 2)"), "==", P.SizeExpr.const(0))
    program = SY._dynamic_abs(guards=(guard,))
    for executor in EXECUTORS:
        forward = _load(program, executor).method()
        assert forward(np.ones(4, np.float32))[0].shape == (4,)
        for bad in (3, 9, 0):  # the guard broken; past the symbol's range; below it
            with pytest.raises(ProgramError):
                forward(np.ones(bad, np.float32))
        assert forward(-np.ones(2, np.float32))[0].tolist() == [1.0, 1.0]  # still usable


def test_many_shapes_rebind_the_same():
    program = SY._dynamic_abs(symbols=(P.Symbol("s0", 1, 64),), sizes=(64,))
    forward = _load(program, "native").method()
    for n in list(range(1, 40)) + [1, 2, 64]:
        assert forward(-np.ones(n, np.float32))[0].tolist() == [1.0] * n


def test_state_is_shared_reset_and_refused_the_same():
    program = SY._state_program()
    for executor in EXECUTORS:
        loaded = _load(program, executor)
        forward, other = loaded.method("forward"), loaded.method("other")
        assert forward(np.ones(1, np.float32))[0].tolist() == [6.0]
        assert other(np.ones(1, np.float32))[0].tolist() == [7.0]
        loaded.reset_state()
        assert loaded.read_state("count").tolist() == [5.0]
        with pytest.raises(ProgramError):
            loaded.write_state("count", np.zeros(2))
        with pytest.raises(ProgramError):
            loaded.read_state("nope")


# --- tests/pure/test_program_debug_table.py ------------------------------------------------

@pytest.mark.parametrize("table", DT.HOSTILE, ids=range(len(DT.HOSTILE)))
@pytest.mark.parametrize("others", [(), (("author", "someone"),)])
def test_a_hostile_debug_table_is_refused_at_load(table, others):
    program = dataclasses.replace(sample_program(),
                                  user_metadata=(*others, ("opforge.debug", table)))
    for message in _both_refuse(unverified_bytes(program)):
        assert "opforge.debug" in message


def test_other_metadata_is_not_read_as_a_debug_table():
    import ctypes

    from opforge.runtime.native_capi import runtime_library

    program = dataclasses.replace(sample_program(), user_metadata=(("notes", "not json ["),))
    data = unverified_bytes(program)
    verify = runtime_library().opf_program_verify
    verify.argtypes, verify.restype = [ctypes.c_char_p, ctypes.c_size_t], ctypes.c_int32
    assert verify(data, len(data)) == 0  # OPF_OK
    P.from_bytes(data)


# --- what fuzz/native_exec_fuzz.py found ---------------------------------------------------

def test_a_static_output_has_its_bounds_shape_not_the_export_example():
    # a symbol whose range is one value: the output is static at that size, whatever the
    # value's sizes (the export example) say; the binding reshaped to the example (a raw
    # ValueError: cannot reshape array of size 3 into shape (8,))
    program = SY._dynamic_abs(symbols=(P.Symbol("s0", 3, 3),), sizes=(8,))
    x = -np.arange(3, dtype=np.float32)
    lean, native = (_load(unverified_bytes(program), e).method()(x)[0] for e in EXECUTORS)
    assert native.shape == lean.shape == (3,)
    np.testing.assert_array_equal(native, lean)


def _overlapping_move(n: int = 64) -> P.Program:
    """A hostile placement: y's bytes start inside x's, and x moves into y. The copy
    kernel's memcpy had overlapping arguments (undefined; ASan: memcpy-param-overlap)."""
    x = P.TensorValue(F32, (n,), storage=P.ArenaStorage(0, 0))
    y = P.TensorValue(F32, (n,), storage=P.ArenaStorage(0, 64))
    return P.Program(methods=(P.Method("forward", (x, y), (0,), (1,), (P.Move(0, 1),),
                                       memory_plan=P.MemoryPlan((64 + 4 * n,))),))


def test_a_move_between_overlapping_tensors_copies_like_numpy():
    # memmove now: it copies as NumPy's assignment does
    data = unverified_bytes(_overlapping_move())
    given = np.arange(64, dtype=np.float32)
    lean, native = (_load(data, e).method()(given)[0] for e in EXECUTORS)
    np.testing.assert_array_equal(native, lean)
    np.testing.assert_array_equal(native, given)


def _bool_relu() -> P.Program:
    """relu of a bool constant holding bytes 0, 1, 192, 2 (a hostile file: any byte) into
    float32: the elementwise loop read them in place as C++ bool (UBSan: load of value 192,
    not a valid value for type 'bool'; a float of 192 came out)."""
    x = P.TensorValue(P.ScalarType.BOOL, (4,), storage=P.ConstantStorage(0, 0))
    y = P.TensorValue(F32, (4,), storage=P.ArenaStorage(0, 0))
    method = P.Method("forward", (x, y), (), (1,), (P.KernelCall(0, (0, 1)),),
                      (P.Operator("aten::relu", "out"),), P.MemoryPlan((64,)))
    return P.Program(methods=(method,), segments=(P.Segment(bytes([0, 1, 192, 2])),))


def test_a_bool_constant_holding_other_bytes_reads_as_true():
    lean, native = (_load(unverified_bytes(_bool_relu()), e).method()()[0] for e in EXECUTORS)
    np.testing.assert_array_equal(native, lean)
    assert native.tolist() == [0.0, 1.0, 1.0, 1.0]



def _bool_to_copy() -> P.Program:
    """_to_copy of the same bool constant into float32: the copy kernel's dtype conversion
    read each byte as C++ bool (UBSan: load of value 192, the one finding of
    fuzz/native_exec_fuzz.py's 100,000 cases; the worker then hung)."""
    x = P.TensorValue(P.ScalarType.BOOL, (4,), storage=P.ConstantStorage(0, 0))
    y = P.TensorValue(F32, (4,), storage=P.ArenaStorage(0, 0))
    method = P.Method("forward", (x, P.BoolValue(False), P.NoneValue(), y), (), (3,),
                      (P.KernelCall(0, (0, 1, 2, 3)),), (P.Operator("aten::_to_copy", "out"),),
                      P.MemoryPlan((64,)))
    return P.Program(methods=(method,), segments=(P.Segment(bytes([0, 1, 192, 2])),))


def test_a_bool_constant_holding_other_bytes_converts_as_true():
    lean, native = (_load(unverified_bytes(_bool_to_copy()), e).method()()[0] for e in EXECUTORS)
    np.testing.assert_array_equal(native, lean)
    assert native.tolist() == [0.0, 1.0, 1.0, 1.0]

def _huge_groups() -> P.Program:
    """A convolution whose groups is 2**63 - 1: weight C_in * groups overflowed int64
    (UBSan: signed integer overflow in the channel check)."""
    x = P.TensorValue(F32, (1, 3, 8, 8), storage=P.ArenaStorage(0, 0))
    w = P.TensorValue(F32, (4, 3, 3, 3), storage=P.ArenaStorage(0, 768))
    out = P.TensorValue(F32, (1, 4, 6, 6), storage=P.ArenaStorage(0, 1216))
    values = (x, w, P.NoneValue(), P.IntListValue((1, 1)), P.IntListValue((0, 0)),
              P.IntListValue((1, 1)), P.BoolValue(False), P.IntListValue((0, 0)),
              P.IntValue(2**63 - 1), out)
    method = P.Method("forward", values, (0, 1), (9,), (P.KernelCall(0, tuple(range(10))),),
                      (P.Operator("aten::convolution", "out"),), P.MemoryPlan((1856,)))
    return P.Program(methods=(method,))


def test_convolution_groups_near_int64_max_are_refused():
    inputs = (np.ones((1, 3, 8, 8), np.float32), np.ones((4, 3, 3, 3), np.float32))
    for message in _both_refuse(unverified_bytes(_huge_groups()), KernelError,
                                call=lambda loaded: loaded.method()(*inputs)):
        assert "channels" in message


def _huge_stride_pool(dilation: int, ceil_mode: bool) -> P.Program:
    """max_pool2d with stride 2**63 - 1: the output-size arithmetic overflowed int64 (UBSan:
    span + stride - 1 with ceil_mode; -num + stride - 1 for a window past the input)."""
    program = WB._pool_program((0, 0), (dilation, dilation))
    m = program.methods[0]
    values = (m.values[:2] + (P.IntListValue((2**63 - 1, 2**63 - 1)),) + m.values[3:5]
              + (P.BoolValue(ceil_mode),) + m.values[6:])
    return dataclasses.replace(program, methods=(dataclasses.replace(m, values=values),))


@pytest.mark.parametrize("dilation, ceil_mode", [(1, True), (2**62, False)])
def test_pooling_with_a_stride_near_int64_max_is_refused(dilation, ceil_mode):
    data = unverified_bytes(_huge_stride_pool(dilation, ceil_mode))
    with pytest.raises(KernelError, match=r"max_pool2d_with_indices"):
        _load(data, "lean").method()(np.ones((1, 1, 4, 4), np.float32))
    with pytest.raises(KernelError, match=r"max_pool2d_with_indices"):
        _load(data, "native").method()(np.ones((1, 1, 4, 4), np.float32))


@pytest.mark.slow
def test_the_fuzzers_findings_run_clean_under_asan_and_ubsan(my_ops, tmp_path):
    """Each program above that fuzz/native_exec_fuzz.py found, through its sanitized worker
    (the ASan+UBSan build, libasan preloaded): ran or refused, no finding. Slow only the
    first time (the sanitizer variant's build takes minutes)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "fuzz"))
    import native_exec_fuzz as NX

    programs = [_bool_relu(), _bool_to_copy(), _huge_groups(), _overlapping_move(), _huge_stride_pool(1, True),
                _huge_stride_pool(2**62, False),
                SY._dynamic_abs(symbols=(P.Symbol("s0", 3, 3),), sizes=(8,))]
    log = tmp_path / "logs"
    pool = NX.NativePool(my_ops, [], log, 1, NX.sanitized_environment(log))
    try:
        for n, program in enumerate(programs):
            outcome, _ = pool.ask(unverified_bytes(program), n, 120)
            assert not outcome.startswith("finding"), (n, outcome)
    finally:
        pool.close()


# --- the memory a file's tables expand to ----------------------------------------------------

def _many_values(n: int) -> bytes:
    """forward(x) -> x with ``n`` None values besides: n + ~150 bytes of file."""
    x = P.TensorValue(F32, (4,), storage=P.ArenaStorage(0, 0))
    return P.to_bytes(P.Program(methods=(P.Method(
        "forward", (x,) + (P.NoneValue(),) * n, (0,), (0,), (), memory_plan=P.MemoryPlan((64,))),)))


def test_a_file_of_very_many_values_is_held_to_the_memory_limit():
    # 200,000 one-byte values: ~200 KB of file, ~40 MB of Value tables in memory (and as much
    # again per method instance) — refused under a 16 MiB limit before the tables are made
    data = _many_values(200_000)
    assert len(data) < 210_000
    with pytest.raises(ProgramError) as info:
        _load(data, "native", max_memory=16 << 20)
    message = str(info.value)
    assert "decoded tables" in message and "bytes in memory with 200001 values" in message
    assert "at most the memory limit, 16777216 bytes" in message and "max_memory" in message
    # the instance's own tables are held to the limit too (a Value table that fits)
    # (~280 bytes per value: 56 MB here, over 48 MiB)
    with pytest.raises(ProgramError, match=r"instance tables \(200001 values, 0 instructions\)"):
        _load(data, "native", max_memory=48 << 20)
    # under a limit that holds both, it loads and runs
    forward = _load(data, "native", max_memory=1 << 30).method()
    assert forward(np.ones(4, np.float32))[0].tolist() == [1.0] * 4
