"""Size expressions, symbols, guards and state in the program format (no torch)."""

from __future__ import annotations

import numpy as np
import pytest

from opforge.errors import ProgramError
from opforge.program import (
    ArenaStorage, ConstantStorage, Guard, IntListValue, KernelCall, MemoryPlan, Method, Move,
    Operator, Program, ScalarType, Segment, SizeExpr, StateSlot, Symbol, SymbolicValue,
    TensorValue, from_bytes, to_bytes, verify,
)
from opforge.program.symbolic import MAX_EXPR_DEPTH, linear_form
from opforge.runtime import load

F32 = ScalarType.FLOAT32


@pytest.mark.parametrize("text", [
    "7", "-3", "s0", "(s0 + 1)", "(s0 - 1)", "((2 * s0) + 1)", "floordiv(s0, 2)",
    "mod((s0 * s1), 3)", "max(min(s0, 4), s1)", "((s0 * s0) + -1)",
])
def test_parse_print_round_trip(text):
    assert str(SizeExpr.parse(text)) == text


@pytest.mark.parametrize("text", [
    "", "s0 +", "(s0 + 1", "(s0 / 2)", "pow(s0, 2)", "s0 + 1", "((s0 + 1))", "1e3",
    "(" * 40 + "s0" + " + 1)" * 40, "9" * 30, "x" * 2000,
])
def test_parse_refuses_non_canonical_or_hostile_text(text):
    with pytest.raises(ProgramError):
        SizeExpr.parse(text)


def test_depth_cap_holds_for_constructed_trees():
    e = SizeExpr.sym("s0")
    with pytest.raises(ProgramError, match="depth"):
        for _ in range(MAX_EXPR_DEPTH + 1):
            e = SizeExpr("+", (e, SizeExpr.const(1)))


def test_evaluate_and_bounds():
    e = SizeExpr.parse("max(floordiv(((2 * s0) + 1), 3), mod(s1, 4))")
    assert e.evaluate({"s0": 5, "s1": 7}) == 3
    assert e.bounds({"s0": (1, 8), "s1": (0, 9)}) == (1, 5)
    with pytest.raises(ZeroDivisionError):
        SizeExpr.parse("floordiv(s0, s1)").bounds({"s0": (1, 2), "s1": (0, 3)})


def test_linear_form():
    assert linear_form(SizeExpr.parse("((2 * s0) + 1)")) == ("s0", 2, 1)
    assert linear_form(SizeExpr.parse("(s0 - 1)")) == ("s0", 1, -1)
    assert linear_form(SizeExpr.parse("(s0 * s1)")) is None


def _dynamic_abs(exprs=("s0",), symbols=(Symbol("s0", 1, 8),), guards=(), sizes=(8,)):
    slot = -(-sizes[0] * 4 // 64) * 64
    x = TensorValue(F32, sizes, storage=ArenaStorage(0, 0))
    y = TensorValue(F32, sizes, storage=ArenaStorage(0, slot))
    sym = tuple(SymbolicValue(i, tuple(SizeExpr.parse(e) for e in exprs)) for i in (0, 1))
    method = Method("forward", (x, y), (0,), (1,), (KernelCall(0, (0, 1)),),
                    (Operator("aten::abs", "out"),), MemoryPlan((2 * slot,)), symbols=symbols,
                    symbolic_values=sym, guards=guards)
    return Program(methods=(method,))


def test_dynamic_program_round_trips_as_version_3_and_runs_at_each_size():
    program = _dynamic_abs()
    data = to_bytes(program)
    assert int.from_bytes(data[8:12], "little") == 3
    loaded = from_bytes(data)
    assert loaded == program
    forward = load(loaded).method("forward")
    for n in (1, 2, 5, 8, 3):
        x = -np.arange(n, dtype=np.float32)
        (y,) = forward(x)
        assert y.shape == (n,) and y.tolist() == list(range(n))
    with pytest.raises(ProgramError, match=r"input 0 dimension 0 — found size 9 .*s0 in \[1, 8\]"):
        forward(np.zeros(9, np.float32))
    with pytest.raises(ProgramError, match="found size 0"):
        forward(np.zeros(0, np.float32))


def test_guards_are_checked_per_call():
    program = _dynamic_abs(guards=(Guard(SizeExpr.parse("mod(s0, 2)"), "==", SizeExpr.const(0)),))
    forward = load(program).method("forward")
    assert forward(np.ones(4, np.float32))[0].shape == (4,)
    with pytest.raises(ProgramError, match=r"break the guard mod\(s0, 2\) == 0"):
        forward(np.ones(3, np.float32))


def test_shape_cache_is_bounded_and_rebinds_after_eviction():
    program = _dynamic_abs(symbols=(Symbol("s0", 1, 64),), sizes=(64,))
    forward = load(program).method("forward")
    forward.SHAPE_CACHE_SIZE = 4
    for n in list(range(1, 10)) + [1, 2]:
        assert forward(-np.ones(n, np.float32))[0].tolist() == [1.0] * n
    assert len(forward._shapes) == 4


@pytest.mark.parametrize("change, needle", [
    (dict(exprs=("s1",)), "undeclared symbol"),
    (dict(exprs=("(s0 + 1)",)), "sizes in [0, 8]"),
    (dict(exprs=("floordiv(8, (s0 - 1))",)), "can be zero"),
    (dict(exprs=("(s0 * 9223372036854775807)",), sizes=(8,)), "int64"),
    (dict(symbols=(Symbol("s0", 1, 8), Symbol("s0", 1, 4))), "a second time"),
    (dict(exprs=("(s0 * s0)",), sizes=(64,)), "bound by no input dimension"),
])
def test_verifier_refuses_hostile_expressions(change, needle):
    with pytest.raises(ProgramError, match=None) as info:
        verify(_dynamic_abs(**change))
    assert needle in str(info.value)


def _state_program(name_b="count"):
    init = Segment(np.array([5.0], np.float32).tobytes())
    values = (
        TensorValue(F32, (1,), storage=ConstantStorage(0, 0)),  # state's initial value
        TensorValue(F32, (1,), storage=ArenaStorage(0, 0)),  # input
        TensorValue(F32, (1,), storage=ArenaStorage(0, 64)),  # new state = state + input
    )
    add = KernelCall(0, (0, 1, 3, 2))
    from opforge.program import DoubleValue
    values = values + (DoubleValue(1.0),)
    def method(name, state_name):
        return Method(name, values, (1,), (2,), (add, Move(2, 0)),
                      (Operator("aten::add", "out"),), MemoryPlan((128,)),
                      state=(StateSlot(state_name, 0),))
    return Program(methods=(method("forward", "count"), method("other", name_b)),
                   segments=(init,))


def test_state_is_shared_by_name_across_methods_and_resettable():
    program = from_bytes(to_bytes(_state_program()))
    loaded = load(program)
    forward, other = loaded.method("forward"), loaded.method("other")
    assert forward(np.ones(1, np.float32))[0].tolist() == [6.0]
    assert other(np.ones(1, np.float32))[0].tolist() == [7.0]
    assert loaded.read_state("count").tolist() == [7.0]
    loaded.write_state("count", np.array([1.0], np.float32))
    assert forward(np.ones(1, np.float32))[0].tolist() == [2.0]
    loaded.reset_state()
    assert loaded.read_state("count").tolist() == [5.0]
    with pytest.raises(ProgramError, match="valid: float32 of shape"):
        loaded.write_state("count", np.zeros(2))
    with pytest.raises(ProgramError, match="not in"):
        loaded.read_state("nope")
    # a second load has its own live copy
    assert load(program).read_state("count").tolist() == [5.0]


def test_state_must_be_a_constant_and_moves_into_other_constants_are_refused():
    program = _state_program()
    fields = {f: getattr(program.methods[0], f) for f in (
        "name", "values", "inputs", "outputs", "operators", "memory_plan")}
    bad = Method(**fields, instructions=program.methods[0].instructions[:1],
                 state=(StateSlot("count", 1),))
    with pytest.raises(ProgramError, match="constant TensorValue"):
        verify(Program(methods=(bad,), segments=program.segments))
    no_state = Method(**fields, instructions=program.methods[0].instructions)
    with pytest.raises(ProgramError, match="a constant tensor"):
        verify(Program(methods=(no_state,), segments=program.segments))


def _file_with(text_from: bytes, text_to: bytes) -> bytes:
    from opforge.program._sample import reseal, symbolic_program

    data = to_bytes(symbolic_program())
    assert text_from in data and len(text_from) == len(text_to)
    return reseal(data.replace(text_from, text_to, 1))


@pytest.mark.parametrize("old, new, needle", [
    (b"(2 * s)", b"(2 / s)", "expected + - or *"),
    (b"(2 * s)", b"(2 * t)", "undeclared symbol"),
    (b"(2 * s)", b"(2  *s)", "canonical form"),
    (b"mod(s, 16)", b"mod(s, 00)", "canonical form"),
    (b"mod(s, 16)", b"mod(s, -1)", "can be zero"),
])
def test_loader_refuses_hostile_expression_text(old, new, needle):
    with pytest.raises(ProgramError) as info:
        from_bytes(_file_with(old, new))
    assert needle in str(info.value)


def test_a_version_3_table_in_an_older_file_is_refused():
    from opforge.program._sample import reseal, symbolic_program

    data = bytearray(to_bytes(symbolic_program()))
    data[8:12] = (2).to_bytes(4, "little")
    with pytest.raises(ProgramError):
        from_bytes(reseal(bytes(data)))


def test_sample_symbolic_program_runs_with_state():
    from opforge.program._sample import symbolic_program

    loaded = load(from_bytes(to_bytes(symbolic_program())))
    forward = loaded.method("forward")
    (y,) = forward(-np.arange(3, dtype=np.float32), np.zeros(6, np.float32))
    assert y.tolist() == [0.0, 1.0, 2.0]
    with pytest.raises(ProgramError, match=r"input 1 dimension 0 — found size 5 — valid: \(2 \* s\) = 6"):
        forward(np.zeros(3, np.float32), np.zeros(5, np.float32))


def test_growing_program_round_trips_as_version_4_and_grows_when_called():
    from opforge.program._sample import growing_program

    program = growing_program()
    data = to_bytes(program)
    assert int.from_bytes(data[8:12], "little") == 4
    assert from_bytes(data) == program
    forward = load(from_bytes(data)).method("forward")
    for n in (1, 4, 9, 1000, 3):
        x = -np.arange(n, dtype=np.float32)
        y, z = forward(x, -np.ones(3, np.float32))
        assert y.tolist() == (-x).tolist() and z.tolist() == [1.0, 1.0, 1.0]
    assert forward.memory_growths == 2 and forward.growing_bytes >= 2 * 4000


def test_verifier_refuses_unplanned_tensors_without_a_growing_symbol():
    import dataclasses

    from opforge.program._sample import growing_program

    program = growing_program()
    method = program.methods[0]
    fixed = dataclasses.replace(method, symbols=(Symbol("s", 1, 2**31 - 1),))
    with pytest.raises(ProgramError, match="storage"):
        verify(Program(methods=(fixed,)))


def test_loader_refuses_a_hostile_growing_symbol_index():
    from opforge.program._sample import growing_program, reseal

    data = bytearray(to_bytes(growing_program()))
    # the growing list is the method's last field: u32 count 1, u32 index 0
    at = bytes(data).rindex((1).to_bytes(4, "little") + (0).to_bytes(4, "little"))
    data[at + 4:at + 8] = (7).to_bytes(4, "little")
    with pytest.raises(ProgramError, match="growing symbol — found index 7"):
        from_bytes(reseal(data))


def test_methods_sharing_a_state_name_must_agree_on_its_dtype_and_size():
    # "count" is float32 [1] in forward; other's int32 [1] over the same 4 bytes is refused
    program = _state_program()
    other = program.methods[1]
    values = (TensorValue(ScalarType.INT32, (1,), storage=ConstantStorage(0, 0)),
              *other.values[1:])
    fields = {f: getattr(other, f) for f in (
        "name", "inputs", "outputs", "instructions", "operators", "memory_plan", "state")}
    mixed = Program(methods=(program.methods[0], Method(**fields, values=values)),
                    segments=program.segments)
    with pytest.raises(ProgramError, match="state 'count'.*int32\\[1\\], but method 'forward' "
                                           "has float32\\[1\\]"):
        verify(mixed)


def test_a_constant_expression_below_its_slot_is_refused_clearly_at_each_size():
    """fuzz/native_exec_fuzz.py's lean findings (seed 0, cases 32550, 36508): an input
    dimension whose expression is a constant (4) below its slot's size (5). The verifier
    allows it; an input of size 5 passed the static check and its copy into the 4-wide view
    raised NumPy's ValueError. Every call is now refused naming the dimension, with either
    size, as the native runtime refuses it."""
    x = TensorValue(F32, (8, 5), storage=ArenaStorage(0, 0))
    y = TensorValue(F32, (8, 5), storage=ArenaStorage(0, 192))
    exprs = (SizeExpr.parse("s0"), SizeExpr.parse("4"))
    method = Method("forward", (x, y), (0,), (1,), (KernelCall(0, (0, 1)),),
                    (Operator("aten::abs", "out"),), MemoryPlan((384,)),
                    symbols=(Symbol("s0", 1, 8),),
                    symbolic_values=(SymbolicValue(0, exprs), SymbolicValue(1, exprs)))
    forward = load(from_bytes(to_bytes(Program(methods=(method,))))).method("forward")
    for width, valid in ((5, 4), (4, 5)):
        with pytest.raises(ProgramError, match=rf"input 0 dimension 1 — found size {width} — valid: {valid}"):
            forward(np.ones((3, width), np.float32))
