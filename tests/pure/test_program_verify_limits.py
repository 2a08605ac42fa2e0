"""Every limit ``opforge.program.verify`` checks, probed exactly at the limit (accepted)
and one step past it (refused): a tensor ending at the last byte of its arena or segment,
and one element further; an index equal to the last valid one, and one more.

Placement tests that overshoot by a whole tensor let an off-by-one comparison through
(``offset + nbytes >= limit`` refuses a tensor that fits; ``offset + nbytes > limit +
itemsize`` accepts one that does not); these pin each comparison from both sides.
"""

from __future__ import annotations

import pytest

import opforge.program as P
from opforge.errors import ProgramError

F32, F64, I8 = P.ScalarType.FLOAT32, P.ScalarType.FLOAT64, P.ScalarType.INT8
ITEMSIZE = {F32: 4, F64: 8, I8: 1}


def method(values=(), arenas=(256,), **changes) -> P.Method:
    fields = dict(name="forward", values=tuple(values), inputs=(), outputs=(), instructions=(),
                  operators=(), memory_plan=P.MemoryPlan(arenas))
    fields.update(changes)
    return P.Method(**fields)


def program(*methods, segments=(), delegates=()) -> P.Program:
    return P.Program(methods=tuple(methods), segments=tuple(segments),
                     delegates=tuple(delegates))


def refused(program: P.Program) -> str:
    with pytest.raises(ProgramError) as info:
        P.verify(program)
    return str(info.value)


def segment(nbytes: int) -> P.Segment:
    return P.Segment(bytes(nbytes))


# --- a tensor's bytes against the end of its arena or constant segment -----------------------

# (dtype, sizes): nbytes = prod(sizes) * itemsize; the tensor is placed to end at the limit.
TENSORS = [(F32, (4,)), (F64, (2, 3)), (I8, (5,)), (F32, (3, 0))]


@pytest.mark.parametrize("dtype, sizes", TENSORS, ids=str)
@pytest.mark.parametrize("limit", [256, 64])
def test_arena_tensor_ending_at_the_arena_end(dtype, sizes, limit):
    nbytes = P.TensorValue(dtype, sizes).nbytes
    at = P.TensorValue(dtype, sizes, storage=P.ArenaStorage(0, limit - nbytes))
    P.verify(program(method([at], arenas=(limit,))))
    past = P.TensorValue(dtype, sizes,
                         storage=P.ArenaStorage(0, limit - nbytes + ITEMSIZE[dtype]))
    message = refused(program(method([past], arenas=(limit,))))
    assert f"bytes [{limit - nbytes + ITEMSIZE[dtype]}, {limit + ITEMSIZE[dtype]})" in message
    assert f"within arena 0, which has {limit} bytes" in message


@pytest.mark.parametrize("dtype, sizes", TENSORS, ids=str)
def test_whole_arena_and_one_element_more(dtype, sizes):
    nbytes = P.TensorValue(dtype, sizes).nbytes
    whole = P.TensorValue(dtype, sizes, storage=P.ArenaStorage(0, 0))
    P.verify(program(method([whole], arenas=(nbytes,))))
    if nbytes:  # an arena one element short
        assert "which has" in refused(program(method([whole],
                                                     arenas=(nbytes - ITEMSIZE[dtype],))))


def test_each_arena_is_its_own_limit():
    # arena 1 is smaller than arena 0: a tensor that would fit arena 0 must not pass in 1
    tensor = lambda mem_id, offset: P.TensorValue(F32, (4,),  # noqa: E731
                                                  storage=P.ArenaStorage(mem_id, offset))
    P.verify(program(method([tensor(0, 240), tensor(1, 48)], arenas=(256, 64))))
    message = refused(program(method([tensor(1, 52)], arenas=(256, 64))))
    assert "within arena 1, which has 64 bytes" in message
    message = refused(program(method([tensor(0, 244)], arenas=(256, 64))))
    assert "within arena 0, which has 256 bytes" in message


def test_zero_byte_arena():
    empty = P.TensorValue(F32, (0,), storage=P.ArenaStorage(0, 0))
    P.verify(program(method([empty], arenas=(0,))))
    one = P.TensorValue(F32, (1,), storage=P.ArenaStorage(0, 0))
    assert "within arena 0, which has 0 bytes" in refused(program(method([one], arenas=(0,))))


@pytest.mark.parametrize("dtype, sizes", TENSORS, ids=str)
@pytest.mark.parametrize("limit", [48, 64])
def test_constant_ending_at_the_segment_end(dtype, sizes, limit):
    nbytes = P.TensorValue(dtype, sizes).nbytes
    at = P.TensorValue(dtype, sizes, storage=P.ConstantStorage(0, limit - nbytes))
    P.verify(program(method([at]), segments=[segment(limit)]))
    past = P.TensorValue(dtype, sizes,
                         storage=P.ConstantStorage(0, limit - nbytes + ITEMSIZE[dtype]))
    message = refused(program(method([past]), segments=[segment(limit)]))
    assert f"bytes [{limit - nbytes + ITEMSIZE[dtype]}, {limit + ITEMSIZE[dtype]})" in message
    assert f"within segment 0, which has {limit} bytes" in message


def test_each_segment_is_its_own_limit():
    tensor = lambda seg, offset: P.TensorValue(F32, (4,),  # noqa: E731
                                               storage=P.ConstantStorage(seg, offset))
    segments = [segment(64), segment(16)]
    P.verify(program(method([tensor(0, 48), tensor(1, 0)]), segments=segments))
    assert "within segment 1, which has 16 bytes" in refused(
        program(method([tensor(1, 4)]), segments=segments))
    assert "within segment 0, which has 64 bytes" in refused(
        program(method([tensor(0, 52)]), segments=segments))


# --- alignment: an offset of one itemsize passes, one byte less does not ---------------------

@pytest.mark.parametrize("storage", [lambda o: P.ArenaStorage(0, o),
                                     lambda o: P.ConstantStorage(0, o)], ids=["arena", "constant"])
def test_offset_alignment_is_the_itemsize(storage):
    make = lambda dtype, offset: P.TensorValue(dtype, (1,), storage=storage(offset))  # noqa: E731
    segments = [segment(256)]
    for dtype, itemsize in ITEMSIZE.items():
        P.verify(program(method([make(dtype, itemsize)]), segments=segments))
        P.verify(program(method([make(dtype, 3 * itemsize)]), segments=segments))
        if itemsize > 1:
            for offset in (itemsize - 1, itemsize + 1):
                message = refused(program(method([make(dtype, offset)]), segments=segments))
                assert f"a multiple of the {dtype.name.lower()} itemsize {itemsize}" in message


# --- indices: the last valid one passes, one more is refused ---------------------------------

def arena_tensor(mem_id=0) -> P.TensorValue:
    return P.TensorValue(F32, (1,), storage=P.ArenaStorage(mem_id, 0))


def test_arena_index():
    P.verify(program(method([arena_tensor(1)], arenas=(64, 64))))
    assert "found arena index 2 — valid: 0..1 (2 arenas)" in refused(
        program(method([arena_tensor(2)], arenas=(64, 64))))


def test_constant_segment_index():
    constant = lambda seg: P.TensorValue(F32, (1,),  # noqa: E731
                                         storage=P.ConstantStorage(seg, 0))
    segments = [segment(8), segment(8)]
    P.verify(program(method([constant(1)]), segments=segments))
    assert "found segment index 2 — valid: 0..1 (2 segments)" in refused(
        program(method([constant(2)]), segments=segments))


def test_delegate_blob_segment_index():
    segments = [segment(8), segment(8)]
    P.verify(program(segments=segments, delegates=[P.DelegateBlob("cpu", 1)]))
    message = refused(program(segments=segments, delegates=[P.DelegateBlob("cpu", 2)]))
    assert "delegates[0] ('cpu').segment — found segment index 2 — valid: 0..1" in message


def test_delegate_call_index():
    blobs = [P.DelegateBlob("cpu", 0), P.DelegateBlob("cpu", 0)]
    call = lambda d: method([arena_tensor()], instructions=[P.DelegateCall(d, (0,))])  # noqa: E731
    P.verify(program(call(1), segments=[segment(8)], delegates=blobs))
    assert "(DelegateCall).delegate — found delegate index 2 — valid: 0..1" in refused(
        program(call(2), segments=[segment(8)], delegates=blobs))


def test_operator_index():
    ops = (P.Operator("aten::add", "out"), P.Operator("aten::mul", "out"))
    call = lambda op: method([arena_tensor()], operators=ops,  # noqa: E731
                             instructions=[P.KernelCall(op, (0,))])
    P.verify(program(call(1)))
    assert "(KernelCall).op — found operator index 2 — valid: 0..1" in refused(program(call(2)))


VALUES = [arena_tensor(), arena_tensor()]  # value indices 0 and 1: 2 is one past the end
LISTED = [arena_tensor(), arena_tensor()]  # after the list at 0: 1 and 2 valid, 3 one past


@pytest.mark.parametrize("where, make, last", [
    ("inputs[0]", lambda i: method(VALUES, inputs=(i,)), 1),
    ("outputs[0]", lambda i: method(VALUES, outputs=(i,)), 1),
    ("(KernelCall).args[1]", lambda i: method(
        VALUES, operators=(P.Operator("aten::add", "out"),),
        instructions=[P.KernelCall(0, (0, i))]), 1),
    ("(Move).src", lambda i: method(VALUES, instructions=[P.Move(i, 0)]), 1),
    ("(Move).dst", lambda i: method(VALUES, instructions=[P.Move(0, i)]), 1),
    ("(Free).value", lambda i: method(VALUES, instructions=[P.Free(i)]), 1),
    ("values[0].items[1]", lambda i: method([P.TensorListValue((1, i))] + LISTED), 2),
    ("values[0].items[0]",
     lambda i: method([P.OptionalTensorListValue((i, None))] + LISTED), 2),
], ids=lambda v: v if isinstance(v, str) else "")
def test_value_index(where, make, last):
    P.verify(program(make(last)))
    message = refused(program(make(last + 1)))
    assert f"{where} — found value index {last + 1} — valid: 0..{last} ({last + 1} values)" \
        in message
    # and from below: 0 is the first index, -1 is refused (not wrapped around to the last)
    if where not in ("values[0].items[1]", "values[0].items[0]"):  # index 0 is the list
        P.verify(program(make(0)))
    assert f"{where} — found value index -1 — valid: 0..{last}" in refused(program(make(-1)))


def test_negative_operator_and_delegate_indices():
    ops = (P.Operator("aten::add", "out"),)
    assert "(KernelCall).op — found operator index -1" in refused(program(method(
        [arena_tensor()], operators=ops, instructions=[P.KernelCall(-1, (0,))])))
    assert "(DelegateCall).delegate — found delegate index -1" in refused(program(
        method([arena_tensor()], instructions=[P.DelegateCall(-1, (0,))]),
        segments=[segment(8)], delegates=[P.DelegateBlob("cpu", 0)]))


# --- an arena's own size: at most what its tensors need ---------------------------------------

def _arena_program(size: int, *placements) -> P.Program:
    return program(method([P.TensorValue(F32, (n,), storage=P.ArenaStorage(0, offset))
                           for offset, n in placements], arenas=(size,)))


@pytest.mark.parametrize("placements, needed", [
    # offsets 4224 = 33 * 128 and 4480 = 35 * 128: their common alignment is 128, so the
    # arena may end at the last tensor's end (4484) rounded up to 128
    (((4224, 1), (4480, 1)), 4608),
    (((0, 2500), (10_048, 16)), 10_112),  # offsets 0 and 157 * 64: rounded up to 64
    (((8192, 1),), 12_288),  # alignment 8192 is capped at a page: 8196 -> 12_288
    ((), 4096),  # an arena up to one page is accepted, used or not
    (((0, 0),), 4096),
], ids=["align-128", "align-64", "align-capped", "empty", "zero-byte"])
def test_arena_size_at_most_what_its_tensors_need(placements, needed):
    P.verify(_arena_program(needed, *placements))
    message = refused(_arena_program(needed + 1, *placements))
    assert f"memory_plan.arena_sizes[0] — found {needed + 1} bytes" in message
    assert f"at most {needed} bytes" in message
