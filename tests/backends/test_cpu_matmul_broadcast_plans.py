"""Hand-built matmul plans with broadcast batch dims (what grouped-query attention emits:
queries [Hkv, G, q, d] against keys [Hkv, 1, d, T]), in child processes as in
test_cpu_hostile_plans.py, whose plan builder and runner they use; test_cpu_sanitized.py
runs them under AddressSanitizer and UndefinedBehaviorSanitizer too.

The contract under test (native/matmul.cpp): a [.., M, K] x b [.., K, N] -> dst [.., M, N];
each batch dim of a and of b is dst's or 1, and dst's is 1 or one of theirs; anything else
is refused before a primitive or any memory exists for the op.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import test_cpu_hostile_plans as hostile  # noqa: E402

pytestmark = hostile.pytestmark
F32, Plan, run = hostile.F32, hostile.Plan, hostile.run


def _matmul(a_dims, b_dims, dst_dims):
    p = Plan()
    a = p.tensor(F32, a_dims, role="input")
    b = p.tensor(F32, b_dims, role="input")
    dst = p.tensor(F32, dst_dims, role="output")
    p.op("matmul", [a, b], [dst])
    rng = np.random.default_rng(0)
    xa, xb = rng.standard_normal(a_dims, np.float32), rng.standard_normal(b_dims, np.float32)
    (got,) = run(p.handle(), xa, xb)
    err = np.abs(got - np.matmul(xa, xb)).max()
    return "ran ok" if err < 1e-4 else f"ran wrong (error {err})"


def grouped_keys_broadcast():
    return _matmul([2, 3, 1, 8], [2, 1, 8, 5], [2, 3, 1, 5])


def grouped_queries_broadcast():
    return _matmul([2, 1, 4, 8], [2, 3, 8, 5], [2, 3, 4, 5])


def weights_batch_neither_one_nor_dst():
    return _matmul([2, 3, 1, 8], [2, 2, 8, 5], [2, 3, 1, 5])


def dst_batch_smaller_than_operands():
    return _matmul([2, 3, 1, 8], [2, 3, 8, 5], [2, 1, 1, 5])


def dst_batch_larger_than_operands():
    return _matmul([2, 1, 1, 8], [2, 1, 8, 5], [2, 3, 1, 5])


def inner_dims_differ():
    return _matmul([2, 3, 1, 8], [2, 1, 7, 5], [2, 3, 1, 5])


def dst_columns_differ():
    return _matmul([2, 3, 1, 8], [2, 1, 8, 5], [2, 3, 1, 6])


CASES = {f.__name__: f for f in [
    grouped_keys_broadcast, grouped_queries_broadcast, weights_batch_neither_one_nor_dst,
    dst_batch_smaller_than_operands, dst_batch_larger_than_operands, inner_dims_differ,
    dst_columns_differ]}
EXPECT = {
    "weights_batch_neither_one_nor_dst": r"refused: .*batch dim 1 of sizes 3 x 2 -> 3",
    "dst_batch_smaller_than_operands": r"refused: .*batch dim 1 of sizes 3 x 3 -> 1",
    "dst_batch_larger_than_operands": r"refused: .*batch dim 1 of sizes 1 x 1 -> 3",
    "inner_dims_differ": "refused: .*operand shapes that do not multiply",
    "dst_columns_differ": "refused: .*operand shapes that do not multiply",
}
NORMAL = [name for name in CASES if name not in EXPECT]
EXPECT.update({name: "ran ok$" for name in NORMAL})


def test_broadcast_matmul_plans_run_right_or_are_refused():
    names = list(CASES)
    hostile.check_case_file(__file__, names, EXPECT)


@pytest.mark.parametrize("name", ["dst_batch_smaller_than_operands", "grouped_keys_broadcast"])
def test_a_case_can_fail(name, monkeypatch):
    """The oracle is not vacuous: a case whose expectation is flipped is reported."""
    monkeypatch.setitem(EXPECT, name, "refused: .*" if name in NORMAL else "ran ok$")
    with pytest.raises(AssertionError):
        hostile.check_case_file(__file__, [name], EXPECT)


if __name__ == "__main__":
    hostile.report_cases(CASES, sys.argv[1:])
