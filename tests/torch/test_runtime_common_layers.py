"""Common layers outside the zoo — recurrent nets, transposed and 1-d/3-d convolutions,
activation zoo, padding modes, pixel shuffle, attention with masks, casts and scans —
export for the portable kernels and run on the lean runtime with eager's results.

Each model is exported with ``kernels="portable"`` (so a missing kernel fails the export,
naming it) and run twice (the second call over the first call's arena contents).

Tolerances: float32 end to end over a few dozen ops (the LSTM/GRU unroll ~100): rtol
1e-4 / atol 2e-5; measured max abs error <= 6e-6 (the padding model sums 50 values).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import opforge
from opforge.runtime import load

RTOL, ATOL = 1e-4, 2e-5


class Recurrent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(8, 16, num_layers=2, batch_first=True)
        self.gru = nn.GRU(16, 8, batch_first=True, bidirectional=True)

    def forward(self, x):
        return self.gru(self.lstm(x)[0])[0]


class Activations(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.prelu = nn.PReLU(4)

    def forward(self, x):
        return (F.leaky_relu(x, 0.1) + F.elu(x) + F.hardswish(x) + F.mish(x)
                + F.softplus(x) + F.hardsigmoid(x) + self.prelu(x) + F.selu(x)
                + F.logsigmoid(x) + F.relu6(3 * x) + F.hardtanh(x, -0.5, 0.25))


class Paddings(nn.Module):
    def forward(self, x):
        return torch.cat([F.pad(x, (1, 2, 2, 1), mode="reflect").flatten(),
                          F.pad(x, (1, 1, 1, 1), mode="replicate").flatten(),
                          F.pad(x, (1, 1), value=2.0).flatten()])


class ConvTransposeShuffle(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1)
        self.conv = nn.Conv2d(6, 16, 3, padding=1)
        self.shuffle = nn.PixelShuffle(2)

    def forward(self, x):
        return self.shuffle(self.conv(self.up(x)))


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mha = nn.MultiheadAttention(16, 4, batch_first=True)

    def forward(self, x):
        mask = torch.triu(torch.ones(x.shape[1], x.shape[1], dtype=torch.bool), 1)
        attended = self.mha(x, x, x, attn_mask=mask, need_weights=False)[0]
        q = x.view(x.shape[0], x.shape[1], 4, 4).transpose(1, 2)
        sdpa = F.scaled_dot_product_attention(q, q * 0.5, q + 1, is_causal=True)
        return attended + sdpa.transpose(1, 2).reshape(x.shape)


class CastsAndScans(nn.Module):
    """``.float()`` / ``.int()`` (metadata assertions in the captured graph), einsum,
    masked_fill, argmax, cumsum, std."""

    def forward(self, x):
        a, b = x.chunk(2, dim=1)
        y = torch.einsum("bchw,bchw->bhw", a, b)
        z = x.masked_fill(x > 0.5, -1.0).flatten(1)
        return torch.cat([y.flatten(), z.argmax(1).float(), torch.cumsum(z, 1).flatten(),
                          x.clamp(-0.2, 0.3).std(dim=(2, 3)).flatten(),
                          (x * 4).int().sum(1).float().flatten()])


class Norms(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.group = nn.GroupNorm(2, 4)
        self.layer = nn.LayerNorm([4, 6, 6])
        self.pool = nn.AdaptiveMaxPool2d(2)

    def forward(self, x):
        return self.pool(self.layer(self.group(x)))


class Conv1dNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(4, 8, 5, padding=2, groups=2)
        self.bn = nn.BatchNorm1d(8)

    def forward(self, x):
        return F.avg_pool1d(F.max_pool1d(F.gelu(self.bn(self.conv(x))), 2), 2)


class Conv3dNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv3d(2, 4, 3, padding=1)

    def forward(self, x):
        return F.max_pool3d(torch.relu(self.conv(x)), 2)


def _randn(*shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(len(shape)))


MODELS = {
    "recurrent": (Recurrent, (_randn(2, 5, 8),)),
    "activations": (Activations, (_randn(2, 4, 3, 3),)),
    "paddings": (Paddings, (_randn(1, 2, 5, 5),)),
    "conv_transpose_shuffle": (ConvTransposeShuffle, (_randn(1, 4, 5, 5),)),
    "attention": (Attention, (_randn(2, 5, 16),)),
    "casts_and_scans": (CastsAndScans, (_randn(2, 4, 6, 6),)),
    "norms": (Norms, (_randn(2, 4, 6, 6),)),
    "conv1d": (Conv1dNet, (_randn(2, 4, 16),)),
    "conv3d": (Conv3dNet, (_randn(1, 2, 4, 4, 4),)),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_common_layers_run_lean_like_eager(name):
    factory, inputs = MODELS[name]
    torch.manual_seed(0)
    model = factory().eval()
    with torch.no_grad():
        expected = model(*inputs)
    forward = load(opforge.export(model, inputs, kernels="portable"), mode="lean").method("forward")
    arrays = [t.numpy() for t in inputs]
    for _ in range(2):
        (out,) = forward(*arrays)
        assert out.shape == tuple(expected.shape) and out.dtype == np.float32
        np.testing.assert_allclose(out, expected.numpy(), rtol=RTOL, atol=ATOL)
