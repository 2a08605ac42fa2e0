"""Writing a program's state (``LoadedProgram.write_state``) takes exactly the state's shape
and dtype: every other shape of the right dtype is refused, the broadcastable ones too
(NumPy would copy a (1, 3) or a 0-d array into a (2, 3) state without a word), and a
refused write leaves the live state as it was. Reads are copies. No torch."""

from __future__ import annotations

import numpy as np
import pytest

from opforge.errors import ProgramError
from opforge.program import (
    ArenaStorage, ConstantStorage, DoubleValue, KernelCall, MemoryPlan, Method, Move, Operator,
    Program, ScalarType, Segment, StateSlot, TensorValue, from_bytes, to_bytes,
)
from opforge.runtime import load

SHAPE = (2, 3)
INITIAL = np.arange(6, dtype=np.float32).reshape(SHAPE)


def _accumulator(state: bool = True) -> Program:
    """forward(x): state = state + x; returns the new state (float32 [2, 3], initially 0..5).
    Without state: returns constant + x."""
    f32, nbytes = ScalarType.FLOAT32, INITIAL.nbytes
    values = (
        TensorValue(f32, SHAPE, storage=ConstantStorage(0, 0)),  # the state
        TensorValue(f32, SHAPE, storage=ArenaStorage(0, 0)),  # x
        TensorValue(f32, SHAPE, storage=ArenaStorage(0, 64)),  # state + x
        DoubleValue(1.0),
    )
    add = KernelCall(0, (0, 1, 3, 2))
    method = Method("forward", values, (1,), (2,), (add, Move(2, 0)) if state else (add,),
                    (Operator("aten::add", "out"),), MemoryPlan((64 + nbytes,)),
                    state=(StateSlot("acc", 0),) if state else ())
    return from_bytes(to_bytes(Program(methods=(method,), segments=(Segment(INITIAL.tobytes()),))))


# every shape but (2, 3): broadcastable into it ((), (1,), (3,), (1, 3), (2, 1), (1, 1)),
# the same elements in another shape ((3, 2), (6,), (2, 3, 1), (1, 2, 3)), fewer, more, none
WRONG_SHAPES = [(), (1,), (3,), (1, 3), (2, 1), (1, 1), (3, 2), (6,), (2, 3, 1), (1, 2, 3),
                (2, 2), (2, 4), (4, 3), (0,), (0, 3)]


@pytest.mark.parametrize("shape", WRONG_SHAPES, ids=str)
def test_a_state_write_of_any_other_shape_is_refused_even_of_the_right_dtype(shape):
    loaded = load(_accumulator())
    value = np.full(shape, 7.0, np.float32)
    try:
        loaded.write_state("acc", value)
    except ProgramError as e:
        message = str(e)
    else:
        pytest.fail(f"write_state took a float32 value of shape {shape} for a (2, 3) state: "
                    f"the state is now {loaded.read_state('acc').tolist()}")
    assert f"shape {shape}" in message and "valid: float32 of shape (2, 3)" in message, (
        f"write_state accepted or misreported a float32 value of shape {shape} for a (2, 3) "
        f"state: {message}")
    np.testing.assert_array_equal(
        loaded.read_state("acc"), INITIAL,
        err_msg=f"a refused write of shape {shape} still changed the state")


@pytest.mark.parametrize("dtype", [np.float64, np.float16, np.int32, np.bool_])
def test_a_state_write_of_the_right_shape_and_another_dtype_is_refused(dtype):
    loaded = load(_accumulator())
    with pytest.raises(ProgramError, match="valid: float32 of shape"):
        loaded.write_state("acc", np.ones(SHAPE, dtype))
    np.testing.assert_array_equal(loaded.read_state("acc"), INITIAL)


def test_a_state_write_of_the_right_shape_and_dtype_is_what_the_next_call_reads():
    loaded = load(_accumulator())
    forward = loaded.method("forward")
    new = np.full(SHAPE, 10.0, np.float32)
    new[1, 2] = -4.0
    loaded.write_state("acc", new)
    new[:] = 99.0  # the state holds a copy, not the caller's array
    (out,) = forward(np.ones(SHAPE, np.float32))
    want = np.full(SHAPE, 11.0, np.float32)
    want[1, 2] = -3.0
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(loaded.read_state("acc"), want)
    # a non-contiguous view of the right shape and dtype is taken too
    loaded.write_state("acc", np.arange(12, dtype=np.float32).reshape(3, 4)[::2, :3])
    np.testing.assert_array_equal(loaded.read_state("acc"), [[0, 1, 2], [8, 9, 10]])


def test_a_state_read_is_a_copy_and_reset_restores_the_initial_value():
    loaded = load(_accumulator())
    seen = loaded.read_state("acc")
    seen[:] = -1.0
    np.testing.assert_array_equal(loaded.read_state("acc"), INITIAL,
                                  err_msg="read_state handed out the live state, not a copy")
    loaded.method("forward")(np.ones(SHAPE, np.float32))
    loaded.reset_state("acc")
    np.testing.assert_array_equal(loaded.read_state("acc"), INITIAL)
    with pytest.raises(ProgramError, match="valid: 'acc'"):
        loaded.write_state("other", INITIAL)


def test_a_program_without_state_says_so():
    loaded = load(_accumulator(state=False))
    for api in (loaded.read_state, loaded.reset_state):
        with pytest.raises(ProgramError, match=r"valid: \(the program has no state\)"):
            api("acc")
    with pytest.raises(ProgramError, match=r"valid: \(the program has no state\)"):
        loaded.write_state("acc", INITIAL)
