"""Output disagreements fuzz/native_exec_fuzz.py found between the native runtime and the
lean one, each reduced to the instruction where the two first differ, against the rule
both runtimes document.

Needs a C++ compiler, CMake and Ninja; no torch.
"""

from __future__ import annotations

import numpy as np
import pytest

import opforge.program as P
from opforge.program._sample import unverified_bytes
from opforge.runtime import load

F32 = P.ScalarType.FLOAT32


def _unary_into(op: str, out_dtype: P.ScalarType, n: int) -> bytes:
    """forward(x: float32[n]) -> y: out_dtype[n] with one ``op`` instruction."""
    x = P.TensorValue(F32, (n,), storage=P.ArenaStorage(0, 0))
    y = P.TensorValue(out_dtype, (n,), storage=P.ArenaStorage(0, 64 * (1 + 4 * n // 64)))
    method = P.Method("forward", (x, y), (0,), (1,), (P.KernelCall(0, (0, 1)),),
                      (P.Operator(op, "out"),), P.MemoryPlan((64 * (2 + 12 * n // 64),)))
    return unverified_bytes(P.Program(methods=(method,)))


@pytest.mark.parametrize("op, reference, values", [
    ("aten::rsqrt", lambda x: 1 / np.sqrt(x), [0.25, 0.0625, 1.0, 4.0, 0.3, 0.02, 2.5, 1e-4]),
    ("aten::sigmoid", lambda x: 1 / (1 + np.exp(-x)), [100.0, -100.0, 0.5, -2.0, 3.0]),
])
@pytest.mark.parametrize("out_dtype", [P.ScalarType.INT64, P.ScalarType.INT8])
def test_a_several_step_floating_op_into_an_integer_out_casts_once(op, reference, values,
                                                                   out_dtype):
    # A floating op with an integer out computes in float32 and casts the result once, as
    # every one-ufunc floating op does (ATen refuses the dtype pair; a hostile file may ask
    # for it). The lean rsqrt and sigmoid did their later steps in the integer out: rsqrt
    # of 0.25 took the reciprocal of int(sqrt(0.25)) = 0 (INT64_MIN, where native gave 2);
    # sigmoid's exp and reciprocal ran on integers. Found as fuzz/native_exec_fuzz.py's
    # cases 3420, 64571 (int64) and 89703 (int8) of seed 0 (the campaign of 2026-12-06): an
    # RMS norm's rsqrt in a decoder, its out's dtype mutated.
    # Inputs whose float32 results are in range and exact or far from an integer (sigmoid
    # of 100 is 1 + 4e-44 rounded: 1.0 exactly), so the truncation is the same in both
    # runtimes, in float64 and on every CPU.
    x = np.array(values, np.float32)
    expected = reference(x.astype(np.float64)).astype(out_dtype.numpy_dtype())
    data = _unary_into(op, out_dtype, x.size)
    lean = load(data).method()(x)[0]
    native = load(data, executor="native").method()(x)[0]
    np.testing.assert_array_equal(lean, expected)
    np.testing.assert_array_equal(native, expected)
