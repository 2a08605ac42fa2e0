"""The model zoo: small PyTorch models that exercise the export → run pipeline.

Every factory returns ``(model.eval(), example_inputs)`` built from a fixed seed, with
sizes small enough that exporting and running a model takes well under a second. The
zoo is what decides which ATen operators the portable kernel library must cover
(``tests/torch/test_zoo_ops.py`` checks exactly that).

Example::

    >>> from opforge.examples.zoo import ZOO
    >>> model, inputs = ZOO["mlp"]()
    >>> tuple(model(*inputs).shape)
    (4, 10)

This module imports torch; the lean runtime never imports it.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch import nn

__all__ = [
    "ZOO",
    "mlp",
    "cnn",
    "resnet_block",
    "depthwise_separable",
    "transformer_layer",
    "gpt_decoder",
]

_SEED = 0


def _seeded(seed: int = _SEED) -> torch.Generator:
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


def _randomize_batch_norm(module: nn.Module) -> None:
    # Fresh BatchNorm layers have mean 0 / var 1 / weight 1 / bias 0, which would make
    # a wrong normalisation kernel look right; give them non-trivial statistics.
    for sub in module.modules():
        if isinstance(sub, nn.BatchNorm2d):
            with torch.no_grad():
                sub.running_mean.uniform_(-0.5, 0.5)
                sub.running_var.uniform_(0.5, 2.0)
                sub.weight.uniform_(0.5, 1.5)
                sub.bias.uniform_(-0.5, 0.5)


def mlp() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """64 → 128 → 128 → 10 with ReLU and GELU, batch 4."""
    gen = _seeded()
    model = nn.Sequential(
        nn.Linear(64, 128), nn.ReLU(),
        nn.Linear(128, 128), nn.GELU(),
        nn.Linear(128, 10),
    )
    return model.eval(), (torch.randn(4, 64, generator=gen),)


def cnn() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """(conv-bn-relu-maxpool) ×2, adaptive average pool, linear; input 1×3×32×32."""
    gen = _seeded()
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10),
    )
    _randomize_batch_norm(model)
    return model.eval(), (torch.randn(1, 3, 32, 32, generator=gen),)


class ResNetBasicBlock(nn.Module):
    """The ResNet basic block with a strided 1×1 downsample on the shortcut."""

    def __init__(self, in_channels: int, out_channels: int, stride: int = 2) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.downsample = nn.Sequential(
            nn.Conv2d(in_channels, out_channels, 1, stride, bias=False),
            nn.BatchNorm2d(out_channels),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return torch.relu(y + self.downsample(x))


def resnet_block() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """One basic block 16 → 32 channels, stride 2; input 1×16×16×16."""
    gen = _seeded()
    model = ResNetBasicBlock(16, 32, stride=2)
    _randomize_batch_norm(model)
    return model.eval(), (torch.randn(1, 16, 16, 16, generator=gen),)


def depthwise_separable() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """MobileNet-style depthwise (groups=C) + pointwise conv, bn, ReLU6; input 1×16×16×16."""
    gen = _seeded()
    channels = 16
    model = nn.Sequential(
        nn.Conv2d(channels, channels, 3, padding=1, groups=channels, bias=False),
        nn.BatchNorm2d(channels), nn.ReLU6(),
        nn.Conv2d(channels, 32, 1, bias=False),
        nn.BatchNorm2d(32), nn.Hardtanh(0.0, 6.0),
    )
    _randomize_batch_norm(model)
    return model.eval(), (torch.randn(1, channels, 16, 16, generator=gen),)


def transformer_layer() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """``nn.TransformerEncoderLayer`` (d_model 64, 4 heads, ff 128) on 2×16×64."""
    gen = _seeded()
    model = nn.TransformerEncoderLayer(
        d_model=64, nhead=4, dim_feedforward=128, batch_first=True, dropout=0.0
    )
    return model.eval(), (torch.randn(2, 16, 64, generator=gen),)


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention written out with matmul, masking and softmax."""

    def __init__(self, d_model: int, n_head: int, block_size: int) -> None:
        super().__init__()
        self.n_head = n_head
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        mask = torch.tril(torch.ones(block_size, block_size, dtype=torch.bool))
        self.register_buffer("causal_mask", mask.view(1, 1, block_size, block_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, d_model = x.shape
        head_dim = d_model // self.n_head
        q, k, v = self.qkv(x).split(d_model, dim=2)
        q = q.view(batch, seq, self.n_head, head_dim).transpose(1, 2)
        k = k.view(batch, seq, self.n_head, head_dim).transpose(1, 2)
        v = v.view(batch, seq, self.n_head, head_dim).transpose(1, 2)
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(head_dim))
        mask = self.causal_mask[:, :, :seq, :seq]
        scores = scores.masked_fill(~mask, float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        y = (weights @ v).transpose(1, 2).contiguous().view(batch, seq, d_model)
        return self.proj(y)


class GPTBlock(nn.Module):
    def __init__(self, d_model: int, n_head: int, block_size: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_head, block_size)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, 4 * d_model),
            nn.GELU(approximate="tanh"),
            nn.Linear(4 * d_model, d_model),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPTDecoder(nn.Module):
    """A GPT-2-shaped decoder: token + learned position embeddings, blocks, lm head."""

    def __init__(self, vocab: int = 256, d_model: int = 64, n_head: int = 4,
                 n_layer: int = 2, block_size: int = 32) -> None:
        super().__init__()
        self.token_embedding = nn.Embedding(vocab, d_model)
        self.position_embedding = nn.Embedding(block_size, d_model)
        self.blocks = nn.ModuleList(
            [GPTBlock(d_model, n_head, block_size) for _ in range(n_layer)]
        )
        self.ln_f = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.token_embedding(tokens) + self.position_embedding(positions)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def gpt_decoder() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """Two GPT blocks, vocab 256, d_model 64; int64 tokens 1×32."""
    gen = _seeded()
    model = GPTDecoder()
    tokens = torch.randint(0, 256, (1, 32), generator=gen, dtype=torch.int64)
    return model.eval(), (tokens,)


# A model with a custom operator is added here by the custom-op stage (opforge.torch_bridge).
ZOO: dict[str, Callable[[], tuple[nn.Module, tuple[torch.Tensor, ...]]]] = {
    "mlp": mlp,
    "cnn": cnn,
    "resnet_block": resnet_block,
    "depthwise_separable": depthwise_separable,
    "transformer_layer": transformer_layer,
    "gpt_decoder": gpt_decoder,
}
