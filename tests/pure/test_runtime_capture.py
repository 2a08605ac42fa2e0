"""Capturing intermediates by debug handle on the lean runtime, without torch (issue 27).

Hand-built programs with a debug table: every capture is a copy taken right after its
instruction (the arena slot may be reused later), a quantize op's integer result comes
with its scale and zero point, a table that names nothing captures nothing, and a program
without a table is refused by ``capture_intermediates`` with the fix.
"""

from __future__ import annotations

import numpy as np
import pytest

from opforge.errors import ProgramError
from opforge.program import (
    ArenaStorage, DoubleValue, IntValue, KernelCall, MemoryPlan, Method, Operator, Program,
    ScalarType, ScalarTypeValue, TensorValue, debug_info, from_bytes, to_bytes,
)
from opforge.program.debug import DebugCapture, DebugInfo, DebugNode, MethodDebug, with_debug_handles
from opforge.runtime import Capture, capture_intermediates, load

F32 = ScalarType.FLOAT32


def _chain(reuse: bool) -> Program:
    """x → abs → neg → abs; with ``reuse`` the third result overwrites the first's slot."""
    x = TensorValue(F32, (4,), storage=ArenaStorage(0, 0))
    a = TensorValue(F32, (4,), storage=ArenaStorage(0, 64))
    b = TensorValue(F32, (4,), storage=ArenaStorage(0, 128))
    c = TensorValue(F32, (4,), storage=ArenaStorage(0, 64 if reuse else 192))
    method = Method("forward", (x, a, b, c), (0,), (3,),
                    (KernelCall(0, (0, 1)), KernelCall(1, (1, 2)), KernelCall(0, (2, 3))),
                    (Operator("aten::abs", "out"), Operator("aten::neg", "out")),
                    MemoryPlan((256,)))
    nodes = (DebugNode("abs", "aten::abs", "m.py:1 in forward (abs(x))"),
             DebugNode("neg", "aten::neg", "m.py:2 in forward (-y)"),
             DebugNode("abs_1", "aten::abs", ""))
    captures = tuple(DebugCapture(i, i + 1, i) for i in range(3))
    return with_debug_handles(Program(methods=(method,)),
                              DebugInfo({"forward": MethodDebug(nodes, captures, {})}))


def test_each_capture_is_a_copy_taken_after_its_instruction():
    program = from_bytes(to_bytes(_chain(reuse=True)))
    x = np.array([-1.0, 2.0, -3.0, 4.0], np.float32)
    outputs, results = capture_intermediates(load(program), [x])
    np.testing.assert_array_equal(results[("abs", 0)].array, np.abs(x))  # not overwritten
    np.testing.assert_array_equal(results[("neg", 0)].array, -np.abs(x))
    np.testing.assert_array_equal(results[("abs_1", 0)].array, np.abs(x))
    np.testing.assert_array_equal(outputs[0], np.abs(x))
    assert results[("neg", 0)].instruction == 1 and results[("neg", 0)].where == "kernel"
    info = debug_info(program).methods["forward"]
    assert info.nodes[0].source == "m.py:1 in forward (abs(x))" and info.nodes[2].source == ""


def test_a_quantize_result_keeps_its_scale_and_zero_point():
    x = TensorValue(F32, (4,), storage=ArenaStorage(0, 0))
    q = TensorValue(ScalarType.UINT8, (4,), storage=ArenaStorage(0, 64))
    values = (x, q, DoubleValue(0.5), IntValue(3), IntValue(0), IntValue(255),
              ScalarTypeValue(ScalarType.UINT8))
    method = Method("forward", values, (0,), (1,), (KernelCall(0, (0, 2, 3, 4, 5, 6, 1)),),
                    (Operator("quantized_decomposed::quantize_per_tensor", "out"),),
                    MemoryPlan((128,)))
    program = with_debug_handles(Program(methods=(method,)), DebugInfo({"forward": MethodDebug(
        (DebugNode("quantize", "quantized_decomposed::quantize_per_tensor", ""),),
        (DebugCapture(0, 1, 0),), {})}))
    x_in = np.array([0.0, 1.0, -1.0, 2.4], np.float32)
    _, results = capture_intermediates(load(program), [x_in])
    result = results[("quantize", 0)]
    assert result.array.dtype == np.uint8 and (result.scale, result.zero_point) == (0.5, 3)
    np.testing.assert_allclose(result.dequantized(), np.round(x_in / 0.5) * 0.5)


def test_without_a_table_nothing_is_named_and_capture_intermediates_refuses():
    program = Program(methods=_chain(reuse=False).methods)
    capture = Capture(load(program), "forward")
    assert capture.points == {} and capture.debug is None
    capture.run([np.ones(4, np.float32)])
    assert capture.results == {}
    with pytest.raises(ProgramError, match="no debug table .* fix: re-export"):
        capture_intermediates(load(program), [np.ones(4, np.float32)])


def test_the_plain_call_path_is_untouched_by_a_table():
    """A program with a table runs like one without: same instructions bound, same outputs."""
    with_table, without = load(_chain(reuse=False)).method(), load(
        Program(methods=_chain(reuse=False).methods)).method()
    x = np.array([-1.0, 2.0, -3.0, 4.0], np.float32)
    assert with_table.instructions == without.instructions
    np.testing.assert_array_equal(with_table(x)[0], without(x)[0])
