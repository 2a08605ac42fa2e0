"""int4-packed constants (format version 2): packing, round trips, and strict refusals."""

import struct
import zlib

import numpy as np
import pytest

from opforge.errors import ProgramError
from opforge.program import (
    PACKING_INT4, ConstantStorage, IntValue, KernelCall, MemoryPlan, Method, Operator,
    Program, ScalarType, ArenaStorage, ScalarTypeValue, Segment, TensorValue, NoneValue,
    constant_array, describe, from_bytes, pack_int4, to_bytes, unpack_int4,
)
from opforge.program import _format as F

ALL = np.arange(-8, 8, dtype=np.int8)


@pytest.mark.parametrize("count", [0, 1, 2, 15, 16, 17])
def test_pack_unpack_round_trip(count):
    values = np.resize(ALL, count)
    packed = pack_int4(values)
    assert packed.dtype == np.uint8 and packed.size == (count + 1) // 2
    np.testing.assert_array_equal(unpack_int4(packed, count), values)


def test_nibble_layout_is_low_first_twos_complement():
    assert pack_int4(np.array([1, -1], np.int8)).tolist() == [0xF1]
    assert pack_int4(np.array([-8, 7, 3], np.int8)).tolist() == [0x78, 0x03]


def test_pack_refuses_values_outside_4_bits():
    with pytest.raises(ProgramError, match=r"range \[-9, 7\] — valid: \[-8, 7\]"):
        pack_int4(np.array([-9, 7], np.int8))


def _program(packed: bool, sizes=(3, 5), segment_bytes=None) -> Program:
    weights = np.resize(ALL, int(np.prod(sizes))).reshape(sizes)
    data = pack_int4(weights).tobytes() if packed else weights.tobytes()
    storage = ConstantStorage(0, 0, PACKING_INT4 if packed else 0)
    values = (
        TensorValue(ScalarType.INT8, sizes, storage=storage),                 # 0 weight
        TensorValue(ScalarType.FLOAT32, (sizes[0],), storage=ArenaStorage(0, 0)),  # 1 scales
        NoneValue(), IntValue(0), IntValue(-7), IntValue(7),                  # 2-5
        ScalarTypeValue(ScalarType.INT8), NoneValue(),                        # 6-7
        TensorValue(ScalarType.FLOAT32, sizes, storage=ArenaStorage(0, 64)),  # 8 out
    )
    method = Method("forward", values, (1,), (8,),
                    (KernelCall(0, (0, 1, 2, 3, 4, 5, 6, 7, 8)),),
                    (Operator("quantized_decomposed::dequantize_per_channel", "out"),),
                    MemoryPlan((4096,)))
    return Program(methods=(method,), segments=(Segment(segment_bytes or data),))


def test_packed_program_round_trips_as_version_2():
    program = _program(True)
    data = to_bytes(program)
    assert struct.unpack_from("<I", data, 8)[0] == 2
    loaded = from_bytes(data)
    weight = loaded.method("forward").values[0]
    assert weight.storage.packing == PACKING_INT4 and weight.stored_nbytes == 8
    array = constant_array(loaded, weight)
    np.testing.assert_array_equal(array, np.resize(ALL, 15).reshape(3, 5))
    assert not array.flags.writeable
    assert describe(loaded)["format_version"] == 2
    assert describe(loaded)["methods"][0]["constants"][0]["packing"] == "int4"


def test_unpacked_program_stays_version_1():
    assert struct.unpack_from("<I", to_bytes(_program(False)), 8)[0] == 1


def test_the_lean_runtime_reads_packed_weights():
    from opforge.runtime import load

    program = _program(True)
    scales = np.array([0.5, 1.0, 2.0], np.float32)
    (out,) = load(program).method()(scales)
    want = np.resize(ALL, 15).reshape(3, 5).astype(np.float32) * scales[:, None]
    np.testing.assert_array_equal(out, want)


def _with_version(data: bytes, version: int) -> bytes:
    return data[:8] + struct.pack("<I", version) + data[12:]


def test_a_version_1_file_with_a_packed_constant_is_refused():
    data = _with_version(to_bytes(_program(True)), 1)
    with pytest.raises(ProgramError, match="an int4-packed constant in a version-1 file"):
        from_bytes(data)


def test_packing_needs_int8():
    with pytest.raises(ProgramError, match="int4 packing of a float32 tensor"):
        TensorValue(ScalarType.FLOAT32, (4,), storage=ConstantStorage(0, 0, PACKING_INT4))


def test_unknown_packing_is_refused():
    with pytest.raises(ProgramError, match="packing"):
        ConstantStorage(0, 0, 3)


def test_placement_uses_the_packed_size():
    with pytest.raises(ProgramError, match=r"bytes \[0, 8\) .* which has 7 bytes"):
        to_bytes(_program(True, segment_bytes=bytes(7)))


def test_an_unknown_storage_kind_is_refused():
    data = bytearray(to_bytes(_program(True)))
    # the first tensor's storage-kind byte: tag, dtype, rank, kind
    meta = bytes(data[64:])
    at = 64 + meta.index(bytes([F.TAG_TENSOR, int(ScalarType.INT8), 2, F.STORAGE_CONSTANT_INT4])) + 3
    data[at] = 9
    header = F.HEADER.unpack_from(data, 0)
    crc = zlib.crc32(bytes(data[64:64 + header[5]]))
    struct.pack_into("<I", data, 40, crc)
    with pytest.raises(ProgramError, match=r"kind 9,.*3 \(constant, int4-packed; format version 2\)"):
        from_bytes(bytes(data))
