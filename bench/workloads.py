"""What the benchmarks run: the model zoo plus synthetic workloads.

Every workload is a factory returning ``(model.eval(), example_inputs)`` like the zoo's:

- the six zoo models (``opforge.examples.zoo.ZOO``);
- ``eltwise_chain``: ten elementwise ops over one 1M-element float32 tensor — memory
  bandwidth and per-op dispatch, no BLAS;
- ``tiny_add``: one add of two 1×4 tensors — the runtime's fixed cost per call;
- ``chain_N``: N tiny adds in a row on 1×4 tensors — the per-instruction cost is the
  slope of time over N (micro.py fits it);
- ``big_mlp``: Linear layers holding ~100 MB of float32 weights — load time and resident
  memory of a program whose constants are memory-mapped;
- ``anchor_mlp``, ``anchor_cnn``, ``anchor_transformer``: the performance issue's anchor
  workloads at their sizes (3 × Linear 512 on a batch of 32; two 3×3 convolutions, pooling
  and a linear on 1×3×64×64; a ``TransformerEncoderLayer`` with d=256, 4 heads, FFN 1024,
  sequence 128, batch-first); with ``eltwise_chain`` the four anchors;
- ``resnet18_224``, ``mobilenet_v2_224``: torchvision's ResNet-18 and MobileNetV2 on
  1×3×224×224, random weights (``vision_models.py``), and ``*_8a8w``: the same quantized
  8a8w by opforge's PT2E path (``quantized_workloads.py``: each runtime's own way to run
  such a model, and the tolerance its outputs are checked with).

This module imports torch: it runs in the prepare step and in torch-based workers only.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

import quantized_workloads
import vision_models
from opforge.examples.zoo import ZOO

__all__ = ["WORKLOADS", "MAIN", "CHAIN_LENGTHS", "workload"]

CHAIN_LENGTHS = (1, 8, 32, 128)


class EltwiseChain(nn.Module):
    """Ten elementwise ops; each reads and writes the whole tensor once."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 1.5
        y = y + 0.25
        y = torch.relu(y)
        y = y - x
        y = torch.sigmoid(y)
        y = y * x
        y = torch.tanh(y)
        y = torch.abs(y)
        y = y + x
        return torch.neg(y)


def eltwise_chain() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    gen = torch.Generator().manual_seed(0)
    return EltwiseChain().eval(), (torch.randn(1_000_000, generator=gen),)


class TinyAdd(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a + b


def tiny_add() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    gen = torch.Generator().manual_seed(0)
    return TinyAdd().eval(), (torch.randn(1, 4, generator=gen), torch.randn(1, 4, generator=gen))


class AddChain(nn.Module):
    """``length`` adds in a row: ``x = x + y`` (each one instruction after export)."""

    def __init__(self, length: int) -> None:
        super().__init__()
        self.length = length

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        for _ in range(self.length):
            x = x + y
        return x


def _chain(length: int) -> Callable[[], tuple[nn.Module, tuple[torch.Tensor, ...]]]:
    def factory() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
        gen = torch.Generator().manual_seed(0)
        inputs = (torch.randn(1, 4, generator=gen), torch.randn(1, 4, generator=gen) * 1e-3)
        return AddChain(length).eval(), inputs
    return factory


def big_mlp() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """Six 2048×2048 Linear layers: 6 × 16.8 MB ≈ 101 MB of float32 weights."""
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(6):
        layers += [nn.Linear(2048, 2048), nn.ReLU()]
    model = nn.Sequential(*layers[:-1])
    gen = torch.Generator().manual_seed(0)
    return model.eval(), (torch.randn(1, 2048, generator=gen),)


def anchor_mlp() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                          nn.Linear(512, 512))
    return model.eval(), (torch.randn(32, 512, generator=torch.Generator().manual_seed(0)),)


def anchor_cnn() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, padding=1),
                          nn.ReLU(), nn.MaxPool2d(2), nn.AdaptiveAvgPool2d(4), nn.Flatten(),
                          nn.Linear(32 * 16, 10))
    return model.eval(), (torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(0)),)


def anchor_transformer() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    model = nn.TransformerEncoderLayer(d_model=256, nhead=4, dim_feedforward=1024,
                                       batch_first=True, dropout=0.0)
    return model.eval(), (torch.randn(1, 128, 256, generator=torch.Generator().manual_seed(0)),)


WORKLOADS: dict[str, Callable[[], tuple[nn.Module, tuple[torch.Tensor, ...]]]] = {
    **ZOO,
    "eltwise_chain": eltwise_chain,
    "tiny_add": tiny_add,
    **{f"chain_{n}": _chain(n) for n in CHAIN_LENGTHS},
    "big_mlp": big_mlp,
    "anchor_mlp": anchor_mlp,
    "anchor_cnn": anchor_cnn,
    "anchor_transformer": anchor_transformer,
    "resnet18_224": vision_models.resnet18,
    "mobilenet_v2_224": vision_models.mobilenet_v2,
}
WORKLOADS.update({f"{name}{quantized_workloads.SCHEME_SUFFIX}": quantized_workloads.factory(
    f"{name}{quantized_workloads.SCHEME_SUFFIX}") for name in ("resnet18_224", "mobilenet_v2_224")})

# The workloads of the main table, in its row order.
MAIN = (*ZOO, "eltwise_chain", "tiny_add")


def workload(name: str) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    try:
        factory = WORKLOADS[name]
    except KeyError:
        raise SystemExit(f"bench: unknown workload {name!r}; known: {', '.join(WORKLOADS)}") from None
    return factory()
