"""A Mixtral-style mixture-of-experts layer in plain torch, and a decoder built of them,
for tests/torch/test_moe.py and tests/native_runtime/test_native_moe.py.

The layer computes its experts in the three ways transformers' expert implementations do:

- ``loop``: one expert at a time on the tokens routed to it (``one_hot`` + ``where``: a
  data-dependent token count per expert, planned at its bound; ``index_add`` combines);
- ``grouped``: (token, expert) pairs sorted by expert, counted (``histc``, ``cumsum``) and
  multiplied by ``transformers::grouped_mm_fallback``, transformers' functional custom op
  (defined here as transformers defines it: transformers is not a test dependency);
- ``batched``: each pair's expert weights gathered, one ``bmm``.
"""

from __future__ import annotations

import torch
from torch import nn

from opforge.examples.decoder import Block, TinyDecoder

__all__ = ["Experts", "MoEDecoder", "STYLES", "PROMPT", "tokens"]


def _define_grouped_mm_fallback() -> None:
    """``transformers::grouped_mm_fallback`` as transformers/integrations/moe.py defines it:
    a functional custom op whose only implementation is a Python loop over ``offs``."""
    if hasattr(torch.ops.transformers, "grouped_mm_fallback"):
        return  # transformers is installed and imported

    def grouped_mm_fallback(input: torch.Tensor, weight: torch.Tensor,
                            offs: torch.Tensor) -> torch.Tensor:
        output = torch.zeros(input.size(0), weight.size(2), dtype=input.dtype)
        start = 0
        for i, end in enumerate(offs.tolist()):
            if start == end:
                continue
            torch.mm(input[start:end], weight[i], out=output[start:end])
            start = end
        return output

    torch.library.custom_op("transformers::grouped_mm_fallback", grouped_mm_fallback,
                            mutates_args=(),
                            schema="(Tensor input, Tensor weight, Tensor offs) -> Tensor")
    torch.library.register_fake(
        "transformers::grouped_mm_fallback",
        lambda input, weight, offs: input.new_empty(input.size(0), weight.size(2)))


_define_grouped_mm_fallback()

STYLES = ("loop", "grouped", "batched")
DIM, HIDDEN, EXPERTS, TOP_K = 16, 24, 4, 2


class Experts(nn.Module):
    """A Mixtral sparse block: router → softmax → top-k (renormalized) → SwiGLU experts."""

    def __init__(self, style: str, dim: int = DIM, hidden: int = HIDDEN,
                 experts: int = EXPERTS, top_k: int = TOP_K, seed: int = 0) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.style, self.experts, self.top_k = style, experts, top_k
        self.router = nn.Parameter(torch.randn(experts, dim, generator=generator))
        self.gate_up = nn.Parameter(torch.randn(experts, 2 * hidden, dim, generator=generator) * 0.3)
        self.down = nn.Parameter(torch.randn(experts, dim, hidden, generator=generator) * 0.3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (tokens, dim)
        probs = torch.softmax(x @ self.router.T, dim=-1)
        weights, chosen = torch.topk(probs, self.top_k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        return getattr(self, f"_{self.style}")(x, weights, chosen)

    @staticmethod
    def _swiglu(gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return torch.nn.functional.silu(gate) * up

    def _loop(self, x, weights, chosen):
        out = torch.zeros_like(x)
        mask = torch.nn.functional.one_hot(chosen, self.experts).permute(2, 1, 0)  # (E, k, T)
        for e in range(self.experts):
            slot, token = torch.where(mask[e])  # how many: the data decides
            h = self._swiglu(x[token] @ self.gate_up[e].T) @ self.down[e].T
            out.index_add_(0, token, h * weights[token, slot, None])
        return out

    def _grouped(self, x, weights, chosen):
        expert_ids, order = torch.sort(chosen.reshape(-1))
        rows = x[order // self.top_k]
        counts = torch.histc(expert_ids.float(), bins=self.experts, min=0, max=self.experts - 1)
        offs = torch.cumsum(counts, dim=0, dtype=torch.int32)
        grouped = torch.ops.transformers.grouped_mm_fallback
        h = grouped(self._swiglu(grouped(rows, self.gate_up.transpose(1, 2), offs)),
                    self.down.transpose(1, 2), offs)
        h = h * weights.reshape(-1)[order, None]
        return torch.zeros_like(x).index_add(0, order // self.top_k, h)

    def _batched(self, x, weights, chosen):
        ids = chosen.reshape(-1)
        rows = x.repeat_interleave(self.top_k, dim=0)
        h = torch.bmm(self.gate_up[ids], rows[:, :, None])[:, :, 0]
        h = torch.bmm(self.down[ids], self._swiglu(h)[:, :, None])[:, :, 0]
        h = h * weights.reshape(-1, 1)
        return h.view(x.shape[0], self.top_k, -1).sum(dim=1)


class MoEBlock(Block):
    """The bundled decoder's block with a mixture of experts for its MLP."""

    def __init__(self, *args, style: str, seed: int, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.moe = Experts(style, dim=32, hidden=24, seed=seed)

    def forward(self, x, positions, cos, sin, mask):
        x = x + self.attn(self.norm1(x), positions, cos, sin, mask)
        return x + self.moe(self.norm2(x))


class MoEDecoder(TinyDecoder):
    def __init__(self, style: str) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(MoEBlock(32, 4, 2, 64, self.max_len, style=style, seed=i)
                                    for i in range(2))
        with torch.no_grad():  # the attention weights as the bundled decoder's
            for mine, theirs in zip(self.blocks, TinyDecoder().blocks):
                mine.attn.load_state_dict(theirs.attn.state_dict())
                mine.norm1.load_state_dict(theirs.norm1.state_dict())
                mine.norm2.load_state_dict(theirs.norm2.state_dict())


PROMPT = [5, 9, 1, 3, 17, 2]


def tokens(n: int = 10, seed: int = 1) -> torch.Tensor:
    """``n`` random token vectors of the layer's width."""
    return torch.randn(n, DIM, generator=torch.Generator().manual_seed(seed))
