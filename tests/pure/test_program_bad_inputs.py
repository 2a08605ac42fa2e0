"""Hostile and broken program files: each is refused with a ProgramError that says what
field was wrong, what was found and what is valid."""

from __future__ import annotations

import struct

import numpy as np
import pytest

import opforge.program as P
from opforge.errors import ProgramError
from opforge.program._format import FORMAT_VERSION, HEADER_SIZE, MAGIC
from opforge.program._sample import reseal, unverified_bytes

SIZE_MARK = 658_188  # a tensor size whose int64 pattern occurs once in the file
F32 = P.ScalarType.FLOAT32


def tiny(**changes) -> P.Program:
    values = (
        P.TensorValue(F32, (SIZE_MARK,), storage=P.ArenaStorage(0, 0)),
        P.TensorValue(F32, (2,), storage=P.ConstantStorage(0, 0)),
        P.IntValue(7),
    )
    method = dict(name="forward", values=values, inputs=(0,), outputs=(0,),
                  instructions=(P.KernelCall(0, (0, 1, 2, 0)),),
                  operators=(P.Operator("my_ops::scale", "out"),),
                  memory_plan=P.MemoryPlan((SIZE_MARK * 4,)))
    method.update(changes)
    return P.Program(methods=(P.Method(**method),),
                     segments=(P.Segment(np.array([1, 2], np.float32)),))


def patched(data: bytes, old: bytes, new: bytes) -> bytes:
    assert data.count(old) == 1, "the marker must occur exactly once"
    return reseal(data.replace(old, new))


def rejected(data: bytes) -> str:
    with pytest.raises(ProgramError) as info:
        P.from_bytes(data)
    return str(info.value)


GOOD = P.to_bytes(tiny())
# metadata: methods count (u32), name length (u32), "forward", values count (u32), ...
VALUES_COUNT_AT = HEADER_SIZE + 4 + 4 + len("forward")
FIRST_TAG_AT = VALUES_COUNT_AT + 4  # then dtype (u8), rank (u8), storage kind (u8), ...


def test_the_fixture_is_valid():
    assert P.from_bytes(GOOD) == tiny()


def test_empty_file(tmp_path):
    assert "empty file (0 bytes)" in rejected(b"")
    path = tmp_path / "empty.opf"
    path.write_bytes(b"")
    with pytest.raises(ProgramError, match=r"load\(.*empty file.*re-export"):
        P.load(path)


def test_missing_file(tmp_path):
    with pytest.raises(ProgramError, match=r"cannot read it .*fix: check the path"):
        P.load(tmp_path / "nope.opf")


def test_wrong_magic():
    message = rejected(b"PK\x03\x04" + GOOD[4:])
    assert "header.magic — found b'PK\\x03\\x04" in message
    assert repr(MAGIC) in message


def test_header_shorter_than_64_bytes():
    assert "truncated file of 20 bytes" in rejected(GOOD[:20])


def test_newer_format_version():
    newer = FORMAT_VERSION + 1
    message = rejected(GOOD[:8] + struct.pack("<I", newer) + GOOD[12:])
    assert f"header.format_version — found version {newer} (newer)" in message
    assert f"valid: versions 1..{FORMAT_VERSION}" in message and "upgrade opforge" in message


def test_older_format_version():
    assert f"found version 0 — valid: versions 1..{FORMAT_VERSION}" in rejected(
        GOOD[:8] + struct.pack("<I", 0) + GOOD[12:])


def test_truncated_file():
    message = rejected(GOOD[:-3])
    assert "header.file_size" in message and "(truncated)" in message


def test_trailing_bytes():
    assert "(trailing bytes)" in rejected(GOOD + b"\0")


def test_truncated_segment_even_with_a_consistent_header():
    cut = GOOD[:-4]
    cut = cut[:16] + struct.pack("<Q", len(cut)) + cut[24:]  # header.file_size agrees
    message = rejected(cut)
    assert "segments[0]" in message and "within the file" in message


def test_segment_offset_past_the_end():
    table = struct.pack("<Iqq", 1, 0, 8)  # segments count, offset, size
    message = rejected(patched(GOOD, table, struct.pack("<Iqq", 1, 1 << 20, 8)))
    assert "segments[0] — found offset 1048576, size 8" in message
    assert "within the file" in message


def test_segment_offset_not_64_aligned():
    table = struct.pack("<Iqq", 1, 0, 8)
    assert "a multiple of 64" in rejected(patched(GOOD, table, struct.pack("<Iqq", 1, 8, 0)))


def test_negative_size():
    message = rejected(patched(GOOD, struct.pack("<q", SIZE_MARK), struct.pack("<q", -1)))
    assert "method 'forward' values[0]" in message
    assert "sizes[0] — found -1" in message


def test_overflowing_size():
    message = rejected(patched(GOOD, struct.pack("<q", SIZE_MARK), struct.pack("<q", 2**62)))
    assert "values[0]" in message and "at most 281474976710656 bytes (2**48)" in message


def test_huge_count_is_refused_before_allocating():
    data = reseal(GOOD[:VALUES_COUNT_AT] + struct.pack("<I", 0xFFFF_FFFF)
                  + GOOD[VALUES_COUNT_AT + 4:])
    message = rejected(data)
    assert "method 'forward' values" in message and "count 4294967295" in message


def test_value_index_out_of_range():
    bad = tiny(instructions=(P.KernelCall(0, (0, 99)),))
    message = rejected(unverified_bytes(bad))
    assert "method 'forward' instructions[0] (KernelCall).args[1]" in message
    assert "found value index 99 — valid: 0..2 (3 values)" in message


def test_operator_index_out_of_range():
    message = rejected(unverified_bytes(tiny(instructions=(P.KernelCall(5, ()),))))
    assert "(KernelCall).op — found operator index 5 — valid: 0..0 (1 operators)" in message


def test_delegate_index_out_of_range():
    message = rejected(unverified_bytes(tiny(instructions=(P.DelegateCall(0, (0,)),))))
    assert "(DelegateCall).delegate — found delegate index 0 — valid: none" in message


def test_output_index_out_of_range():
    assert "outputs[0] — found value index 3" in rejected(unverified_bytes(tiny(outputs=(3,))))


def test_tensor_list_that_refers_to_itself():
    values = tiny().methods[0].values + (P.TensorListValue((3,)),)
    message = rejected(unverified_bytes(tiny(values=values)))
    assert "values[3].items[0] — found value 3, a TensorListValue" in message


def test_unknown_dtype():
    assert GOOD[FIRST_TAG_AT:FIRST_TAG_AT + 2] == bytes([8, int(F32)])  # tensor, float32
    data = reseal(GOOD[:FIRST_TAG_AT + 1] + bytes([99]) + GOOD[FIRST_TAG_AT + 2:])
    message = rejected(data)
    assert "values[0]" in message and "unknown dtype number 99" in message
    assert "6 (float32)" in message


def test_unknown_value_tag():
    data = reseal(GOOD[:FIRST_TAG_AT] + bytes([200]) + GOOD[FIRST_TAG_AT + 1:])
    assert "values[0]: tag — found tag 200 — valid: 0..11" in rejected(data)


def test_metadata_checksum_mismatch():
    data = GOOD[:FIRST_TAG_AT + 1] + bytes([7]) + GOOD[FIRST_TAG_AT + 2:]  # not resealed
    assert "header.metadata_crc32" in rejected(data)


def test_nonzero_flags():
    assert "header.flags — found 1" in rejected(GOOD[:44] + struct.pack("<I", 1) + GOOD[48:])


def test_invalid_utf8_method_name():
    data = patched(GOOD, b"forward", b"forw\xffrd")
    assert "invalid UTF-8" in rejected(data)


def test_error_names_the_api_that_was_called():
    assert rejected(b"nonsense").startswith("`opforge.program.from_bytes(<8 bytes>)`: ")
