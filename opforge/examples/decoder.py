"""A small decoder-only language model with a static KV cache, for dynamic shapes and state.

RMSNorm, rotary position embeddings, grouped-query attention and a SwiGLU MLP; the key
and value caches are buffers updated in place with ``index_copy_`` at the positions the
caller passes, so one exported method serves both the prompt (``seq`` tokens at positions
``0..seq-1``) and each decoding step (one token at its position). ``greedy_decode`` runs
any ``step(tokens, positions) -> logits`` callable: the eager module or an exported
program's method.

Two opt-in choices change what attention reads (docs/generation.md, "Attention over what
is filled"): ``attend="filled"`` attends over the cache slots ``0..max(positions)`` only
(a data-dependent size, bounded by ``max_len``, so a step at position 10 of a 2,048-slot
cache reads 11 slots) instead of every slot under a mask; ``cache_dtype=torch.float16``
(or ``torch.bfloat16``) stores the caches at half the bytes, converted from float32 where
a step writes them and back to float32 where attention reads them.

``logits_to_keep=1`` (transformers' name; ``0``, the default, keeps every row) returns the
logits of the last ``n`` rows only: a prompt's call then computes ``[1, vocab]`` instead of
``[seq, vocab]`` (the output projection of the other rows is the work generation throws
away: it reads the last row only, as llama.cpp's prompt processing computes it only).

>>> import torch
>>> model = TinyDecoder().eval()
>>> tokens = greedy_decode(lambda t, p: model(t, p), [1, 2, 3], 4)
>>> len(tokens)
4
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import nn

__all__ = ["TinyDecoder", "greedy_decode", "export_decoder", "tiny_decoder"]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def _attended(cache: torch.Tensor, mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The cache slots the mask's columns cover, as ``dtype``: the whole cache when the mask
    spans it (the default graph, no slice and no conversion), else its first slots."""
    slots = mask.shape[-1]
    if not (isinstance(slots, int) and slots == cache.shape[0]):
        cache = cache[:slots]
    return _as(cache, dtype)


def _as(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x`` as ``dtype``, with no node in the exported graph when it already is."""
    return x if x.dtype == dtype else x.to(dtype)


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int, max_len: int,
                 cache_dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.q = nn.Linear(dim, heads * self.head_dim, bias=False)
        self.k = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.v = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.o = nn.Linear(heads * self.head_dim, dim, bias=False)
        shape = (max_len, kv_heads, self.head_dim)
        self.register_buffer("k_cache", torch.zeros(shape, dtype=cache_dtype))
        self.register_buffer("v_cache", torch.zeros(shape, dtype=cache_dtype))

    def forward(self, x, positions, cos, sin, mask):
        seq = x.shape[0]
        q = self.q(x).view(seq, self.heads, self.head_dim)
        k = self.k(x).view(seq, self.kv_heads, self.head_dim)
        v = self.v(x).view(seq, self.kv_heads, self.head_dim)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        # (a float32 cache: no conversion; a float16/bfloat16 one: the written rows only)
        self.k_cache.index_copy_(0, positions, _as(k, self.k_cache.dtype))
        self.v_cache.index_copy_(0, positions, _as(v, self.v_cache.dtype))
        group = self.heads // self.kv_heads
        keys = _attended(self.k_cache, mask, q.dtype)
        values = _attended(self.v_cache, mask, q.dtype)
        keys = keys.repeat_interleave(group, dim=1).transpose(0, 1)  # (heads, slots, d)
        values = values.repeat_interleave(group, dim=1).transpose(0, 1)
        scores = q.transpose(0, 1) @ keys.transpose(1, 2) / self.head_dim ** 0.5
        scores = scores.masked_fill(mask, float("-inf"))
        out = torch.softmax(scores, dim=-1) @ values  # (heads, seq, d)
        return self.o(out.transpose(0, 1).reshape(seq, -1))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int, hidden: int, max_len: int,
                 cache_dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.norm1, self.norm2 = RMSNorm(dim), RMSNorm(dim)
        self.attn = Attention(dim, heads, kv_heads, max_len, cache_dtype)
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x, positions, cos, sin, mask):
        x = x + self.attn(self.norm1(x), positions, cos, sin, mask)
        h = self.norm2(x)
        return x + self.down(torch.nn.functional.silu(self.gate(h)) * self.up(h))


class TinyDecoder(nn.Module):
    """``forward(tokens[seq] int64, positions[seq] int64) -> logits[seq, vocab]``; the
    caches hold ``max_len`` positions, stored as ``cache_dtype``. ``attend="capacity"``
    (the default) scores every slot and masks the unwritten ones; ``"filled"`` reads slots
    ``0..max(positions)`` only (the same logits: a masked slot's weight is exactly 0).
    ``logits_to_keep=n`` (``n >= 1``) returns the last ``min(n, seq)`` rows' logits only;
    ``0`` (the default) every row's."""

    def __init__(self, vocab: int = 64, dim: int = 32, heads: int = 4, kv_heads: int = 2,
                 hidden: int = 64, layers: int = 2, max_len: int = 48, seed: int = 0,
                 attend: str = "capacity", cache_dtype: torch.dtype = torch.float32,
                 logits_to_keep: int = 0) -> None:
        super().__init__()
        if attend not in ("capacity", "filled"):
            raise ValueError(f"TinyDecoder(attend=...): {attend!r} — valid: 'capacity' (every "
                             "cache slot, masked) or 'filled' (slots 0..max(positions))")
        if cache_dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise ValueError(f"TinyDecoder(cache_dtype=...): {cache_dtype} — valid: "
                             "torch.float32, torch.float16 or torch.bfloat16")
        if isinstance(logits_to_keep, bool) or not isinstance(logits_to_keep, int) \
                or logits_to_keep < 0:
            raise ValueError(f"TinyDecoder(logits_to_keep=...): {logits_to_keep!r} — valid: 0 "
                             "(every row's logits) or n >= 1 (the last n rows') — fix: pass "
                             "1 for generation, which reads the last row only")
        generator = torch.Generator().manual_seed(seed)
        self.max_len, self.attend, self.logits_to_keep = max_len, attend, logits_to_keep
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, kv_heads, hidden, max_len, cache_dtype)
                                    for _ in range(layers))
        self.norm = RMSNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        head_dim = dim // heads
        inv = 1.0 / (10000 ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        angles = torch.arange(max_len, dtype=torch.float32)[:, None] * inv[None, :]
        angles = torch.cat([angles, angles], dim=-1)
        self.register_buffer("cos_table", angles.cos()[:, None, :], persistent=False)
        self.register_buffer("sin_table", angles.sin()[:, None, :], persistent=False)
        self.register_buffer("slots", torch.arange(max_len), persistent=False)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=generator) * 0.3)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        cos, sin = self.cos_table[positions], self.sin_table[positions]
        slots = self.slots
        if self.attend == "filled":
            # the slots written so far: a size read from the positions' values (exported as
            # a data-dependent size planned at max_len, checked on every call)
            filled = positions.max().item() + 1
            torch._check(filled >= 1)
            torch._check(filled <= self.max_len)
            slots = slots[:filled]
        mask = slots[None, :] > positions[:, None]  # causal over the slots attended to
        for block in self.blocks:
            x = block(x, positions, cos, sin, mask)
        if self.logits_to_keep:
            x = x[-self.logits_to_keep:]  # the rows whose logits are kept (all when fewer)
        return self.head(self.norm(x))


def greedy_decode(step: Callable, prompt: Sequence[int], new_tokens: int) -> list[int]:
    """Prefill ``prompt`` in one call, then feed back the argmax ``new_tokens - 1`` times;
    returns the ``new_tokens`` generated tokens. ``step(tokens, positions)`` gets int64
    arrays (torch tensors for the eager module) and returns logits."""
    def call(tokens, positions):
        logits = step(tokens, positions)
        return int(torch.as_tensor(logits)[-1].argmax())

    tokens = [call(torch.tensor(list(prompt)), torch.arange(len(prompt)))]
    position = len(prompt)
    while len(tokens) < new_tokens:
        tokens.append(call(torch.tensor([tokens[-1]]), torch.tensor([position])))
        position += 1
    return tokens


def tiny_decoder() -> tuple[TinyDecoder, tuple[torch.Tensor, torch.Tensor]]:
    """A factory for ``opforge export``: the model and a 3-token example
    (``tokens``, ``positions``). The sequence is made dynamic on the command line, the
    same name on both inputs (docs/generation.md, "Exporting a decoder")::

        opforge export opforge.examples.decoder:tiny_decoder -o decoder.opf \\
            --dim 0:0:seq:1:48 --dim 1:0:seq:1:48
    """
    return TinyDecoder().eval(), (torch.tensor([1, 2, 3]), torch.arange(3))


def export_decoder(model: TinyDecoder, **kwargs):
    """Export ``model`` with a dynamic sequence (1..max_len tokens): one method for the
    prompt and for every decoding step."""
    from opforge.export import export

    seq = torch.export.Dim("seq", min=1, max=model.max_len)
    example = (torch.tensor([1, 2, 3]), torch.arange(3))
    return export(model, example, dynamic_shapes=({0: seq}, {0: seq}), **kwargs)
