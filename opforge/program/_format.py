"""Wire constants of the program file, format version 3 (docs/program-format.md is the spec).

Layout::

    0        header (64 bytes, little-endian, _HEADER below)
    64       metadata (metadata_size bytes; the tables, see encode.py / decode.py)
    ...      zero padding up to data_offset (a multiple of 64)
    data_offset + segment.offset   each segment's bytes; every offset is a multiple of 64

The encoder and decoder import these names and nothing else about the layout, so this
module and the document are the two places the format is written down.
"""

from __future__ import annotations

import struct

MAGIC = b"\x89OPF\r\n\x1a\n"  # PNG's trick: catches 7-bit and newline-translating copies
# The newest version this library reads and writes. A file is written with the lowest
# version that can express it (version 1 unless a constant is packed (2) or a method has
# symbolic sizes or state (3), a growing symbol (4), a splat constant (5), or named data
# (6)), so older readers keep reading every program they can run.
FORMAT_VERSION = 6
MIN_FORMAT_VERSION = 1
ALIGNMENT = 64

# magic, format_version, header_size, file_size, metadata_offset, metadata_size,
# metadata_crc32, flags, data_offset, reserved
HEADER = struct.Struct("<8sIIQQQIIQQ")
HEADER_SIZE = HEADER.size
assert HEADER_SIZE == 64

# Value tags (u8)
TAG_NONE = 0
TAG_INT = 1
TAG_DOUBLE = 2
TAG_BOOL = 3
TAG_STRING = 4
TAG_INT_LIST = 5
TAG_DOUBLE_LIST = 6
TAG_BOOL_LIST = 7
TAG_TENSOR = 8
TAG_TENSOR_LIST = 9
TAG_OPTIONAL_TENSOR_LIST = 10
TAG_SCALAR_TYPE = 11

# Tensor storage kinds (u8)
STORAGE_NONE = 0
STORAGE_ARENA = 1
STORAGE_CONSTANT = 2
STORAGE_CONSTANT_INT4 = 3  # version 2: a constant of signed 4-bit values, two per byte
STORAGE_CONSTANT_SPLAT = 4  # version 5: one element, repeated (a state's uniform initial value)

# Instruction kinds (u8)
INSTR_KERNEL_CALL = 0
INSTR_DELEGATE_CALL = 1
INSTR_MOVE = 2
INSTR_FREE = 3

# An absent entry of an OptionalTensorListValue (u32)
NO_VALUE = 0xFFFF_FFFF


def align(n: int) -> int:
    """Round ``n`` up to the next multiple of ALIGNMENT."""
    return (n + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT
