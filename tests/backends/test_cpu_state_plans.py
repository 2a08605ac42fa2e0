"""Hand-built plans for the engine's indexing ops and program state (``index``,
``index_put``, ``index_copy``; state inputs written in place), in child processes as in
test_cpu_hostile_plans.py (whose plan builder and runner they use); test_cpu_sanitized.py
runs them under AddressSanitizer and UndefinedBehaviorSanitizer too.

The contract under test: the engine writes a delegate input only when the blob marks it as
program state; every index is checked before anything is written, negative ones counted
from the end where ATen does (``index``, ``index_put``) and refused where it raises
(``index_copy``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import test_cpu_hostile_plans as hostile  # noqa: E402

from opforge.backends.cpu.binding import Binding  # noqa: E402

pytestmark = hostile.pytestmark
F32, I32, I64 = hostile.F32, hostile.I32, hostile.I64
F64 = 7
hostile.NUMPY.setdefault(F64, np.float64)  # the gather copies float64 rows bit for bit


class Plan(hostile.Plan):
    """The hostile plans' builder with state inputs and the plan's ``state`` list."""

    def __init__(self) -> None:
        super().__init__()
        self.state: list[list[int]] = []

    def tensor(self, dtype, dims, strides=None, role="temp", **extra) -> int:
        tid = super().tensor(dtype, dims, strides, role, **extra)
        if role == "state":
            self.inputs.append(tid)
        return tid

    def document(self) -> dict:
        return {**super().document(), "state": self.state}


def cache_plan(kind="index_put", cache_role="state", rows=8, n=2, index_dtype=I64):
    """``cache (rows, 2, 3)`` written at ``n`` positions with ``values (n, 2, 3)``, in place;
    a second output reads the cache back (a copy) after the write."""
    p = Plan()
    cache = p.tensor(F32, [rows, 2, 3], role=cache_role)
    pos = p.tensor(index_dtype, [n], role="input")
    values = p.tensor(F32, [n, 2, 3], role="input")
    after = p.tensor(F32, [rows, 2, 3], role="output")
    view = p.alias(cache, [1, rows, 6], [rows * 6, 6, 1])
    vals = p.alias(values, [1, n, 6], [n * 6, 6, 1])
    p.op(kind, [view, pos, vals], [view])
    p.op("copy", [cache], [after], hostile.copy_ia([rows, 2, 3], [6, 3, 1], 0, [6, 3, 1], 0))
    if cache_role == "state":
        p.state.append([0, 1])  # the call's output 1 is the cache itself
    return p


def call(p, cache, pos, values):
    handle = p.handle()
    outputs = [np.zeros((8, 2, 3), np.float32), cache]
    Binding(handle, [cache, pos, values], outputs)()
    return outputs[0]


def _values(n=2):
    return (np.arange(n * 6, dtype=np.float32).reshape(n, 2, 3) + 1) * 10


# --- cases: each returns what ran; a refusal raises ---------------------------------------

def state_write_in_place():
    cache = np.random.default_rng(0).standard_normal((8, 2, 3)).astype(np.float32)
    want = cache.copy()
    want[[5, 1]] = _values()
    after = call(cache_plan(), cache, np.array([5, 1]), _values())
    assert np.array_equal(cache, want) and np.array_equal(after, want)
    return "ran ok"


def state_write_negative_counts_from_the_end():
    cache = np.zeros((8, 2, 3), np.float32)
    call(cache_plan(), cache, np.array([-1, -8]), _values())  # index_put: like ATen
    assert np.array_equal(cache[7], _values()[0]) and np.array_equal(cache[0], _values()[1])
    return "ran ok"


def state_write_out_of_range(position, kind="index_put"):
    cache = np.full((8, 2, 3), 4.0, np.float32)
    try:
        call(cache_plan(kind), cache, np.array([2, position]), _values())
    finally:
        assert (cache == 4.0).all(), "a write happened before the failing index was seen"
    return "ran"


def state_write_int32_positions_and_repeats():
    cache = np.zeros((8, 2, 3), np.float32)
    call(cache_plan(index_dtype=I32), cache, np.array([3, 3], np.int32), _values())
    assert np.array_equal(cache[3], _values()[1])  # the last write wins, as in ATen on CPU
    return "ran ok"


def gather_rows():
    rng = np.random.default_rng(1)
    table = rng.standard_normal((3, 7, 4))
    idx = np.array([[6, -7], [0, 3]])
    p = Plan()
    t = p.const(table)
    i = p.tensor(I64, [2, 2], role="input")
    out = p.tensor(F64, [3, 2, 2, 4], role="output")
    p.op("index", [t, i], [p.alias(out, [3, 4, 4], [16, 4, 1])])
    got = hostile.run(p.handle(), idx)[0]
    assert np.array_equal(got, table[:, idx])  # float64 rows, bit for bit
    return "ran ok"


def write_ordinary_input():
    call(cache_plan(cache_role="input"), np.zeros((8, 2, 3), np.float32), np.array([0, 1]),
         _values())
    return "ran"


def write_constant():
    p = Plan()
    cache = p.const(np.zeros((8, 2, 3), np.float32))
    pos = p.tensor(I64, [1], role="input")
    values = p.tensor(F32, [1, 2, 3], role="input")
    out = p.tensor(F32, [8, 2, 3], role="output")
    view = p.alias(cache, [1, 8, 6], [48, 6, 1])
    p.op("index_put", [view, pos, p.alias(values, [1, 1, 6], [6, 6, 1])], [view])
    p.op("copy", [cache], [out], hostile.copy_ia([8, 2, 3], [6, 3, 1], 0, [6, 3, 1], 0))
    hostile.run(p.handle(), np.array([0]), np.ones((1, 2, 3), np.float32))
    return "ran"


def write_overlapping_self():
    p = cache_plan()
    cache = 0
    shifted = p.alias(cache, [1, 7, 6], [48, 6, 1], offset=6)
    p.ops[0]["in"][0] = p.alias(cache, [1, 7, 6], [48, 6, 1])
    p.ops[0]["out"] = [shifted]
    call(p, np.zeros((8, 2, 3), np.float32), np.array([0, 1]), _values())
    return "ran"


def values_alias_the_state():
    p = cache_plan()
    p.ops[0]["in"][2] = p.alias(0, [1, 2, 6], [48, 6, 1])
    call(p, np.zeros((8, 2, 3), np.float32), np.array([0, 1]), _values())
    return "ran"


def values_wrong_rows():
    p = cache_plan()
    p.ops[0]["in"][2] = p.alias(2, [1, 1, 6], [6, 6, 1])
    call(p, np.zeros((8, 2, 3), np.float32), np.array([0, 1]), _values())
    return "ran"


def float_index():
    p = cache_plan()
    p.tensors[1]["dtype"] = F32
    call(p, np.zeros((8, 2, 3), np.float32), np.zeros(2, np.float32), _values())
    return "ran"


def state_not_listed():
    p = cache_plan()
    p.state = []  # a state tensor the call does not pass back as its output
    p.handle()
    return "ran"


def state_list_names_ordinary_input():
    p = cache_plan()
    p.state = [[1, 1]]  # the positions input is no state tensor
    p.handle()
    return "ran"


def state_output_another_array():
    p = cache_plan()
    handle = p.handle()
    cache = np.zeros((8, 2, 3), np.float32)
    Binding(handle, [cache, np.array([0, 1]), _values()],
                       [np.zeros((8, 2, 3), np.float32), cache.copy()])
    return "ran"


CASES = {
    "state_write_in_place": state_write_in_place,
    "state_write_negative_counts_from_the_end": state_write_negative_counts_from_the_end,
    "state_write_past_the_end": lambda: state_write_out_of_range(8),
    "state_write_far_past_the_end": lambda: state_write_out_of_range(2**40),
    "state_write_negative_past_the_start": lambda: state_write_out_of_range(-9),
    "index_copy_refuses_negative": lambda: state_write_out_of_range(-1, "index_copy"),
    "state_write_int32_positions_and_repeats": state_write_int32_positions_and_repeats,
    "gather_rows": gather_rows,
    "write_ordinary_input": write_ordinary_input,
    "write_constant": write_constant,
    "write_overlapping_self": write_overlapping_self,
    "values_alias_the_state": values_alias_the_state,
    "values_wrong_rows": values_wrong_rows,
    "float_index": float_index,
    "state_list_names_ordinary_input": state_list_names_ordinary_input,
    "state_not_listed": state_not_listed,
    "state_output_another_array": state_output_another_array,
}
_RANGE = r"refused: .*`aten::{op}`: index — found values in \[{lo}, {hi}\] — valid: " \
         r"\[{low}, 7\] for a dimension of size 8 .*nothing was written"
EXPECT = {
    "state_write_past_the_end": _RANGE.format(op="index_put", lo=2, hi=8, low=-8),
    "state_write_far_past_the_end": _RANGE.format(op="index_put", lo=2, hi=2**40, low=-8),
    "state_write_negative_past_the_start": _RANGE.format(op="index_put", lo=-9, hi=2, low=-8),
    "index_copy_refuses_negative": _RANGE.format(op="index_copy", lo=-1, hi=2, low=0),
    "write_ordinary_input": "refused: .*writes tensor 4, which is a delegate input",
    "write_constant": "refused: .*writes tensor 4, which is a constant",
    "write_overlapping_self": "refused: .*the output overlaps self without being self",
    "values_alias_the_state": "refused: .*the values share the output's storage",
    "values_wrong_rows": "refused: .*values must be \\(outer, index elements, inner\\)",
    "float_index": "refused: .*the index must be int64 or int32",
    "state_list_names_ordinary_input": "refused: .*state\\[0\\] names input 1, which is not a "
                                       "state tensor",
    "state_not_listed": "refused: .*tensors\\[0\\] is a state input the state list does not name",
    "state_output_another_array": "refused: .*output 1 is the new value of state input 0",
}
NORMAL = [name for name in CASES if name not in EXPECT]
EXPECT.update({name: "ran ok$" for name in NORMAL})


def test_state_and_indexing_plans_run_right_or_are_refused():
    names = list(CASES)
    hostile.check_case_file(__file__, names, EXPECT)


@pytest.mark.parametrize("name", ["state_write_past_the_end", "write_ordinary_input"])
def test_a_case_can_fail(name, monkeypatch):
    """The oracle is not vacuous: a case whose expectation is flipped is reported."""
    monkeypatch.setitem(EXPECT, name, "ran ok$")
    with pytest.raises(AssertionError):
        hostile.check_case_file(__file__, [name], EXPECT)


if __name__ == "__main__":
    hostile.report_cases(CASES, sys.argv[1:])
