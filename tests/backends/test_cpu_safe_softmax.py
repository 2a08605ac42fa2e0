"""Attention's safe softmax on the cpu backend: torch decomposes
``scaled_dot_product_attention`` into a softmax plus five passes over the score matrix
(``eq(s, -inf)``, two ``logical_not``, ``any``, ``where``) that zero the rows whose every
score is masked. The lowering recognises that group and emits one ``softmax`` op with its
``safe`` flag; these tests check that it does (and only where the group is whole), and that
the values equal eager's in float64 for masks that leave rows fully masked, partly masked
and unmasked, with a NaN and with an inf in the inputs.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from opforge.backends import get_backend
from opforge.backends.cpu import engine as cpu_engine
from opforge.export import delegation_report, export
from opforge.runtime import load

pytestmark = pytest.mark.skipif(cpu_engine.missing() is not None,
                                reason=f"cpu backend: {cpu_engine.missing()}")


class Attention(nn.Module):
    """sdpa over q, k, v given as inputs, with a boolean mask buffer (True: attend)."""

    def __init__(self, mask: torch.Tensor | None, scale: float | None = None) -> None:
        super().__init__()
        self.register_buffer("mask", mask)
        self.scale = scale

    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask, scale=self.scale)


class ReadsTheSoftmax(nn.Module):
    """The safe softmax's group is not whole: the plain softmax is read by another op."""

    def forward(self, s):
        p = torch.softmax(s, -1)
        safe = torch.where(torch.logical_not(torch.any(torch.logical_not(s == float("-inf")),
                                                       -1, keepdim=True)),
                           torch.zeros_like(p), p)
        return safe, p * 2


def _mask(lq: int, lk: int, fully_masked_rows: tuple[int, ...], seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(1, 1, lq, lk, generator=g) > 0.4
    mask[..., 0] = True  # every row attends somewhere ...
    for r in fully_masked_rows:
        mask[..., r, :] = False  # ... except these
    return mask


def _inputs(b, h, lq, lk, d, seed):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(b, h, n, d, generator=g) * 1.5 for n in (lq, lk, lk))


def _plan_ops(program) -> list[dict]:
    backend = get_backend("cpu")
    ops = []
    for delegate in program.delegates:
        view = backend.describe_blob(program.segments[delegate.segment].data, {"num_threads": 0})
        ops += view["nodes"]
    return ops


def _float64(model: nn.Module, inputs) -> np.ndarray:
    model64 = model.double()
    with torch.no_grad():
        out = model64(*(t.double() for t in inputs)).numpy()
    model.float()
    return out


# the default kernel set decomposes _safe_softmax fully (logical_not(any(logical_not(eq))),
# full_like); the portable set keeps it less decomposed (all(eq), zeros_like): both match
@pytest.mark.parametrize("kernels", [None, "portable"])
@pytest.mark.parametrize("b, h, lq, lk, d, rows", [
    (1, 2, 5, 7, 8, (1,)),          # one fully masked row
    (2, 3, 13, 13, 16, (0, 12)),    # the first and the last
    (1, 4, 17, 31, 32, ()),         # none: the safe path changes nothing
    (1, 1, 1, 11, 8, (0,)),         # decode-like: the only query is fully masked
])
def test_masked_attention_matches_float64_and_runs_one_softmax(b, h, lq, lk, d, rows, kernels):
    mask = _mask(lq, lk, rows, seed=lq * 31 + lk)
    model = Attention(mask).eval()
    inputs = _inputs(b, h, lq, lk, d, seed=d + lq)
    program = export(model, inputs, backends=["cpu"], **({"kernels": kernels} if kernels else {}))
    assert not delegation_report(program)["forward"]["rejected"]
    impls = [row["impl"] for row in _plan_ops(program)]
    assert "fused into engine safe softmax" in impls
    assert not any("reduce" in i or "reduction" in i for i in impls), impls
    got = load(program).method("forward")(*(t.numpy() for t in inputs))[0]
    want = _float64(model, inputs)
    for r in rows:
        assert np.all(want[..., r, :] == 0) and np.all(got[..., r, :] == 0)
    # float32 scores over d <= 32 terms and a softmax over <= 31: a few float32 ulps of the
    # output's magnitude (about 1); 1e-5 would still catch a 0.01% error in any weight
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_nan_or_inf_in_the_scores_stays_eager_s():
    mask = _mask(6, 6, (2,), seed=3)
    model = Attention(mask, scale=0.3).eval()
    q, k, v = _inputs(1, 2, 6, 6, 8, seed=4)
    program = export(model, (q, k, v), backends=["cpu"])
    forward = load(program).method("forward")
    q_nan, k_inf = q.clone(), k.clone()
    q_nan[0, 1, 3, 0] = float("nan")     # row 3 of head 1: NaN (as eager)
    k_inf[0, 0, 4, 5] = float("inf")     # column 4 of head 0: inf scores, NaN after softmax
    for inputs in ((q_nan, k, v), (q, k_inf, v)):
        got = forward(*(t.numpy() for t in inputs))[0]
        with torch.no_grad():
            want = model(*inputs).numpy()
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        finite = ~np.isnan(want)
        np.testing.assert_allclose(got[finite], want[finite], rtol=1e-5, atol=1e-5)
        assert np.all(got[..., 2, :] == 0) or np.isnan(want[..., 2, :]).any()


def test_a_softmax_read_elsewhere_is_not_fused():
    model = ReadsTheSoftmax().eval()
    s = torch.randn(3, 5, generator=torch.Generator().manual_seed(5))
    s[1] = float("-inf")
    program = export(model, (s,), backends=["cpu"])
    impls = [row["impl"] for row in _plan_ops(program)]
    assert "fused into engine safe softmax" not in impls
    safe, doubled = load(program).method("forward")(s.numpy())
    with torch.no_grad():
        want_safe, want_doubled = model(s)
    np.testing.assert_allclose(safe, want_safe.numpy(), rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(np.isnan(doubled), np.isnan(want_doubled.numpy()))
