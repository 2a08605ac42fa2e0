"""Memory bombs: arenas are bounded by their tensors (verifier) and by the memory limit
(loader, Method), so a tiny hostile file gets a ProgramError, never a raw MemoryError or a
real multi-gigabyte allocation."""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest

import opforge.program as P
import opforge.runtime.arena as arena_module
from opforge.errors import ProgramError
from opforge.runtime import Method, load
from opforge.runtime.arena import allocate_arenas
from opforge.runtime.limits import (
    DEFAULT_MAX_MEMORY, MAX_MEMORY_ENV, max_memory, memory_limit, parse_size,
)

F32 = P.ScalarType.FLOAT32


def _program(arena_sizes, *placements, sizes=(4,)) -> P.Program:
    """x -> neg -> y, x and y at ``placements`` ((mem_id, offset) each)."""
    (xm, xo), (ym, yo) = placements
    values = (P.TensorValue(F32, sizes, storage=P.ArenaStorage(xm, xo)),
              P.TensorValue(F32, sizes, storage=P.ArenaStorage(ym, yo)))
    return P.Program(methods=(P.Method(
        "forward", values, (0,), (1,), (P.KernelCall(0, (0, 1)),),
        (P.Operator("aten::neg", "out"),), P.MemoryPlan(tuple(arena_sizes))),))


class _NoAllocation:
    """Stands in for NumPy in the arena module: any allocation fails the test."""

    def __getattr__(self, name):
        if name in ("zeros", "empty", "full", "ones"):
            raise AssertionError(f"np.{name} called: memory was allocated")
        return getattr(np, name)


# --- the verifier: an arena is what its tensors need -------------------------------------

def test_an_arena_larger_than_its_tensors_is_refused():
    # tensors end at 64 + 16 = 80 -> 128 with the planner's 64-byte rounding
    P.verify(_program((128,), (0, 0), (0, 64)))
    big = _program((1 << 30,), (0, 0), (0, 64))
    with pytest.raises(ProgramError) as info:
        P.verify(big)
    message = str(info.value)
    assert "method 'forward' memory_plan.arena_sizes[0] — found 1073741824 bytes, but its " \
           "tensors end at byte 80" in message
    assert "at most 4096 bytes" in message
    with pytest.raises(ProgramError, match=r"from_bytes\(<\d+ bytes>\)`: .*arena_sizes\[0\] "
                                           r"— found 1073741824 bytes"):
        load(_with_arena_size(_program((4096,), (0, 0), (0, 64)), 4096, 1 << 30))


def _with_arena_size(program: P.Program, old: int, new: int) -> bytes:
    """The file of ``program`` with arena size ``old`` patched to ``new`` (CRC fixed): what
    a hostile writer produces, bypassing the writer's own verification."""
    data = bytearray(P.to_bytes(program))
    size = struct.unpack_from("<Q", data, 32)[0]
    metadata = data[64:64 + size]
    assert metadata.count(struct.pack("<q", old)) == 1
    data[64:64 + size] = metadata.replace(struct.pack("<q", old), struct.pack("<q", new))
    struct.pack_into("<I", data, 40, zlib.crc32(data[64:64 + size]))
    return bytes(data)


def test_the_bound_is_exact_past_one_page():
    # tensors ending at 64 + 10_000 bytes: the arena may be 10_112 (64-rounded), not 10_113
    sizes = (2500,)
    P.verify(_program((10_112,), (0, 0), (0, 64), sizes=sizes))
    for size in (10_113, 10_176, 1 << 40):
        with pytest.raises(ProgramError, match="at most 10112 bytes"):
            P.verify(_program((size,), (0, 0), (0, 64), sizes=sizes))
    # every placement at offset 0: the planner's alignment is unknown, a page at most
    P.verify(_program((12_288,), (0, 0), (0, 0), sizes=sizes))
    with pytest.raises(ProgramError, match="at most 12288 bytes"):
        P.verify(_program((12_352,), (0, 0), (0, 0), sizes=sizes))


def test_each_arena_is_bounded_by_its_own_tensors():
    P.verify(_program((128, 64), (0, 0), (1, 0)))
    with pytest.raises(ProgramError, match=r"arena_sizes\[1\] — found 8192 bytes, but no "
                                           r"tensor is placed in it"):
        P.verify(_program((128, 8192), (0, 0), (0, 64)))


def test_a_planner_with_a_larger_alignment_still_passes():
    # export(alignment=256) places at multiples of 256 and rounds the arena to 256
    sizes = (1100,)  # 4400 bytes
    P.verify(_program((4608,), (0, 0), (0, 0), sizes=sizes))  # align_up(4400, 256)
    with pytest.raises(ProgramError):
        P.verify(_program((4608,), (0, 64), (0, 0), sizes=sizes))  # 64-aligned: 4480 at most


# --- the memory limit ---------------------------------------------------------------------

def _huge(nbytes: int) -> P.Program:
    """One float32 tensor of ``nbytes`` bytes, copied by a Move: a consistent plan."""
    x = P.TensorValue(F32, (nbytes // 4,), storage=P.ArenaStorage(0, 0))
    return P.Program(methods=(P.Method("forward", (x,), (0,), (0,), (),
                                       memory_plan=P.MemoryPlan((nbytes,))),))


def test_a_tiny_file_asking_for_a_terabyte_is_refused_at_load():
    data = P.to_bytes(_huge(1 << 40))
    assert len(data) < 400
    with pytest.raises(ProgramError) as info:
        load(data)
    message = str(info.value)
    assert "method 'forward' memory plan (1 arena(s)) — needs 1099511627840 bytes (1.0 TiB)" \
        in message
    assert f"at most the memory limit, {DEFAULT_MAX_MEMORY} bytes (8.0 GiB)" in message
    assert f"load(..., max_memory=N) or {MAX_MEMORY_ENV}=N" in message


def test_over_the_limit_is_refused_without_allocating(monkeypatch):
    monkeypatch.setattr(arena_module, "np", _NoAllocation())
    program = _huge(2 << 20)
    with pytest.raises(ProgramError, match=r"needs 2097216 bytes .* at most the memory limit, "
                                           r"1048576 bytes"):
        load(program, max_memory=1 << 20)
    with pytest.raises(ProgramError, match="memory limit, 1048576 bytes"):
        allocate_arenas(program.methods[0], limit=1 << 20)
    with memory_limit(1 << 20), pytest.raises(ProgramError, match="memory limit"):
        Method(program, program.methods[0], (None,))


def test_the_environment_variable_sets_the_default(monkeypatch):
    program = _huge(2 << 20)
    monkeypatch.setenv(MAX_MEMORY_ENV, "1M")
    assert max_memory() == 1 << 20
    with pytest.raises(ProgramError, match="1048576 bytes"):
        load(program)
    loaded = load(program, max_memory=4 << 20)  # an explicit limit wins
    assert loaded.max_memory == 4 << 20
    x = np.arange(2 << 18, dtype=np.float32)
    np.testing.assert_array_equal(loaded.method()(x)[0], x)
    monkeypatch.setenv(MAX_MEMORY_ENV, "3MiB")
    loaded = load(program)
    assert loaded.max_memory == 3 << 20
    loaded.method()
    monkeypatch.setenv(MAX_MEMORY_ENV, "plenty")
    with pytest.raises(ProgramError, match=f"environment variable {MAX_MEMORY_ENV} — found "
                                           "'plenty'"):
        load(program)


def test_the_limit_of_a_load_applies_to_its_methods(monkeypatch):
    program = _huge(2 << 20)
    loaded = load(program, max_memory=3 << 20)
    monkeypatch.setenv(MAX_MEMORY_ENV, "1M")  # a later, smaller default does not apply
    loaded.method()


@pytest.mark.parametrize("bad", [0, -1, 1.5, "8G", True])
def test_a_bad_max_memory_is_a_program_error(bad):
    with pytest.raises(ProgramError, match="max_memory — found"):
        load(_huge(64), max_memory=bad)


def test_parse_size():
    assert parse_size("123") == 123
    assert parse_size("512k") == 512 << 10
    assert parse_size("16G") == parse_size("16GiB") == parse_size("16gb") == 16 << 30
    assert parse_size(" 2 T ") == 2 << 40
    for bad in ("", "1.5G", "-1", "G", "16X"):
        with pytest.raises(ValueError):
            parse_size(bad)


def test_a_system_memory_error_becomes_a_program_error(monkeypatch):
    class _Exhausted(_NoAllocation):
        def __getattr__(self, name):
            if name == "zeros":
                def zeros(*args, **kwargs):
                    raise MemoryError("simulated")
                return zeros
            return getattr(np, name)

    monkeypatch.setattr(arena_module, "np", _Exhausted())
    with pytest.raises(ProgramError, match="which the system could not allocate"):
        allocate_arenas(_huge(4096).methods[0])


def test_an_empty_tensor_whose_other_sizes_overflow_is_refused_at_read():
    # found by fuzz/exec_fuzz.py: sizes (1, 2**62 + 4, 0, 5) hold no bytes, but NumPy
    # cannot shape such an array ("array is too big", a raw ValueError at bind)
    from opforge.program import ScalarType, TensorValue

    with pytest.raises(ProgramError, match="zero sizes counted as 1"):
        TensorValue(ScalarType.INT64, (1, 2**62 + 4, 0, 5))
    assert TensorValue(ScalarType.INT64, (1, 2**20, 0, 5)).nbytes == 0
