"""Small models built from upsampling, sorting, scans, dim reductions, norms, instance norm
and embedding bags export for the portable kernels and run on the lean runtime (NumPy
only) with eager PyTorch's results.

Tolerances: float32 end to end, a handful of ops per model: rtol 1e-4 / atol 1e-5, as in
test_runtime_zoo (measured: max abs error ~2e-6). Indices (argmax, topk, sort) and masks
are compared exactly; the inputs are continuous random values, so ties have probability 0.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import opforge
from opforge.runtime import load

RTOL, ATOL = 1e-4, 1e-5


class UNetBlock(nn.Module):
    """Down, up with nn.Upsample (nearest), a skip concatenation, InstanceNorm2d."""

    def __init__(self) -> None:
        super().__init__()
        self.down = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        self.fuse = nn.Conv2d(8 + 3, 4, 3, padding=1)
        self.norm = nn.InstanceNorm2d(4, affine=True)

    def forward(self, x):
        y = torch.relu(self.down(x))
        y = torch.cat([self.up(y), x], dim=1)
        return torch.relu(self.norm(self.fuse(y)))


class Interpolations(nn.Module):
    def forward(self, x, seq):
        return (F.interpolate(x, size=(7, 9), mode="bilinear", align_corners=True),
                F.interpolate(x, scale_factor=1.5, mode="bilinear", align_corners=False),
                F.interpolate(x, size=(5, 11), mode="nearest"),
                F.interpolate(x, scale_factor=(0.5, 2.0), mode="nearest-exact"),
                F.interpolate(seq, scale_factor=2.5, mode="linear"))


class SortsAndScans(nn.Module):
    def forward(self, x):
        values, indices = torch.topk(x, 3, dim=-1)
        smallest = torch.topk(x, 2, dim=0, largest=False).values
        ordered, order = torch.sort(x, dim=1, descending=True, stable=True)
        return (values, indices, smallest, ordered, order, torch.cumsum(x, dim=1),
                torch.cumprod(x * 0.5 + 1, dim=0), torch.cumsum(order, dim=-1))


class Reductions(nn.Module):
    def forward(self, x):
        top, where = x.max(dim=1)
        low = x.min(dim=2, keepdim=True).values
        norms = torch.linalg.vector_norm(x, dim=(1, 2))
        peak = torch.linalg.vector_norm(x, ord=float("inf"), dim=-1, keepdim=True)
        angle = torch.atan2(x, torch.ones_like(x))
        masked = torch.where(torch.isnan(x) | torch.isinf(x), torch.zeros_like(x), x)
        return top, where, low, norms, peak, F.normalize(x, dim=1), angle, masked


class Bags(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mean = nn.EmbeddingBag(20, 6, mode="mean")
        self.sum = nn.EmbeddingBag(20, 6, mode="sum", padding_idx=0)
        self.max = nn.EmbeddingBag(20, 6, mode="max")

    def forward(self, tokens, offsets, weights):
        return (self.mean(tokens, offsets), self.sum(tokens, offsets, per_sample_weights=weights),
                self.max(tokens, offsets))


def _cases():
    torch.manual_seed(0)
    tokens = torch.tensor([3, 0, 7, 7, 19, 4, 0, 2, 11])
    return {
        "unet_block": (UNetBlock(), (torch.randn(2, 3, 8, 8),)),
        "interpolations": (Interpolations(), (torch.randn(2, 3, 4, 6), torch.randn(2, 3, 5))),
        "sorts_and_scans": (SortsAndScans(), (torch.randn(4, 10),)),
        "reductions": (Reductions(), (torch.randn(3, 4, 5),)),
        "bags": (Bags(), (tokens, torch.tensor([0, 2, 2, 6]), torch.rand(9))),
    }


CASES = _cases()


@pytest.fixture(scope="module")
def programs():
    """Each model exported once for the portable kernels (which refuses missing kernels)."""
    return {name: opforge.export(model.eval(), inputs, kernels="portable")
            for name, (model, inputs) in CASES.items()}


@pytest.mark.parametrize("name", sorted(CASES))
def test_model_runs_on_portable_kernels_like_eager(name, programs):
    model, inputs = CASES[name]
    with torch.no_grad():
        expected = model(*inputs)
    expected = expected if isinstance(expected, tuple) else (expected,)
    forward = load(programs[name]).method("forward")
    arrays = [t.numpy() for t in inputs]
    for _ in range(2):  # a second call on the same arena gives the same answer
        got = forward(*arrays)
        assert len(got) == len(expected)
        for i, (g, e) in enumerate(zip(got, expected)):
            e = e.numpy()
            assert g.shape == e.shape and g.dtype == e.dtype, f"{name} output {i}"
            if e.dtype.kind in "biu":
                np.testing.assert_array_equal(g, e, err_msg=f"{name} output {i}")
            else:
                np.testing.assert_allclose(g, e, rtol=RTOL, atol=ATOL,
                                           err_msg=f"{name} output {i}")


def test_the_models_use_the_new_kernels(programs):
    # nearest-exact and 1-d linear have no .vec out overload: export decomposes them into
    # index arithmetic and gathers, which the interpolations model checks end to end.
    keys = set()
    for program in programs.values():
        keys |= {o.key for o in program.method("forward").operators}
    assert {
        "aten::upsample_nearest2d.vec_out", "aten::upsample_bilinear2d.vec_out",
        "aten::topk.values", "aten::sort.values_stable", "aten::cumsum.out",
        "aten::cumprod.out", "aten::max.dim_max", "aten::min.dim_min",
        "aten::linalg_vector_norm.out", "aten::atan2.out", "aten::isnan.out",
        "aten::isinf.out", "aten::_native_batch_norm_legit.no_stats_out",
        "aten::_embedding_bag.out",
    } <= keys, sorted(keys)
