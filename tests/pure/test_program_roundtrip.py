"""Round trips of the program file: dataclasses → bytes → dataclasses, save → load (mmap)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import opforge.program as P
from opforge.errors import ProgramError
from opforge.program._sample import chain_program, sample_program

ROOT = Path(__file__).resolve().parents[2]


def test_smoke_public_api():
    program = P.Program(methods=(P.Method("forward", (P.IntValue(1),), (0,), (0,), ()),))
    assert P.from_bytes(P.to_bytes(program)) == program


def test_sample_round_trip_bytes():
    program = sample_program()
    data = P.to_bytes(program)
    again = P.from_bytes(data)
    assert again == program
    assert P.to_bytes(again) == data


def test_save_load_round_trip_is_memory_mapped(tmp_path):
    program = sample_program()
    path = tmp_path / "model.opf"
    P.save(program, path)
    loaded = P.load(path)
    assert loaded == program
    weight = loaded.method("forward").values[1]
    array = P.constant_array(loaded, weight)
    np.testing.assert_array_equal(array, np.arange(12, dtype=np.float32).reshape(3, 4) / 10)
    assert not array.flags.writeable
    with pytest.raises(ValueError):
        array[0, 0] = 1.0
    base = array  # walk the view chain down to the mmap the loader created
    while getattr(base, "base", None) is not None:
        base = base.base
    assert isinstance(getattr(base, "obj", base), __import__("mmap").mmap)


def test_segments_are_64_byte_aligned_in_the_file():
    data = P.to_bytes(sample_program())
    loaded = P.from_bytes(data)
    start = np.frombuffer(data, np.uint8).ctypes.data
    for segment in loaded.segments:
        assert (np.frombuffer(segment.data, np.uint8).ctypes.data - start) % 64 == 0


def test_from_bytes_does_not_copy_segments():
    data = bytearray(P.to_bytes(sample_program()))
    loaded = P.from_bytes(data)
    view = np.frombuffer(loaded.segments[0].data, np.uint8)
    assert np.shares_memory(view, np.frombuffer(data, np.uint8))


def test_save_is_atomic_when_writing_fails(tmp_path, monkeypatch):
    path = tmp_path / "model.opf"
    P.save(P.Program(methods=()), path)
    before = path.read_bytes()

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", crash)
    with pytest.raises(ProgramError, match=r"cannot write it \(disk full\)"):
        P.save(sample_program(), path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.opf"]


def test_save_refuses_an_invalid_program_and_writes_nothing(tmp_path):
    bad = P.Program(methods=(P.Method("forward", (), (3,), (), ()),))
    with pytest.raises(ProgramError, match=r"save\(.*inputs\[0\]"):
        P.save(bad, tmp_path / "bad.opf")
    assert list(tmp_path.iterdir()) == []


def test_constant_array_honors_dim_order():
    data = np.arange(6, dtype=np.int32)  # physical (3, 2) layout of a logical (2, 3) tensor
    program = P.Program(methods=(), segments=(P.Segment(data),))
    tensor = P.TensorValue(P.ScalarType.INT32, (2, 3), (1, 0), P.ConstantStorage(0, 0))
    np.testing.assert_array_equal(P.constant_array(program, tensor),
                                  data.reshape(3, 2).T)


def test_large_program_loads_in_milliseconds():
    import time

    data = P.to_bytes(chain_program(2000))
    start = time.perf_counter()
    program = P.from_bytes(data)
    elapsed = time.perf_counter() - start
    assert len(program.methods[0].instructions) == 2000
    assert elapsed < 1.0, f"loading 2000 instructions took {elapsed:.3f}s"


def test_describe_is_json_and_counts_operator_calls():
    summary = P.describe(sample_program())
    json.dumps(summary)
    forward = summary["methods"][0]
    assert [o["key"] for o in forward["operators"]] == [
        "aten::linear.out", "my_ops::relu6.out", "aten::cat.out"]
    assert all(o["calls"] == 1 for o in forward["operators"])
    assert forward["instructions"][0]["text"] == "aten::linear.out(%0, %1, %2, %3)"
    assert forward["memory_plan"] == {"arena_sizes": [320, 48], "total_bytes": 368}
    assert [c["value"] for c in forward["constants"]] == [1, 2]
    assert summary["delegates"][0]["compile_specs"] == {"target": 6, "opt": 1}
    assert summary["user_metadata"] == {"model": "tiny", "exporter": "opforge 0.1.0"}


def test_public_api_matches_the_documented_surface():
    doc = (ROOT / "docs" / "program-format.md").read_text()
    section = doc.split("## Python API", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"^- `([A-Za-z_][A-Za-z0-9_]*)", section, re.M))
    assert documented == set(P.__all__)
    assert all(hasattr(P, name) for name in P.__all__)


def test_program_package_imports_without_torch():
    code = ("import sys; sys.modules['torch'] = None\n"
            "import opforge.program as P\n"
            "from opforge.program._sample import sample_program\n"
            "assert P.from_bytes(P.to_bytes(sample_program())) == sample_program()\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


# --- property-based round trip over random valid programs -----------------------------

_SCALAR_TYPES = st.sampled_from(list(P.ScalarType))
_I64 = st.integers(-(2**63), 2**63 - 1)
_FLOATS = st.floats(allow_nan=False)


@st.composite
def _methods(draw, name: str, n_segments: int, n_delegates: int) -> P.Method:
    arena = draw(st.integers(1024, 4096))  # every tensor below fits (≤ 4*4*4*16 bytes)
    values: list = []
    for _ in range(draw(st.integers(1, 8))):
        dtype = draw(_SCALAR_TYPES)
        sizes = tuple(draw(st.lists(st.integers(0, 4), max_size=3)))
        order = tuple(draw(st.permutations(range(len(sizes)))))
        nbytes = int(np.prod(sizes, dtype=np.int64)) * dtype.itemsize
        slots = max(0, (arena - nbytes) // 64)
        storage = (P.ArenaStorage(0, 64 * draw(st.integers(0, slots)))
                   if nbytes <= arena else None)
        if nbytes == 0 and draw(st.booleans()):
            storage = None
        values.append(P.TensorValue(dtype, sizes, order, storage))
    n_tensors = len(values)
    tensor_index = st.integers(0, n_tensors - 1)
    values += draw(st.lists(st.one_of(
        st.builds(P.IntValue, _I64), st.builds(P.DoubleValue, _FLOATS),
        st.builds(P.BoolValue, st.booleans()), st.builds(P.StringValue, st.text(max_size=8)),
        st.just(P.NoneValue()), st.builds(P.IntListValue, st.lists(_I64, max_size=4)),
        st.builds(P.DoubleListValue, st.lists(_FLOATS, max_size=4)),
        st.builds(P.BoolListValue, st.lists(st.booleans(), max_size=4)),
        st.builds(P.TensorListValue, st.lists(tensor_index, max_size=4)),
        st.builds(P.OptionalTensorListValue,
                  st.lists(st.one_of(st.none(), tensor_index), max_size=4)),
        st.builds(P.ScalarTypeValue, _SCALAR_TYPES),
    ), max_size=8))
    index = st.integers(0, len(values) - 1)
    ops = tuple(P.Operator(f"ns::op{i}", draw(st.sampled_from(["", "out", "Tensor_out"])))
                for i in range(draw(st.integers(0, 3))))
    kinds = [st.builds(P.Move, tensor_index, tensor_index), st.builds(P.Free, tensor_index)]
    if ops:
        kinds.append(st.builds(P.KernelCall, st.integers(0, len(ops) - 1),
                               st.lists(index, max_size=5)))
    if n_delegates:
        kinds.append(st.builds(P.DelegateCall, st.integers(0, n_delegates - 1),
                               st.lists(index, max_size=5)))
    return P.Method(
        name=name, values=tuple(values),
        inputs=tuple(draw(st.lists(tensor_index, max_size=3, unique=True))),
        outputs=tuple(draw(st.lists(tensor_index, max_size=3))),
        instructions=tuple(draw(st.lists(st.one_of(kinds), max_size=10))),
        operators=ops, memory_plan=P.MemoryPlan((arena,)),
    )


@st.composite
def programs(draw) -> P.Program:
    segments = tuple(P.Segment(draw(st.binary(max_size=100))) for _ in range(draw(
        st.integers(0, 3))))
    delegates = tuple(
        P.DelegateBlob(draw(st.text(min_size=1, max_size=6)),
                       draw(st.integers(0, len(segments) - 1)),
                       tuple(draw(st.lists(st.tuples(st.text(max_size=5), st.binary(max_size=5)),
                                           max_size=2))))
        for _ in range(draw(st.integers(0, 2)) if segments else 0))
    names = draw(st.lists(st.text(min_size=1, max_size=8), unique=True, max_size=3))
    methods = tuple(draw(_methods(n, len(segments), len(delegates))) for n in names)
    meta = draw(st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3))
    return P.Program(methods, segments, delegates, meta)


@settings(max_examples=150, deadline=None)
@given(programs())
def test_random_programs_round_trip(program):
    data = P.to_bytes(program)
    again = P.from_bytes(data)
    assert again == program
    assert P.to_bytes(again) == data
