"""Splat constants (format version 5): a state's uniform initial value stored as one element."""

from __future__ import annotations

import dataclasses
import sys

import numpy as np
import pytest

from opforge.errors import ProgramError
from opforge.program import (
    PACKING_SPLAT, ArenaStorage, ConstantStorage, KernelCall, MemoryPlan, Method,
    Operator, Program, ScalarType, Segment, StateSlot, TensorValue, constant_array, from_bytes,
    to_bytes,
)
from opforge.program._sample import splat_state_program
from opforge.runtime import load

F32 = ScalarType.FLOAT32


def _with_state(sizes, segment=np.zeros(1, np.float32), offset=0, state=True):
    values = (
        TensorValue(F32, (4,), storage=ArenaStorage(0, 0)),
        TensorValue(F32, sizes, storage=ConstantStorage(0, offset, PACKING_SPLAT)),
        TensorValue(F32, (4,), storage=ArenaStorage(0, 64)),
    )
    method = Method("forward", values, (0,), (2,), (KernelCall(0, (0, 2)),),
                    (Operator("aten::abs", "out"),), MemoryPlan((128,)),
                    state=(StateSlot("s", 1),) if state else ())
    return Program(methods=(method,), segments=(Segment(segment),))


def test_round_trip_version_and_value():
    program = splat_state_program()
    data = to_bytes(program)
    assert data[8] == 5
    assert from_bytes(data) == program
    value = constant_array(program, program.methods[0].values[1])
    assert value.shape == (1024,) and not value.flags.writeable and not value.any()
    filled = _with_state((3, 5), np.array([-2.5], np.float32))
    array = constant_array(filled, filled.methods[0].values[1])
    np.testing.assert_array_equal(array, np.full((3, 5), -2.5, np.float32))
    assert filled.methods[0].values[1].stored_nbytes == 4


def test_splat_only_for_a_state():
    with pytest.raises(ProgramError, match="splat constant that is no state's initial value"):
        to_bytes(_with_state((8,), state=False))


def test_splat_in_an_older_version_is_refused():
    data = bytearray(to_bytes(splat_state_program()))
    data[8] = 4  # the version sits in the header, outside the metadata's CRC
    with pytest.raises(ProgramError, match="a splat constant in a version-4 file"):
        from_bytes(bytes(data))


def test_the_element_must_lie_in_its_segment():
    with pytest.raises(ProgramError, match="segment"):
        to_bytes(_with_state((8,), np.zeros(1, np.float32), offset=4))


def test_state_bytes_count_against_the_memory_limit():
    # 4 GiB of state from a 300-byte file: refused at load under a smaller limit
    data = to_bytes(_with_state((2**30,)))
    assert len(data) < 1000
    with pytest.raises(ProgramError, match=r"state tensors .* needs 4294967296 bytes"):
        load(data, max_memory=2**31)


def test_live_state_of_a_zero_splat_is_committed_on_write():
    loaded = load(to_bytes(_with_state((2**20,))), max_memory=2**30)  # 4 MiB of state
    logical, resident = loaded.state_memory()["s"]
    assert logical == 4 * 2**20
    if sys.platform.startswith("linux"):
        assert resident == 0
        loaded.write_state("s", np.ones(2**20, np.float32))
        assert loaded.state_memory()["s"] == (logical, logical)
        loaded.reset_state("s")
        assert loaded.state_memory()["s"] == (logical, 0)
    assert not loaded.read_state("s").any()


def test_splat_storage_survives_replace():
    storage = ConstantStorage(0, 0, PACKING_SPLAT)
    assert dataclasses.replace(storage, offset=4).packing == PACKING_SPLAT
    with pytest.raises(ProgramError, match="packing"):
        ConstantStorage(0, 0, 3)
    # a splat of any dtype (int4 packing alone is int8-only)
    TensorValue(ScalarType.INT64, (4,), storage=storage)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's overcommit refuses it")
@pytest.mark.parametrize("element", [0.0, 1.0])  # mapped lazily / copied densely
def test_state_the_system_cannot_map_under_a_raised_limit_is_a_program_error(element):
    # 4 TiB of state under a 1 PiB limit: no raw OSError / MemoryError out of load()
    data = to_bytes(_with_state((2**40,), np.array([element], np.float32)))
    with pytest.raises(ProgramError, match=r"state 's' — needs 4398046511104 bytes \(4.0 TiB\) "
                                           r"and the system refused them") as info:
        load(data, max_memory=2**50)
    assert "lower the limit" in str(info.value)
