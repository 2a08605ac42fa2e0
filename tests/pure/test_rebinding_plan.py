"""The rebinding plan's compiled size expressions agree with ``SizeExpr.evaluate`` (no
torch); tests/torch/test_dynamic_rebinding.py runs whole models through it."""

from __future__ import annotations

import itertools

import pytest

from opforge.program import SizeExpr
from opforge.runtime.rebinding import _compile

EXPRESSIONS = [
    "7", "-3", "s0", "(s0 + 1)", "(s0 - 1)", "((2 * s0) + 1)", "floordiv(s0, 2)",
    "floordiv((s0 - 9), 4)", "mod((s0 - 9), 4)", "mod((s0 * s1), 3)", "max(min(s0, 4), s1)",
    "((s0 * s0) + -1)", "floordiv(((s0 * s1) + 3), (s1 + 1))", "(s1 - (s0 * 3))",
]


@pytest.mark.parametrize("text", EXPRESSIONS)
def test_compiled_expressions_evaluate_like_the_tree(text):
    expr = SizeExpr.parse(text)
    compiled = _compile(expr)
    for s0, s1 in itertools.product((1, 2, 3, 7, 16, 64), (0, 1, 5, 13)):
        env = {"s0": s0, "s1": s1}
        assert compiled(env) == expr.evaluate(env), env


@pytest.mark.parametrize("text", ["floordiv(s0, s1)", "mod(s0, (s1 - 1))"])
def test_compiled_zero_divisor_raises_like_the_tree(text):
    expr = SizeExpr.parse(text)
    env = {"s0": 5, "s1": 0 if "floordiv" in text else 1}
    with pytest.raises(ZeroDivisionError):
        expr.evaluate(env)
    with pytest.raises(ZeroDivisionError):
        _compile(expr)(env)
