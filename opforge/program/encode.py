"""Program → bytes: ``to_bytes`` and the atomic ``save``.

Both verify first, so opforge never writes a file it would refuse to load. The tables are
written field by field in the order docs/program-format.md lists them; segments follow the
metadata, each at a multiple of 64 bytes (``save`` streams them rather than joining them).
"""

from __future__ import annotations

import itertools
import os
import struct
import zlib
from pathlib import Path

from opforge._user_files import os_error_text, write_atomic
from opforge.errors import ProgramError
from opforge.program import _format as F
from opforge.program._errors import program_error, with_api
from opforge.program.model import (
    DelegateCall, Free, KernelCall, Method, Move, Program,
)
from opforge.program.values import (
    PACKING_INT4, PACKING_NONE, PACKING_SPLAT, ArenaStorage, BoolListValue, ConstantStorage,
    BoolValue, DoubleListValue, DoubleValue, IntListValue, IntValue, NoneValue, OptionalTensorListValue, ScalarTypeValue, StringValue,
    TensorListValue, TensorValue,
)
from opforge.program.verify import check_program

__all__ = ["to_bytes", "save"]


class _Writer:
    __slots__ = ("out",)

    def __init__(self) -> None:
        self.out = bytearray()

    def fmt(self, fmt: str, *fields: object) -> None:
        self.out += struct.pack(fmt, *fields)

    def array(self, code: str, items: tuple) -> None:
        self.out += struct.pack(f"<I{len(items)}{code}", len(items), *items)

    def raw(self, data: bytes) -> None:
        self.out += struct.pack("<I", len(data))
        self.out += data

    def string(self, text: str) -> None:
        self.raw(text.encode("utf-8"))


def _tensor(w: _Writer, v: TensorValue) -> None:
    storage, rank = v.storage, len(v.sizes)
    if storage is None:
        kind, index, offset = F.STORAGE_NONE, 0, 0
    elif isinstance(storage, ArenaStorage):
        kind, index, offset = F.STORAGE_ARENA, storage.mem_id, storage.offset
    else:
        kind = _CONSTANT_KINDS[storage.packing]
        index, offset = storage.segment, storage.offset
    w.fmt(f"<BBBBIq{rank}q{rank}B", F.TAG_TENSOR, int(v.dtype), rank, kind, index, offset,
          *v.sizes, *v.dim_order)


_CONSTANT_KINDS = {PACKING_NONE: F.STORAGE_CONSTANT, PACKING_INT4: F.STORAGE_CONSTANT_INT4,
                   PACKING_SPLAT: F.STORAGE_CONSTANT_SPLAT}

_VALUE_WRITERS = {
    TensorValue: _tensor,
    NoneValue: lambda w, v: w.fmt("<B", F.TAG_NONE),
    IntValue: lambda w, v: w.fmt("<Bq", F.TAG_INT, v.value),
    DoubleValue: lambda w, v: w.fmt("<Bd", F.TAG_DOUBLE, v.value),
    BoolValue: lambda w, v: w.fmt("<BB", F.TAG_BOOL, v.value),
    StringValue: lambda w, v: (w.fmt("<B", F.TAG_STRING), w.string(v.value)),
    IntListValue: lambda w, v: (w.fmt("<B", F.TAG_INT_LIST), w.array("q", v.values)),
    DoubleListValue: lambda w, v: (w.fmt("<B", F.TAG_DOUBLE_LIST), w.array("d", v.values)),
    BoolListValue: lambda w, v: (w.fmt("<B", F.TAG_BOOL_LIST), w.array("B", v.values)),
    TensorListValue: lambda w, v: (w.fmt("<B", F.TAG_TENSOR_LIST), w.array("I", v.items)),
    OptionalTensorListValue: lambda w, v: (
        w.fmt("<B", F.TAG_OPTIONAL_TENSOR_LIST),
        w.array("I", tuple(F.NO_VALUE if i is None else i for i in v.items)),
    ),
    ScalarTypeValue: lambda w, v: w.fmt("<BB", F.TAG_SCALAR_TYPE, int(v.dtype)),
}


def _method(w: _Writer, m: Method, version: int) -> None:
    w.string(m.name)
    w.fmt("<I", len(m.values))
    for value in m.values:
        _VALUE_WRITERS[type(value)](w, value)
    w.array("I", m.inputs)
    w.array("I", m.outputs)
    w.fmt("<I", len(m.operators))
    for op in m.operators:
        w.string(op.name)
        w.string(op.overload)
    w.array("q", m.memory_plan.arena_sizes)
    w.fmt("<I", len(m.instructions))
    for ins in m.instructions:
        kind = type(ins)
        if kind is KernelCall:
            w.fmt(f"<BII{len(ins.args)}I", F.INSTR_KERNEL_CALL, ins.op, len(ins.args), *ins.args)
        elif kind is DelegateCall:
            w.fmt(f"<BII{len(ins.args)}I", F.INSTR_DELEGATE_CALL, ins.delegate, len(ins.args),
                  *ins.args)
        elif kind is Move:
            w.fmt("<BII", F.INSTR_MOVE, ins.src, ins.dst)
        elif kind is Free:
            w.fmt("<BI", F.INSTR_FREE, ins.value)
        else:
            raise TypeError(f"not an instruction: {ins!r}")
    if version >= 3:
        _symbolic(w, m, version)


def _symbolic(w: _Writer, m: Method, version: int) -> None:
    """Version 3: symbols, symbolic values, guards and state slots of one method; version
    4 adds the indices of the growing symbols."""
    w.fmt("<I", len(m.symbols))
    for symbol in m.symbols:
        w.string(symbol.name)
        w.fmt("<qq", symbol.min, symbol.max)
    w.fmt("<I", len(m.symbolic_values))
    for sv in m.symbolic_values:
        w.fmt("<II", sv.value, len(sv.exprs))
        for expr in sv.exprs:
            w.string(str(expr))
    w.fmt("<I", len(m.guards))
    for guard in m.guards:
        w.string(str(guard.lhs))
        w.string(guard.relation)
        w.string(str(guard.rhs))
    w.fmt("<I", len(m.state))
    for slot in m.state:
        w.string(slot.name)
        w.fmt("<I", slot.value)
    if version >= 4:
        growing = [i for i, symbol in enumerate(m.symbols) if symbol.grow]
        w.fmt("<I", len(growing))
        for i in growing:
            w.fmt("<I", i)


def encode(program: Program) -> tuple[bytes, list[tuple[int, memoryview]]]:
    """Unverified encoding: (header + metadata + padding, [(file offset, segment bytes)]).

    Private: tests use it to build files that the verifier must refuse.
    """
    w = _Writer()
    try:
        version = format_version_of(program)
        w.fmt("<I", len(program.methods))
        for method in program.methods:
            _method(w, method, version)
        offsets, cursor = [], 0
        for segment in program.segments:
            offsets.append(cursor)
            cursor = F.align(cursor + segment.nbytes)
        w.fmt("<I", len(program.segments))
        for offset, segment in zip(offsets, program.segments):
            w.fmt("<qq", offset, segment.nbytes)
        w.fmt("<I", len(program.delegates))
        for blob in program.delegates:
            w.string(blob.id)
            w.fmt("<II", blob.segment, len(blob.compile_specs))
            for key, value in blob.compile_specs:
                w.string(key)
                w.raw(value)
        w.fmt("<I", len(program.user_metadata))
        for key, value in program.user_metadata:
            w.string(key)
            w.string(value)
        if version >= 6:
            w.fmt("<I", len(program.named_data))
            for named in program.named_data:
                w.string(named.key)
                w.fmt("<I", named.segment)
    except (struct.error, OverflowError, UnicodeEncodeError, KeyError, TypeError) as e:
        raise program_error(
            "program", f"a field that cannot be encoded ({type(e).__name__}: {e})",
            "a program that passes verify()", "call opforge.program.verify(program) first",
        ) from e
    metadata = bytes(w.out)
    data_offset = F.align(F.HEADER_SIZE + len(metadata))
    last = offsets[-1] + program.segments[-1].nbytes if program.segments else 0
    header = F.HEADER.pack(
        F.MAGIC, version, F.HEADER_SIZE, data_offset + last, F.HEADER_SIZE,
        len(metadata), zlib.crc32(metadata), 0, data_offset, 0,
    )
    head = header + metadata + bytes(data_offset - F.HEADER_SIZE - len(metadata))
    return head, [(data_offset + o, s.data) for o, s in zip(offsets, program.segments)]


def format_version_of(program: Program) -> int:
    """The lowest format version that expresses ``program``: 6 with named data, 5 with a
    splat constant, 4 with a growing symbol, 3 with symbolic sizes or state, 2 with
    int4-packed constants, else 1."""
    if program.named_data:
        return 6
    packings = {v.storage.packing for m in program.methods for v in m.values
                if type(v) is TensorValue and type(v.storage) is ConstantStorage}
    if PACKING_SPLAT in packings:
        return 5
    if any(s.grow for m in program.methods for s in m.symbols):
        return 4
    if any(m.symbols or m.symbolic_values or m.guards or m.state for m in program.methods):
        return 3
    return 2 if PACKING_INT4 in packings else 1


def _chunks(program: Program, api: str, allow_unplanned: bool):
    try:
        check_program(program, allow_unplanned)
        head, segments = encode(program)
    except ProgramError as e:
        raise with_api(api, e) from None
    yield head
    cursor = len(head)
    for offset, data in segments:
        yield bytes(offset - cursor)
        yield data
        cursor = offset + data.nbytes


def to_bytes(program: Program, *, allow_unplanned: bool = False) -> bytes:
    """Verify ``program`` and return its file bytes.

    >>> from opforge.program import Program, Method, from_bytes
    >>> p = Program(methods=(Method("forward", (), (), (), ()),))
    >>> from_bytes(to_bytes(p)) == p
    True
    """
    return b"".join(_chunks(program, "opforge.program.to_bytes()", allow_unplanned))


def save(program: Program, path: str | os.PathLike, *, allow_unplanned: bool = False) -> None:
    """Verify ``program`` and write it to ``path`` atomically.

    The bytes go to a temporary file in the same directory, are flushed to disk, and the
    file is renamed over ``path`` (``os.replace``): a crash leaves the old file or the new
    one, never half of one. A process that has the old file loaded keeps its mapping. An
    existing file keeps its permission bits; a new one gets ``0o666 & ~umask``. A failure
    to write (missing directory, full disk, no permission) is a ProgramError naming
    ``path``.
    """
    path = Path(path)
    api = f"opforge.program.save({str(path)!r})"
    chunks = _chunks(program, api, allow_unplanned)
    head = next(chunks)  # verifies before any file is created
    try:
        write_atomic(path, itertools.chain((head,), chunks))
    except OSError as e:
        raise ProgramError(f"`{api}`: file {os_error_text(e, path, 'write')}") from e
