"""Rotary position embeddings as one engine op: ``x * cos + cat([-x2, x1], -1) * sin`` (two
slices, a neg, a cat, two muls and an add, in any operand order) is matched by the lowering
and runs as ``rope``. Checked against float64 (and eager float32 to the bit where torch
rounds the same two products and sum) for Llama-style ``[seq, heads, d]`` with ``[seq, 1,
d]`` tables, transformers-style ``[batch, heads, seq, d]`` with ``[batch, 1, seq, d]``,
tables as constants and as inputs, symbolic sequence lengths; left unfused where a value
inside escapes or the last dim is odd; hand-built plans the engine must refuse (also run
under ASan/UBSan by test_cpu_sanitized.py).

Tolerance: y_j = x_j c_j + r_j s_j in float32, two products and a sum: |error| ≤ 1.5 ulp of
the larger product, below 3e-7 relative to max(|x|) for |cos|, |sin| ≤ 1; 1e-6 here.
"""

from __future__ import annotations

import re
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import test_cpu_hostile_plans as hostile  # noqa: E402

from opforge.backends.cpu import blob  # noqa: E402
from opforge.export import export  # noqa: E402
from opforge.runtime import load  # noqa: E402

pytestmark = hostile.pytestmark
ATOL = 1e-6


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


class Llama(nn.Module):
    """q [seq, heads, d] rotated with tables indexed by positions: [seq, 1, d]."""

    def __init__(self, d: int, order: int) -> None:
        super().__init__()
        angles = torch.arange(32)[:, None] * (0.9 ** torch.arange(d // 2 + d % 2))[None, :]
        table = torch.cat([angles, angles], -1)[:, :d]
        self.register_buffer("cos", table.cos())
        self.register_buffer("sin", table.sin())
        self.order = order

    def forward(self, q, positions):
        c, s = self.cos[positions][:, None, :], self.sin[positions][:, None, :]
        if self.order == 0:
            return q * c + rotate_half(q) * s
        if self.order == 1:
            return s * rotate_half(q) + c * q
        return rotate_half(q) * s + q * c


class HfStyle(nn.Module):
    """q [batch, heads, seq, d]; cos and sin inputs [batch, seq, d], unsqueezed at dim 1."""

    def forward(self, q, cos, sin):
        return q * cos.unsqueeze(1) + rotate_half(q) * sin.unsqueeze(1)


class Escapes(nn.Module):
    def forward(self, q, cos, sin):
        r = rotate_half(q)
        return q * cos + r * sin, r


def _export(model, args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return export(model, args, kernels="portable", backends=["cpu"], **kwargs)


def _kinds(program) -> list[str]:
    return [op["kind"] for d in program.delegates
            for op in blob.parse(program.segments[d.segment].data)[0]["ops"]]


def _float64(model, args):
    """The model run in float64 (it is converted in place: call it last)."""
    with torch.no_grad():
        return model.double()(*(a.double() if a.is_floating_point() else a for a in args))


@pytest.mark.parametrize("d", [2, 8, 64])
@pytest.mark.parametrize("order", [0, 1, 2])
def test_llama_style_rotation_is_one_engine_op(d, order):
    model = Llama(d, order).eval()
    g = torch.Generator().manual_seed(d + order)
    args = (torch.randn(5, 3, d, generator=g) * 2, torch.tensor([0, 3, 7, 30, 31]))
    program = _export(model, args)
    kinds = _kinds(program)
    assert kinds.count("rope") == 1 and "copy" not in kinds, kinds
    got = load(program).method("forward")(*(a.numpy() for a in args))[0]
    with torch.no_grad():
        assert np.array_equal(got, model(*args).numpy())  # torch's float32 order of operations
    np.testing.assert_allclose(got, _float64(model, args).numpy(), rtol=0, atol=ATOL * 4)


def test_transformers_style_rotation_with_input_tables():
    model = HfStyle().eval()
    g = torch.Generator().manual_seed(1)
    angles = torch.rand(2, 6, 8, generator=g) * 6
    args = (torch.randn(2, 4, 6, 16, generator=g), torch.cat([angles, angles], -1).cos(),
            torch.cat([angles, angles], -1).sin())
    program = _export(model, args)
    assert "rope" in _kinds(program)
    got = load(program).method("forward")(*(a.numpy() for a in args))[0]
    np.testing.assert_allclose(got, _float64(model, args).numpy(), rtol=0, atol=ATOL * 4)


@pytest.mark.parametrize("d", [7, 8])
def test_an_escaping_value_or_an_odd_dim_stays_unfused_and_correct(d):
    g = torch.Generator().manual_seed(d)
    args = (torch.randn(3, d, generator=g), torch.rand(3, d, generator=g),
            torch.rand(3, d, generator=g))
    program = _export(Escapes().eval(), args)
    assert "rope" not in _kinds(program)
    got = load(program).method("forward")(*(a.numpy() for a in args))
    want = _float64(Escapes(), args)
    for g_, w in zip(got, want):
        np.testing.assert_allclose(g_, w.numpy(), rtol=0, atol=ATOL * 4)


def test_symbolic_sequence_lengths_are_one_op_at_every_size():
    model = Llama(16, 0).eval()
    seq = torch.export.Dim("seq", min=1, max=20)
    args = (torch.randn(4, 2, 16), torch.arange(4))
    program = _export(model, args, dynamic_shapes=({0: seq}, {0: seq}))
    assert "rope" in _kinds(program)
    method = load(program).method("forward")
    for n in (1, 2, 11, 20):
        q = torch.randn(n, 2, 16, generator=torch.Generator().manual_seed(n))
        pos = torch.arange(n) + (31 - n)
        np.testing.assert_allclose(method(q.numpy(), pos.numpy())[0],
                                   _float64(model, (q, pos)).numpy(), rtol=0, atol=ATOL * 4)


# --- hand-built plans: the engine's contract for rope ------------------------------------------

F32, I32 = hostile.F32, hostile.I32


def _plan(dims=(3, 2, 4), table_dims=None, table_strides=None, x_dtype=F32, ia=(), cos_dtype=F32):
    p = hostile.Plan()
    x = p.tensor(x_dtype, list(dims), role="input")
    rows = int(np.prod(dims[:-1])) if dims else 1
    table = np.linspace(-1, 1, rows * dims[-1]).astype(np.float32)
    cos = p.const(np.cos(table).astype(np.float32) if cos_dtype == F32 else table.astype(np.int32))
    sin = p.const(np.sin(table))
    td = list(table_dims or dims)
    ts = list(table_strides) if table_strides is not None else list(hostile.row_major(td))
    y = p.tensor(F32, list(dims), role="output")
    p.op("rope", [x, p.alias(cos, td, ts), p.alias(sin, td, ts)], [y], list(ia))
    return p, np.cos(table).reshape(dims), np.sin(table).reshape(dims)


def _reference(x, c, s):
    half = x.shape[-1] // 2
    r = np.concatenate([-x[..., half:], x[..., :half]], -1)
    return x.astype(np.float64) * c + r.astype(np.float64) * s


def rope_rows():
    p, c, s = _plan()
    x = np.arange(24, dtype=np.float32).reshape(3, 2, 4) - 11
    got = hostile.run(p.handle(), x)[0]
    return "ran ok" if np.allclose(got, _reference(x, c, s), rtol=0, atol=1e-5) else f"wrong {got}"


def rope_broadcast_table():
    # the table's dim 1 read with stride 0: one row per position shared by both heads
    p = hostile.Plan()
    x = p.tensor(F32, [3, 2, 4], role="input")
    table = np.linspace(-1, 1, 12).astype(np.float32).reshape(3, 1, 4)
    cos = p.alias(p.const(np.cos(table)), [3, 2, 4], [4, 0, 1])
    sin = p.alias(p.const(np.sin(table)), [3, 2, 4], [4, 0, 1])
    y = p.tensor(F32, [3, 2, 4], role="output")
    p.op("rope", [x, cos, sin], [y])
    xs = np.random.default_rng(1).standard_normal((3, 2, 4)).astype(np.float32)
    got = hostile.run(p.handle(), xs)[0]
    want = _reference(xs, np.cos(table), np.sin(table))
    return "ran ok" if np.allclose(got, want, rtol=0, atol=1e-6) else f"wrong {got}"


def rope_empty():
    p, _, _ = _plan(dims=(0, 2, 4), table_dims=(0, 2, 4))
    return "ran ok" if hostile.run(p.handle(), np.zeros((0, 2, 4), np.float32))[0].shape == (0, 2, 4) else "wrong"


def rope_odd_dim():
    p, _, _ = _plan(dims=(3, 5))
    return hostile.run(p.handle(), np.ones((3, 5), np.float32))


def rope_table_other_dims():
    p, _, _ = _plan(dims=(3, 4), table_dims=(2, 4), table_strides=(4, 1))
    return hostile.run(p.handle(), np.ones((3, 4), np.float32))


def rope_table_strided_rows():
    p, _, _ = _plan(dims=(2, 4), table_dims=(2, 4), table_strides=(1, 2))
    return hostile.run(p.handle(), np.ones((2, 4), np.float32))


def rope_int_table():
    p, _, _ = _plan(cos_dtype=I32)
    return hostile.run(p.handle(), np.ones((3, 2, 4), np.float32))


def rope_attribute():
    p, _, _ = _plan(ia=(1,))
    return hostile.run(p.handle(), np.ones((3, 2, 4), np.float32))


CASES = {f.__name__: f for f in [rope_rows, rope_broadcast_table, rope_empty, rope_odd_dim,
                                  rope_table_other_dims, rope_table_strided_rows, rope_int_table,
                                  rope_attribute]}
NORMAL = ["rope_rows", "rope_broadcast_table", "rope_empty"]
EXPECT = {
    "rope_odd_dim": "refused: .*the last dim must be even",
    "rope_table_other_dims": r"refused: .*cos and sin must have x's dims",
    "rope_table_strided_rows": "refused: .*cos and sin rows must be dense",
    "rope_int_table": "refused: .*cos and sin",
    "rope_attribute": "refused: .*takes no attributes",
}
EXPECT.update({name: "ran ok$" for name in NORMAL})


@pytest.mark.parametrize("name", sorted(CASES))
def test_rope_plans_run_right_or_are_refused(name):
    result = hostile.outcome_of(CASES, name)
    assert re.match(EXPECT[name], result, re.S), result


if __name__ == "__main__":
    hostile.report_cases(CASES, sys.argv[1:])
