"""Property: any mutation of a valid program file either loads (and then verifies and
re-encodes) or raises ProgramError — never another exception, a hang or a huge allocation.

Mutations that touch the metadata are usually "resealed" (the header CRC recomputed) so
they reach the parser and the verifier instead of stopping at the checksum. Bounded to a
few hundred examples per property so the file runs in seconds; fuzz/program_fuzz.py runs
the same idea for 100k+ inputs on demand.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import opforge.program as P
from opforge.errors import ProgramError
from opforge.program._sample import (
    chain_program, growing_program, reseal, sample_program, symbolic_program, unverified_bytes,
)

SEEDS = [P.to_bytes(sample_program()), P.to_bytes(chain_program(3)),
         P.to_bytes(P.Program(methods=())), P.to_bytes(symbolic_program()),
         P.to_bytes(growing_program())]
FUZZ = settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
HUGE = [0xFFFF_FFFF, 0x8000_0000, 0x7FFF_FFFF, 2**63 - 1, 2**62, 2**48, 2**32, 65, 64, 1]


def check(data: bytes) -> None:
    """The oracle: load or a ProgramError; a loaded program re-encodes to a loadable file."""
    try:
        program = P.from_bytes(data)
    except ProgramError:
        return
    P.verify(program)
    again = P.to_bytes(program)
    assert P.to_bytes(P.from_bytes(again)) == again


seeds = st.sampled_from(SEEDS)


@FUZZ
@given(seeds, st.data())
def test_truncation(seed, data):
    check(seed[:data.draw(st.integers(0, len(seed) - 1))])


@FUZZ
@given(seeds, st.data(), st.booleans())
def test_bit_flips(seed, data, resealed):
    buf = bytearray(seed)
    for position in data.draw(st.lists(st.integers(0, len(seed) * 8 - 1), min_size=1,
                                       max_size=4)):
        buf[position // 8] ^= 1 << (position % 8)
    check(reseal(buf) if resealed else bytes(buf))


@FUZZ
@given(seeds, st.data(), st.booleans())
def test_byte_range_overwrite(seed, data, resealed):
    start = data.draw(st.integers(0, len(seed) - 1))
    patch = data.draw(st.binary(min_size=1, max_size=16))
    buf = seed[:start] + patch + seed[start + len(patch):]
    check(reseal(buf) if resealed else buf)


@FUZZ
@given(seeds, st.data(), st.sampled_from(["<I", "<Q", "<q", "<i"]), st.sampled_from(HUGE),
       st.booleans())
def test_huge_lengths_and_offsets(seed, data, fmt, magnitude, negative):
    value = -magnitude if negative and fmt in ("<q", "<i") else magnitude
    value = min(value, 2**31 - 1) if fmt == "<i" else value
    value = value & 0xFFFF_FFFF if fmt == "<I" else value
    if fmt == "<i":
        value = max(value, -(2**31))
    width = struct.calcsize(fmt)
    start = data.draw(st.integers(0, len(seed) - width))
    check(reseal(seed[:start] + struct.pack(fmt, value) + seed[start + width:]))


_INDEX = st.one_of(st.integers(-3, 40), st.sampled_from([2**31, 2**32 - 1]))


@FUZZ
@given(st.data())
def test_dangling_and_cyclic_indices(data):
    """Replace one index in the sample program (args, ops, Move/Free, tensor-list items,
    storage) with an arbitrary one: the result loads only if the index happens to be valid."""
    program = sample_program()
    forward = program.methods[0]
    values, instructions = list(forward.values), list(forward.instructions)
    choice = data.draw(st.sampled_from(["arg", "op", "move", "free", "list", "storage",
                                        "segment", "io"]))
    index = data.draw(_INDEX)
    if index < 0 or index >= 2**32:
        index = abs(index) % 2**32  # the file format holds u32 indices
    if choice == "arg":
        i = data.draw(st.sampled_from([0, 1, 3]))
        args = list(instructions[i].args)
        args[data.draw(st.integers(0, len(args) - 1))] = index
        instructions[i] = P.KernelCall(instructions[i].op, tuple(args))
    elif choice == "op":
        instructions[0] = P.KernelCall(index, instructions[0].args)
    elif choice == "move":
        instructions[4] = P.Move(index, data.draw(_INDEX.filter(lambda i: 0 <= i < 2**32)))
    elif choice == "free":
        instructions[5] = P.Free(index)
    elif choice == "list":  # may point at itself (14), another list (15) or a scalar
        values[14] = P.TensorListValue((3, index))
    elif choice == "storage":
        values[3] = P.TensorValue(P.ScalarType.FLOAT32, (2, 3),
                                  storage=P.ArenaStorage(index % 3, index * 4))
    elif choice == "segment":
        values[1] = P.TensorValue(P.ScalarType.FLOAT32, (3, 4),
                                  storage=P.ConstantStorage(index % 4, index))
    else:
        forward = P.Method(forward.name, forward.values, (index,), (index,), (),
                           forward.operators, forward.memory_plan)
    method = P.Method(forward.name, tuple(values), forward.inputs, forward.outputs,
                      tuple(instructions), forward.operators, forward.memory_plan)
    if choice == "io":
        method = forward
    check(unverified_bytes(P.Program((method,) + program.methods[1:], program.segments,
                                program.delegates, program.user_metadata)))


@pytest.mark.parametrize("seed", range(len(SEEDS)))
def test_every_prefix_of_a_seed_is_refused_cleanly(seed):
    data = SEEDS[seed]
    for cut in range(len(data)):
        with pytest.raises(ProgramError):
            P.from_bytes(data[:cut])
