"""The verifier and the dataclasses' own checks, on programs built in Python."""

from __future__ import annotations

import numpy as np
import pytest

import opforge.program as P
from opforge.errors import ProgramError

F32 = P.ScalarType.FLOAT32


def method(values=(), **changes) -> P.Method:
    fields = dict(name="forward", values=tuple(values), inputs=(), outputs=(), instructions=(),
                  operators=(), memory_plan=P.MemoryPlan((256,)))
    fields.update(changes)
    return P.Method(**fields)


def refused(program: P.Program, **kwargs) -> str:
    with pytest.raises(ProgramError) as info:
        P.verify(program, **kwargs)
    message = str(info.value)
    assert message.startswith("`opforge.program.verify()`: ")
    return message


def arena_tensor(offset=0, sizes=(4,), dtype=F32, mem_id=0) -> P.TensorValue:
    return P.TensorValue(dtype, sizes, storage=P.ArenaStorage(mem_id, offset))


def test_valid_program_passes():
    P.verify(P.Program(methods=(method([arena_tensor()], inputs=(0,), outputs=(0,)),)))


def test_duplicate_method_names():
    message = refused(P.Program(methods=(method(), method())))
    assert "methods[1].name — found 'forward', already the name of methods[0]" in message


def test_arena_placement_past_the_arena():
    message = refused(P.Program(methods=(method([arena_tensor(offset=248)]),)))
    assert "values[0].storage — found bytes [248, 264) (float32[4])" in message
    assert "within arena 0, which has 256 bytes" in message


def test_arena_index_out_of_range():
    message = refused(P.Program(methods=(method([arena_tensor(mem_id=2)]),)))
    assert "storage.mem_id — found arena index 2 — valid: 0..0 (1 arenas)" in message


def test_misaligned_arena_offset():
    message = refused(P.Program(methods=(method([arena_tensor(offset=2)]),)))
    assert "storage.offset — found 2 in arena 0" in message
    assert "a multiple of the float32 itemsize 4" in message


def test_constant_past_its_segment():
    tensor = P.TensorValue(F32, (4,), storage=P.ConstantStorage(0, 0))
    program = P.Program(methods=(method([tensor]),), segments=(P.Segment(b"\0" * 8),))
    assert "within segment 0, which has 8 bytes" in refused(program)


def test_constant_segment_out_of_range():
    tensor = P.TensorValue(F32, (4,), storage=P.ConstantStorage(3, 0))
    assert "found segment index 3 — valid: none (there are no segments)" in refused(
        P.Program(methods=(method([tensor]),)))


def test_unplanned_tensor_needs_permission():
    program = P.Program(methods=(method([P.TensorValue(F32, (4,))]),))
    message = refused(program)
    assert "storage — found None for a tensor of 16 bytes" in message
    assert "allow_unplanned=True" in message
    P.verify(program, allow_unplanned=True)
    P.verify(P.Program(methods=(method([P.TensorValue(F32, (0, 4))]),)))  # zero bytes


def test_input_must_not_be_a_constant():
    tensor = P.TensorValue(F32, (2,), storage=P.ConstantStorage(0, 0))
    program = P.Program(methods=(method([tensor], inputs=(0,)),), segments=(P.Segment(b"\0" * 8),))
    assert "inputs[0] — found value 0, a constant tensor" in refused(program)


def test_inputs_and_outputs_are_tensors_or_scalars():
    message = refused(P.Program(methods=(method([P.StringValue("x")], outputs=(0,)),)))
    assert "outputs[0] — found value 0, a StringValue" in message


def test_duplicate_input():
    assert "value 0 a second time" in refused(
        P.Program(methods=(method([arena_tensor()], inputs=(0, 0)),)))


def test_move_into_a_constant():
    constant = P.TensorValue(F32, (2,), storage=P.ConstantStorage(0, 0))
    program = P.Program(methods=(method([arena_tensor(), constant],
                                        instructions=(P.Move(0, 1),)),),
                        segments=(P.Segment(b"\0" * 8),))
    assert "instructions[0] (Move).dst — found value 1, a constant tensor" in refused(program)


def test_free_of_a_non_tensor():
    program = P.Program(methods=(method([P.IntValue(1)], instructions=(P.Free(0),)),))
    assert "(Free).value — found value 0, an IntValue" in refused(program)


def test_negative_index_is_not_wrapped_around():
    program = P.Program(methods=(method([arena_tensor()], outputs=(-1,)),))
    assert "outputs[0] — found value index -1 — valid: 0..0" in refused(program)


def test_duplicate_operator_in_table():
    ops = (P.Operator("aten::add", "out"), P.Operator("aten::add", "out"))
    assert "operators[1] — found 'aten::add.out', already operators[0]" in refused(
        P.Program(methods=(method(operators=ops),)))


def test_delegate_segment_out_of_range():
    program = P.Program(methods=(), delegates=(P.DelegateBlob("cpu", 0),))
    assert "delegates[0] ('cpu').segment — found segment index 0" in refused(program)


def test_non_program_is_refused():
    assert "found dict — valid: an opforge.program.Program" in refused({})


# --- the dataclasses' own checks ---------------------------------------------------

@pytest.mark.parametrize("make, expected", [
    (lambda: P.TensorValue(F32, (2, -3)), "sizes[1] — found -3"),
    (lambda: P.TensorValue(F32, (2**30, 2**30)), "at most 281474976710656 bytes"),
    (lambda: P.TensorValue(F32, (2, 3), (0, 0)), "dim_order — found (0, 0)"),
    (lambda: P.TensorValue(F32, (1,) * 65), "rank — found 65"),
    (lambda: P.TensorValue(99, (1,)), "unknown dtype number 99"),
    (lambda: P.TensorValue(F32, (1.5,)), "sizes[0] — found 1.5"),
    (lambda: P.TensorValue(F32, (1,), storage=(0, 0)), "storage — found tuple"),
    (lambda: P.ArenaStorage(0, -64), "offset — found -64"),
    (lambda: P.IntValue(2**63), "value — found 9223372036854775808"),
    (lambda: P.IntValue(True), "value — found True"),
    (lambda: P.BoolValue(1), "True or False"),
    (lambda: P.Operator("add", "out"), "'namespace::op'"),
    (lambda: P.Operator("aten::add", "out.x"), "letters, digits"),
    (lambda: P.MemoryPlan((-1,)), "arena_sizes[0] — found -1"),
    (lambda: P.Method("", (), (), (), ()), "a non-empty str"),
    (lambda: P.Segment(3), "a C-contiguous bytes-like object"),
    (lambda: P.DelegateBlob("cpu", 0, (("k", "not bytes"),)), "a (str, bytes) pair"),
    (lambda: P.Program((), user_metadata=(("k", "a"), ("k", "b"))), "duplicate key 'k'"),
])
def test_dataclass_invariants(make, expected):
    with pytest.raises(ProgramError, match=expected.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[").replace("]", r"\]").replace(".", r"\.")):
        make()


def test_program_method_lookup_lists_the_methods():
    with pytest.raises(ProgramError, match="no such method — valid: 'forward'"):
        P.Program(methods=(method(),)).method("backward")


def test_operator_key_is_the_registry_key():
    assert P.Operator("aten::add", "out").key == "aten::add.out"
    assert P.Operator("my_ops::relu6").key == "my_ops::relu6"


def test_lists_become_tuples():
    t = P.TensorValue(F32, [2, 3], [1, 0])
    assert t.sizes == (2, 3) and t.dim_order == (1, 0)
    assert P.KernelCall(0, [1, 2]).args == (1, 2)


# --- ScalarType ----------------------------------------------------------------------

def test_scalar_type_numbers_are_atens():
    assert [int(t) for t in (P.ScalarType.UINT8, P.ScalarType.INT64, P.ScalarType.FLOAT32,
                             P.ScalarType.BOOL, P.ScalarType.BFLOAT16, P.ScalarType.UINT64)] == [
        0, 4, 6, 11, 15, 29]


@pytest.mark.parametrize("scalar_type", [t for t in P.ScalarType
                                         if t not in (P.ScalarType.BFLOAT16,
                                                      P.ScalarType.COMPLEX32)])
def test_scalar_type_numpy_round_trip(scalar_type):
    dtype = scalar_type.numpy_dtype()
    assert dtype.itemsize == scalar_type.itemsize
    assert P.ScalarType.from_numpy(dtype) is scalar_type


def test_bfloat16_has_no_numpy_dtype():
    with pytest.raises(ProgramError, match="bfloat16, which NumPy has no dtype for.*numpy.uint16"):
        P.ScalarType.BFLOAT16.numpy_dtype()
    assert P.ScalarType.BFLOAT16.itemsize == 2


def test_big_endian_numpy_dtype_is_refused():
    with pytest.raises(ProgramError, match="little-endian"):
        P.ScalarType.from_numpy(np.dtype(">i4"))
