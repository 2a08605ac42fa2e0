"""A small model that uses every bundled example operator (``my_ops``), for export → run.

>>> model, inputs = custom_op_model()      # doctest: +SKIP
>>> tuple(model(*inputs).shape)            # doctest: +SKIP
(4,)
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["CustomOpModel", "custom_op_model"]


class CustomOpModel(nn.Module):
    """mul3 → +1 → (max − min along dim 1) · 4 + scaled_sum over dim 1, then a linear."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ops = torch.ops.my_ops
        y = ops.mul3(self.proj(x)) + 1
        low, high = ops.minmax(y, 1)
        return ops.mul4(high - low) + ops.scaled_sum(y, 0.5, [1])


def custom_op_model(seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """``(model, (x,))`` with x of shape (4, 8); registers the example ops with torch."""
    from opforge.examples.my_ops import register_examples

    register_examples()
    torch.manual_seed(seed)
    model = CustomOpModel().eval()
    return model, (torch.randn(4, 8, generator=torch.Generator().manual_seed(seed)),)
