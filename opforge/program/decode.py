"""Bytes → Program: ``from_bytes`` and ``load`` (memory-mapped), both verified.

Order of checks: the header (magic, version, sizes, the metadata CRC-32) before the
metadata is parsed; the metadata with a bounds-checked reader; the segment table against
the file; then ``verify``. Any failure is a ProgramError whose message names the field,
where it was, what was found and what is valid. Segments are zero-copy slices of the
input buffer (``from_bytes``) or of a read-only memory map (``load``).
"""

from __future__ import annotations

import dataclasses
import mmap
import os
import stat
import struct
import weakref
import zlib

from opforge._user_files import file_kind, os_error_text, require_regular_file
from opforge.errors import ProgramError
from opforge.program import _format as F
from opforge.program._errors import program_error, with_api
from opforge.program._reader import Reader
from opforge.program.file_guard import FileWatch
from opforge.program.model import (
    DelegateBlob, DelegateCall, Free, KernelCall, MemoryPlan, Method, Move, NamedData, Operator,
    Program, Segment,
)
from opforge.program.scalar_type import ScalarType
from opforge.program.symbolic import Guard, SizeExpr, StateSlot, Symbol, SymbolicValue
from opforge.program.values import (
    MAX_RANK, PACKING_INT4, PACKING_SPLAT, ArenaStorage, BoolListValue, BoolValue, ConstantStorage, DoubleListValue,
    DoubleValue, IntListValue, IntValue, NoneValue, OptionalTensorListValue, ScalarTypeValue,
    StringValue, TensorListValue, TensorValue,
)
from opforge.program.verify import check_program

__all__ = ["from_bytes", "load"]

_REEXPORT = "re-export the model with this opforge version"


def from_bytes(buf: bytes | bytearray | memoryview, *, allow_unplanned: bool = False) -> Program:
    """Decode and verify a program file held in memory.

    Segments are views into ``buf`` (no copy): do not modify a bytearray afterwards.

    >>> from opforge.program import Program, Method, to_bytes
    >>> from_bytes(to_bytes(Program(methods=(Method("forward", (), (), (), ()),)))).methods[0].name
    'forward'
    """
    view = memoryview(buf)
    try:
        view = view.cast("B") if view.format != "B" or view.ndim != 1 else view
        return _decode(view.toreadonly(), allow_unplanned)
    except ProgramError as e:
        raise with_api(f"opforge.program.from_bytes(<{len(view)} bytes>)", e) from None
    except TypeError as e:  # a non-contiguous buffer
        raise ProgramError(f"`opforge.program.from_bytes()`: buf — {e} — valid: a "
                           "C-contiguous bytes-like object") from None


def load(path: str | os.PathLike, *, allow_unplanned: bool = False) -> Program:
    """Map the file at ``path`` read-only, decode and verify it.

    Constants are never copied: ``Segment.data`` are views into the mapping, which lives as
    long as any of them. Replace a loaded file by renaming a new one over it (``save``
    does): a file changed in place while loaded (``cp new.opf old.opf``) is refused by the
    runtime's next call with ``ProgramError``, never a crash (``file_guard.py``).
    """
    api = f"opforge.program.load({os.fspath(path)!r})"
    try:
        with _open_regular(path) as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                raise program_error("file", "an empty file (0 bytes)",
                                    f"a program file of at least {F.HEADER_SIZE} bytes",
                                    "the export did not finish; re-export the model")
            mapping = ProgramMapping.of(f.fileno(), os.fspath(path))
        return _decode(memoryview(mapping).toreadonly(), allow_unplanned)
    except ProgramError as e:
        raise with_api(api, e) from None
    except OSError as e:
        raise ProgramError(f"`{api}`: file {os_error_text(e, path, 'read')}") from e


class ProgramMapping(mmap.mmap):
    """A program file mapped read-only, with ``fd``: the file itself, open for as long as
    the mapping lives (a backend may read a constant's bytes with ``os.pread`` instead of
    through the mapping, so that they never become the process's resident pages), and
    ``watch``: what the file was at load, for the runtime to notice a change under it
    (``file_guard.py``: a file changed in place after load is refused, never a crash)."""

    fd: int
    watch: FileWatch

    @classmethod
    def of(cls, fileno: int, path: str = "") -> "ProgramMapping":
        mapping = cls(fileno, 0, access=mmap.ACCESS_READ)
        mapping.fd = os.dup(fileno)  # close-on-exec, as every descriptor Python makes
        # closed with the mapping, but not at exit: a daemon thread may still read through it
        # (and a number closed early could be reused for another file)
        weakref.finalize(mapping, os.close, mapping.fd).atexit = False
        mapping.watch = FileWatch(mapping, mapping.fd, path or f"<fd {fileno}>")
        return mapping


def _open_regular(path: str | os.PathLike):
    """Open ``path`` for reading only if it is a regular file.

    A FIFO would block open() until a writer appears, and a device may act on being
    opened: both are refused from os.stat, before any open. The open itself is
    non-blocking and checked again with fstat, so a path swapped for a FIFO in between
    cannot block either.
    """
    kind = require_regular_file(path)
    if kind is None:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        mode = os.fstat(fd).st_mode
        if stat.S_ISREG(mode):
            os.set_blocking(fd, True)
            return os.fdopen(fd, "rb")
        os.close(fd)
        kind = file_kind(mode)
    raise program_error("file", f"{os.fspath(path)} is {kind}", "a regular file (a program "
                        "written by opforge.program.save)", "pass the path of the .opf file "
                        "itself; to read a pipe or a socket, read its bytes and call "
                        "opforge.program.from_bytes(data)")


def _decode(buf: memoryview, allow_unplanned: bool) -> Program:
    metadata_offset, metadata_size, data_offset, version = _check_header(buf)
    r = Reader(buf[metadata_offset:metadata_offset + metadata_size], metadata_offset)
    methods = tuple(_method(r, i, version) for i in range(_in("methods", r.count, 1)))
    segments = _segments(r, buf, data_offset)
    delegates = tuple(_in(f"delegates[{i}]", _delegate, r)
                      for i in range(_in("delegates", r.count, 13)))
    meta = tuple(_in(f"user_metadata[{i}]", lambda: (r.string(), r.string()))
                 for i in range(_in("user_metadata", r.count, 8)))
    named = tuple(_in(f"named_data[{i}]", lambda: NamedData(r.string(), r.u32()))
                  for i in range(_in("named_data", r.count, 8))) if version >= 6 else ()
    r.expect_end()
    program = _in("program", Program, methods, segments, delegates, meta, named)
    if version < 5:
        _refuse_newer_packings(program, version)
    check_program(program, allow_unplanned)
    return program


_PACKING_SINCE = {PACKING_INT4: (2, "an int4-packed constant"),
                  PACKING_SPLAT: (5, "a splat constant")}


def _refuse_newer_packings(program: Program, version: int) -> None:
    for method in program.methods:
        for i, v in enumerate(method.values):
            if type(v) is TensorValue and type(v.storage) is ConstantStorage and v.storage.packing:
                since, what = _PACKING_SINCE[v.storage.packing]
                if version < since:
                    raise program_error(
                        f"method {method.name!r} values[{i}].storage",
                        f"{what} in a version-{version} file",
                        f"{what[2:]}s only in format version {since} or later",
                        "the file is corrupt; re-export it")


def _in(what: str, fn, *args):
    """``fn(*args)``, with ``what`` (the field being decoded) prefixed to any ProgramError."""
    try:
        return fn(*args)
    except ProgramError as e:
        raise ProgramError(f"{what}: {e}") from None


def _delegate(r: Reader) -> DelegateBlob:
    blob_id, segment = r.string(), r.u32()
    specs = tuple((r.string(), r.raw()) for _ in range(r.count(8)))
    return DelegateBlob(blob_id, segment, specs)


def _check_header(buf: memoryview) -> tuple[int, int, int, int]:
    size = len(buf)
    if size == 0:
        raise program_error("file", "an empty file (0 bytes)",
                            f"a program file of at least {F.HEADER_SIZE} bytes",
                            "the export did not finish; re-export the model")
    if bytes(buf[:len(F.MAGIC)]) != F.MAGIC[:size]:
        raise program_error("header.magic", repr(bytes(buf[:len(F.MAGIC)])),
                            f"{F.MAGIC!r} (an opforge program file)",
                            "pass a file written by opforge.program.save()")
    if size < F.HEADER_SIZE:
        raise program_error("header", f"a truncated file of {size} bytes",
                            f"at least the {F.HEADER_SIZE}-byte header", _REEXPORT)
    (_, version, header_size, file_size, metadata_offset, metadata_size, crc, flags,
     data_offset, reserved) = F.HEADER.unpack_from(buf, 0)
    if version > F.FORMAT_VERSION or version < F.MIN_FORMAT_VERSION:
        newer = version > F.FORMAT_VERSION
        raise program_error(
            "header.format_version", f"version {version}" + (" (newer)" if newer else ""),
            f"versions {F.MIN_FORMAT_VERSION}..{F.FORMAT_VERSION}",
            "upgrade opforge to load this file" if newer else _REEXPORT)
    checks = [
        ("header.header_size", header_size, header_size == F.HEADER_SIZE, str(F.HEADER_SIZE)),
        ("header.flags", flags, flags == 0, "0 (no flags are defined in versions 1 to 6)"),
        ("header.reserved", reserved, reserved == 0, "0"),
        ("header.file_size", f"{file_size} but the file has {size} bytes "
         + ("(truncated)" if size < file_size else "(trailing bytes)"), file_size == size,
         "the file's real length"),
        ("header.metadata_offset", metadata_offset, metadata_offset == F.HEADER_SIZE,
         f"{F.HEADER_SIZE} (right after the header)"),
        ("header.data_offset", data_offset,
         data_offset % F.ALIGNMENT == 0 and F.HEADER_SIZE <= data_offset <= file_size,
         f"a multiple of {F.ALIGNMENT} in [{F.HEADER_SIZE}, file_size={file_size}]"),
        ("header.metadata_size", metadata_size,
         metadata_offset + metadata_size <= data_offset,
         f"at most data_offset - metadata_offset = {data_offset - metadata_offset}"),
    ]
    for subject, found, ok, valid in checks:
        if not ok:
            fix = (_REEXPORT if subject != "header.file_size" else
                   "the file was cut short or appended to (an interrupted copy?); copy it again "
                   "or re-export it")
            raise program_error(subject, str(found), valid, fix)
    actual = zlib.crc32(buf[metadata_offset:metadata_offset + metadata_size])
    if actual != crc:
        raise program_error("header.metadata_crc32", f"{crc:#010x} but the metadata hashes to "
                            f"{actual:#010x}", "the CRC-32 of the metadata section",
                            "the file is corrupt; copy or re-export it")
    return metadata_offset, metadata_size, data_offset, version


def _segments(r: Reader, buf: memoryview, data_offset: int) -> tuple[Segment, ...]:
    segments = []
    for i in range(_in("segments", r.count, 16)):
        offset, size = _in(f"segments[{i}]", r.unpack, _SEGMENT)
        start = data_offset + offset
        if offset < 0 or offset % F.ALIGNMENT or size < 0 or start + size > len(buf):
            raise program_error(
                f"segments[{i}]", f"offset {offset}, size {size} (file bytes [{start}, "
                f"{start + size}))", f"a non-negative offset that is a multiple of "
                f"{F.ALIGNMENT} and bytes within the file ({len(buf)} bytes)", _REEXPORT)
        segments.append(Segment(buf[start:start + size]))
    return tuple(segments)


_SEGMENT = struct.Struct("<qq")


def _method(r: Reader, index: int, version: int) -> Method:
    name = _in(f"methods[{index}].name", r.string)
    where = f"method {name!r}"
    values = []
    append = values.append
    for i in range(_in(f"{where} values", r.count, 1)):
        try:
            append(_value(r))
        except ProgramError as e:
            raise ProgramError(f"{where} values[{i}]: {e}") from None
    inputs = _in(f"{where} inputs", r.counted, "I", 4)
    outputs = _in(f"{where} outputs", r.counted, "I", 4)
    operators = tuple(_in(f"{where} operators[{i}]", _operator, r)
                      for i in range(_in(f"{where} operators", r.count, 8)))
    plan = _in(f"{where} memory_plan", lambda: MemoryPlan(r.counted("q", 8)))
    instructions = []
    append = instructions.append
    for i in range(_in(f"{where} instructions", r.count, 5)):
        try:
            append(_instruction(r))
        except ProgramError as e:
            raise ProgramError(f"{where} instructions[{i}]: {e}") from None
    extra = _in(f"{where} symbolic sizes", _symbolic, r, version) if version >= 3 \
        else ((), (), (), ())
    return _in(where, Method, name, tuple(values), inputs, outputs, tuple(instructions),
               operators, plan, *extra)


def _symbolic(r: Reader, version: int) -> tuple:
    """Version 3: symbols, symbolic values, guards and state slots; version 4: the growing
    symbols' indices (see encode._symbolic)."""
    symbols = tuple(Symbol(r.string(), *r.unpack(_PAIR)) for _ in range(r.count(20)))
    symbolic = []
    for _ in range(r.count(8)):
        value, count = r.unpack(_PAIR32)
        if count > MAX_RANK:
            raise program_error("symbolic value", f"{count} expressions", f"at most {MAX_RANK}")
        symbolic.append(SymbolicValue(value, tuple(SizeExpr.parse(r.string())
                                                   for _ in range(count))))
    guards = tuple(Guard(SizeExpr.parse(r.string()), r.string(), SizeExpr.parse(r.string()))
                   for _ in range(r.count(12)))
    state = tuple(StateSlot(r.string(), r.u32()) for _ in range(r.count(8)))
    if version >= 4:
        growing = [r.u32() for _ in range(r.count(4))]
        for i in growing:
            if i >= len(symbols) or symbols[i].grow:
                raise program_error("growing symbol", f"index {i}",
                                    f"a symbol index below {len(symbols)}, each once")
            symbols = symbols[:i] + (dataclasses.replace(symbols[i], grow=True),) + symbols[i + 1:]
    return symbols, tuple(symbolic), guards, state


_PAIR = struct.Struct("<qq")
_PAIR32 = struct.Struct("<II")


def _operator(r: Reader) -> Operator:
    return Operator(r.string(), r.string())


_TWO_U32 = struct.Struct("<II")


def _instruction(r: Reader):
    kind = r.u8()
    if kind == F.INSTR_KERNEL_CALL:
        op = r.u32()
        return KernelCall(op, r.counted("I", 4))
    if kind == F.INSTR_DELEGATE_CALL:
        delegate = r.u32()
        return DelegateCall(delegate, r.counted("I", 4))
    if kind == F.INSTR_MOVE:
        return Move(*r.unpack(_TWO_U32))
    if kind == F.INSTR_FREE:
        return Free(r.u32())
    raise program_error("kind", f"kind {kind}", "0 KernelCall, 1 DelegateCall, 2 Move, 3 Free",
                        _REEXPORT)


# dtype, rank, storage kind, storage mem_id/segment, storage offset; then sizes, dim_order
_TENSOR_HEAD = struct.Struct("<BBBIq")
_TENSOR_BODY = tuple(struct.Struct(f"<{rank}q{rank}B") for rank in range(MAX_RANK + 1))
_DTYPES = {int(t): t for t in ScalarType}


def _value(r: Reader):
    tag = r.u8()
    if tag == F.TAG_TENSOR:
        dtype, rank, kind, index, offset = r.unpack(_TENSOR_HEAD)
        if rank > MAX_RANK:
            raise program_error("tensor rank", str(rank), f"at most {MAX_RANK}", _REEXPORT)
        fields = r.unpack(_TENSOR_BODY[rank])
        if kind == F.STORAGE_ARENA:
            storage = ArenaStorage(index, offset)
        elif kind == F.STORAGE_CONSTANT:
            storage = ConstantStorage(index, offset)
        elif kind == F.STORAGE_CONSTANT_INT4:
            storage = ConstantStorage(index, offset, PACKING_INT4)
        elif kind == F.STORAGE_CONSTANT_SPLAT:
            storage = ConstantStorage(index, offset, PACKING_SPLAT)
        elif kind == F.STORAGE_NONE and index == 0 and offset == 0:
            storage = None
        else:
            raise program_error("tensor storage", f"kind {kind}, index {index}, offset {offset}",
                                "kind 0 (none, index and offset 0), 1 (arena), 2 (constant), "
                                "3 (constant, int4-packed; format version 2), 4 (constant, "
                                "splat; format version 5)",
                                _REEXPORT)
        dtype = _DTYPES[dtype] if dtype in _DTYPES else ScalarType.parse(dtype)
        return TensorValue(dtype, fields[:rank], fields[rank:], storage)
    if tag == F.TAG_INT:
        return IntValue(r.i64())
    if tag == F.TAG_DOUBLE:
        return DoubleValue(r.f64())
    if tag == F.TAG_BOOL:
        return BoolValue(_bool(r.u8()))
    if tag == F.TAG_NONE:
        return NoneValue()
    if tag == F.TAG_STRING:
        return StringValue(r.string())
    if tag == F.TAG_SCALAR_TYPE:
        return ScalarTypeValue(ScalarType.parse(r.u8()))
    if tag == F.TAG_INT_LIST:
        return IntListValue(r.counted("q", 8))
    if tag == F.TAG_DOUBLE_LIST:
        return DoubleListValue(r.counted("d", 8))
    if tag == F.TAG_BOOL_LIST:
        return BoolListValue(tuple(_bool(b) for b in r.counted("B", 1)))
    if tag == F.TAG_TENSOR_LIST:
        return TensorListValue(r.counted("I", 4))
    if tag == F.TAG_OPTIONAL_TENSOR_LIST:
        items = r.counted("I", 4)
        return OptionalTensorListValue(tuple(None if i == F.NO_VALUE else i for i in items))
    raise program_error("tag", f"tag {tag}", "0..11 (see docs/program-format.md, Values)",
                        _REEXPORT)


def _bool(byte: int) -> bool:
    if byte > 1:
        raise program_error("bool", f"byte {byte}", "0 (False) or 1 (True)", _REEXPORT)
    return byte == 1
