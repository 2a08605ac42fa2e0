"""Mixture of experts on the native runtime (executor="native"): the Mixtral-style layer of
tests/torch/moe_models.py in its three expert implementations against eager, and a decoder
of such layers generating eager's tokens. The portable C++ kernels it needs (the grouped
matmul, histc, index_add; topk, sort, cumsum, nonzero) are compared with the NumPy ones in
test_portable_experts.py and the other test_portable_* files."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from opforge.examples.decoder import export_decoder, greedy_decode
from opforge.export import export
from opforge.runtime import load
from opforge.runtime.generate import Generator
from tests.torch.moe_models import PROMPT, STYLES, Experts, MoEDecoder, tokens

# float32 products of <= 48 terms in another summation order than ATen's (our GEMM) and a
# softmax: the layer's outputs (magnitudes up to ~6) within a few ulps, measured <= 1.7e-6
# absolute; any wrong routing or group boundary differs by 0.1 or more
ATOL = 1e-5


@pytest.mark.parametrize("style", STYLES)
def test_moe_layer_matches_eager(native_runtime, style):
    model = Experts(style).eval()
    method = load(export(model, (tokens(),)), executor="native").method("forward")
    for seed in (1, 7):  # the example's routing and another
        x = tokens(seed=seed)
        (got,) = method(x.numpy())
        with torch.no_grad():
            np.testing.assert_allclose(got, model(x).numpy(), rtol=0, atol=ATOL)


def test_moe_decoder_generates_eager_tokens(native_runtime):
    model = MoEDecoder("grouped").eval()
    with torch.no_grad():
        want = greedy_decode(lambda t, p: model(t, p), PROMPT, 12)
    program = export_decoder(model)
    assert list(Generator(load(program, executor="native")).generate(PROMPT, 12).tokens) == want


class _TokensPerExpert(torch.nn.Module):
    """bincount of the routed expert ids: a size the data decides, bounded by a check."""

    def forward(self, ids: torch.Tensor, weights: torch.Tensor):
        counts = torch.bincount(ids, minlength=4)
        torch._check(counts.shape[0] <= 8)
        sums = torch.bincount(ids, weights, minlength=4)
        torch._check(sums.shape[0] <= 8)
        return counts * 2, sums + 1


def test_bincount_sized_by_the_data(native_runtime):
    model = _TokensPerExpert()
    ids, weights = torch.tensor([0, 1, 1, 3, 5]), torch.rand(5, dtype=torch.float64)
    method = load(export(model, (ids, weights)), executor="native").method("forward")
    for x in (ids, torch.tensor([2, 2, 0, 0, 1]), torch.tensor([7, 1, 0, 7, 7])):
        w = torch.rand(len(x), dtype=torch.float64)
        got = method(x.numpy(), w.numpy())
        for g, want in zip(got, model(x, w)):
            np.testing.assert_array_equal(g, want.numpy())  # sums in float64, in order
    with pytest.raises(Exception, match=r"at most 8"):
        method(np.array([9, 0, 0, 0, 0]), np.ones(5))
