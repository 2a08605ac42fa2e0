"""A delegate output written by the op that computes it (Lowering.redirect_or_copy), also
when that op writes it under a whole row-major reshape (a linear's or layer norm's rows
[rows, n] of a [batch, seq, n] result): no copy into the output at the end. A reshape that
is not whole, or a result read again after, keeps the copy."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch import nn

from opforge.backends.cpu import blob
from opforge.backends.cpu import engine as cpu_engine
from opforge.export import export
from opforge.program import from_bytes, to_bytes
from opforge.runtime import load

pytestmark = pytest.mark.skipif(cpu_engine.missing() is not None,
                                reason=f"cpu backend: {cpu_engine.missing()}")


def _plan(model, x):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = from_bytes(to_bytes(export(model, (x,), kernels="portable", backends=["cpu"])))
    (d,) = program.delegates
    return program, blob.parse(memoryview(bytes(program.segments[d.segment].data)))[0]


def _copies_into_first_output(plan) -> int:
    return sum(1 for op in plan["ops"] if op["kind"] == "copy"
               and plan["outputs"][0] in op["out"])


class Tail(nn.Module):
    def __init__(self, case: str) -> None:
        super().__init__()
        self.case = case
        self.linear, self.norm = nn.Linear(16, 12), nn.LayerNorm(12)

    def forward(self, x):
        y = self.norm(self.linear(x))                  # rows [6, 12] of a [2, 3, 12] result
        if self.case == "read_again":
            return y, y.sum(-1)
        return y


@pytest.mark.parametrize("case,copies", [("plain", 0), ("read_again", 1)])
def test_an_output_written_through_a_reshape_needs_no_copy(case, copies):
    torch.manual_seed(0)
    model = Tail(case).eval()
    x = torch.randn(2, 3, 16)
    program, plan = _plan(model, x)
    assert _copies_into_first_output(plan) == copies, [op["name"] for op in plan["ops"]]
    got = load(program).method("forward")(x.numpy())
    with torch.no_grad():
        expected = model(x)
    for g, e in zip(got, expected if isinstance(expected, tuple) else (expected,)):
        np.testing.assert_allclose(g, e.numpy(), rtol=1e-5, atol=1e-5)
