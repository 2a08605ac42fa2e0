"""Scalar multiplies of matmul operands folded into the matmul (lowering/scaled_matmul.py):
``scaled_dot_product_attention``'s ``q * s`` and ``kᵀ * s`` become one ``linear`` post-op
(α = s²) of the score matmul instead of two elementwise passes.

Compared with float64 eager; each check allows 4x the error of float32 eager against
float64 on the same inputs (plus 1e-6 of the result's scale): the fold rounds once where
eager rounds three times, so it is at least as close. A factor dropped or applied twice
is an error of the order of the values.
"""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest
import torch
from torch import nn
from torch.export import Dim

from opforge.backends.cpu import blob
from opforge.backends.cpu import engine as cpu_engine
from opforge.export import export
from opforge.program import from_bytes, to_bytes
from opforge.runtime import load

pytestmark = pytest.mark.skipif(cpu_engine.missing() is not None,
                                reason=f"cpu backend: {cpu_engine.missing()}")

LINEAR = 6  # oneDNN eltwise linear (lowering/core.py)


def _export(model, example, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return from_bytes(to_bytes(export(model, example, kernels="portable", backends=["cpu"],
                                          **kwargs)))


def _ops(program) -> list[dict]:
    return [op for d in program.delegates
            for op in blob.parse(memoryview(bytes(program.segments[d.segment].data)))[0]["ops"]]


def _scales(ops) -> list[float]:
    return [p[2] for op in ops if op["kind"] == "matmul" for p in op["post"]
            if p[0] == 0 and p[1] == LINEAR]


def _linear_eltwise(ops) -> int:
    return sum(1 for op in ops if op["kind"] == "eltwise" and op["ia"][:1] == [LINEAR])


def _check(model, program, inputs):
    with torch.no_grad():
        ref64 = copy.deepcopy(model).double()(*(x.double() for x in inputs)).numpy()
        ref32 = model(*inputs).numpy().astype(np.float64)
    got = load(program).method("forward")(*(x.numpy() for x in inputs))[0].astype(np.float64)
    tol = 4 * np.abs(ref32 - ref64).max() + 1e-6 * max(np.abs(ref64).max(), 1.0)
    err = np.abs(got - ref64).max()
    assert err <= tol, f"error {err:.3g} against float64, allowed {tol:.3g}"


class Sdpa(nn.Module):
    def forward(self, q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)


class Scaled(nn.Module):
    """``(a · 0.5) @ (b · 3)``, and the same with a scaled operand also read elsewhere
    (``shared``: not folded) or a constant operand (folded at export instead)."""

    def __init__(self, case: str = "both") -> None:
        super().__init__()
        self.case = case
        self.w = nn.Parameter(torch.randn(8, 5, generator=torch.Generator().manual_seed(1)))

    def forward(self, a, b):
        if self.case == "constant":
            return a @ (self.w * 3)
        sa = a * 0.5
        out = sa @ (b * 3)
        return out + sa.sum() if self.case == "shared" else out


def _qkv(s, seed=0, heads=4, d=16):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, heads, s, d, generator=g) for _ in range(3))


def test_sdpa_scales_fold_into_the_score_matmul():
    model = Sdpa()
    program = _export(model, _qkv(10))
    ops = _ops(program)
    assert _linear_eltwise(ops) == 0, [op["name"] for op in ops]
    assert _scales(ops) == [pytest.approx(1 / 4)]  # (16 ** -0.25) ** 2
    for seed in range(3):
        _check(model, program, _qkv(10, seed))


def test_sdpa_with_a_symbolic_sequence():
    model = Sdpa()
    seq = Dim("seq", min=1, max=32)
    program = _export(model, _qkv(10), dynamic_shapes=({2: seq}, {2: seq}, {2: seq}))
    ops = _ops(program)
    assert _linear_eltwise(ops) == 0 and len(_scales(ops)) == 1
    for s in (1, 7, 32):
        _check(model, program, _qkv(s, s))


@pytest.mark.parametrize("case,folded", [("both", [1.5]), ("shared", [3.0]), ("constant", [])])
def test_which_multiplies_fold(case, folded):
    model = Scaled(case)
    g = torch.Generator().manual_seed(2)
    inputs = (torch.randn(6, 8, generator=g), torch.randn(8, 5, generator=g))
    program = _export(model, inputs)
    ops = _ops(program)
    assert _scales(ops) == [pytest.approx(f) for f in folded]
    assert _linear_eltwise(ops) == (1 if case == "shared" else 0)  # a · 0.5, read twice
    _check(model, program, inputs)


def test_transformer_layer_runs_no_scale_pass():
    torch.manual_seed(0)
    model = nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True).eval()
    x = torch.randn(1, 24, 64, generator=torch.Generator().manual_seed(0))
    program = _export(model, (x,))
    ops = _ops(program)
    assert _linear_eltwise(ops) == 0 and _scales(ops) == [pytest.approx(1 / 4)]
    _check(model, program, (x,))
