"""Decoder programs for the generation runner's tests, exported once per process.

- ``flat``: the bundled TinyDecoder, ``(tokens[seq], positions[seq]) -> logits[seq, vocab]``;
- ``batched``: the same weights behind transformers' convention, ``(input_ids[1, seq],
  cache_position[seq]) -> logits[1, seq, vocab]``;
- ``positions_first``: ``(cache_position[seq], input_ids[1, seq])``: only the input names
  say which is which;
- ``short_calls``: a cache of 48 positions, but at most 8 tokens per call (a longer prompt
  is prefilled in chunks);
- ``stateless``: ``(tokens, positions) -> logits`` without a cache.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from opforge.examples.decoder import TinyDecoder, export_decoder, greedy_decode
from opforge.export import export
from opforge.program import from_bytes, to_bytes

PROMPT = [5, 9, 1, 3]


class Batched(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = TinyDecoder().eval()

    def forward(self, input_ids: torch.Tensor, cache_position: torch.Tensor) -> torch.Tensor:
        return self.inner(input_ids[0], cache_position)[None]


class PositionsFirst(Batched):
    def forward(self, cache_position: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
        return self.inner(input_ids[0], cache_position)[None]


class Stateless(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(64, 16)
        self.head = nn.Linear(16, 64)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(tokens) + positions[:, None].float())


def _roundtrip(program):
    return from_bytes(to_bytes(program))


@functools.lru_cache(maxsize=None)
def program(kind: str):
    """The exported program ``kind`` (see the module's docstring)."""
    seq = torch.export.Dim("seq", min=1, max=48)
    ids, positions = torch.tensor([[1, 2, 3]]), torch.arange(3)
    if kind == "flat":
        return _roundtrip(export_decoder(TinyDecoder().eval(), kernels="portable"))
    if kind == "batched":
        return _roundtrip(export(Batched(), (ids, positions),
                                 dynamic_shapes=({1: seq}, {0: seq}), kernels="portable"))
    if kind == "positions_first":
        return _roundtrip(export(PositionsFirst(), (positions, ids),
                                 dynamic_shapes=({0: seq}, {1: seq}), kernels="portable"))
    if kind == "short_calls":
        short = torch.export.Dim("seq", min=1, max=8)
        return _roundtrip(export(TinyDecoder().eval(), (torch.tensor([1, 2, 3]), positions),
                                 dynamic_shapes=({0: short}, {0: short}), kernels="portable"))
    if kind == "stateless":
        return _roundtrip(export(Stateless().eval(), (torch.tensor([1, 2, 3]), positions),
                                 dynamic_shapes=({0: seq}, {0: seq}), kernels="portable"))
    raise KeyError(kind)


@functools.lru_cache(maxsize=None)
def eager_tokens(prompt: tuple[int, ...], new_tokens: int) -> list[int]:
    """What eager PyTorch greedy-decodes from ``prompt`` with the TinyDecoder."""
    model = TinyDecoder().eval()
    with torch.no_grad():
        return greedy_decode(lambda t, p: model(t, p), list(prompt), new_tokens)


def eager_logits(prompt: list[int], tokens: list[int]) -> list[torch.Tensor]:
    """The eager logits each of ``tokens`` was chosen from (prefill, then feeding back)."""
    model = TinyDecoder().eval()
    rows = []
    with torch.no_grad():
        rows.append(model(torch.tensor(prompt), torch.arange(len(prompt)))[-1])
        for i, token in enumerate(tokens[:-1]):
            rows.append(model(torch.tensor([token]), torch.tensor([len(prompt) + i]))[-1])
    return rows
