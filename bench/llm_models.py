"""The language-model benchmark's models: the bundled decoder at two sizes, and the form
ONNX Runtime gets (the KV cache as inputs and outputs instead of state).

- ``tiny``: ``opforge.examples.decoder.TinyDecoder``'s defaults (vocabulary 64, hidden 32,
  2 layers, 4 heads, 2 KV heads, MLP 64), with 256 cache positions;
- ``base``: hidden 768, 12 layers, 12 heads, 4 KV heads, MLP 2048, vocabulary 32000, 256
  cache positions: 125.5M parameters (embedding and head not tied);
- ``1b``: Llama-3.2-1B's shape (vocabulary 128256, hidden 2048, 16 layers, 32 heads, 8 KV
  heads, MLP 8192), 256 cache positions: 1.50B parameters, because the embedding and the
  head are *not* tied as Llama-3.2-1B ties them (1.24B there): TinyDecoder has no tying, so
  every runtime reads both 525M-parameter matrices (the head is read per token anyway; the
  embedding only by rows). Measured by ``bench/llm.py --llamacpp --configs 1b`` only
  (opforge-cpu and llama.cpp, one file at a time: a float32 program is 6 GB).

Weights are random (``TinyDecoder(seed=0)``): no download, the same model in every process.
``build(config, logits_to_keep=1)`` returns the last row's logits only (TinyDecoder's
option): what generation reads and what llama-bench's prompt processing computes;
bench/llm.py builds every runtime's model so (``--logits-to-keep``).
"""

from __future__ import annotations

CONFIGS = {
    "tiny": dict(vocab=64, dim=32, heads=4, kv_heads=2, hidden=64, layers=2, max_len=256),
    "base": dict(vocab=32000, dim=768, heads=12, kv_heads=4, hidden=2048, layers=12,
                 max_len=256),
    "1b": dict(vocab=128256, dim=2048, heads=32, kv_heads=8, hidden=8192, layers=16,
               max_len=256),
}
PROMPT_TOKENS = 128
NEW_TOKENS = 128


def build(config: str, logits_to_keep: int = 0):
    from opforge.examples.decoder import TinyDecoder

    return TinyDecoder(**CONFIGS[config], seed=0, logits_to_keep=logits_to_keep).eval()


def prompt(config: str) -> list[int]:
    """The benchmark's prompt: PROMPT_TOKENS ids spread over the vocabulary."""
    vocab = CONFIGS[config]["vocab"]
    return [(7919 * i + 13) % vocab for i in range(PROMPT_TOKENS)]


def parameter_count(model) -> int:
    return sum(p.numel() for p in model.parameters())


def cache_functional(model):
    """``model`` as ``(tokens, positions, caches) -> (logits, *new_caches)``, caches a
    list: the same computation as ``TinyDecoder.forward`` with each layer's key and value
    caches passed in and returned (``index_copy`` instead of ``index_copy_``), which is
    what an exporter without state (ONNX) can express."""
    import torch

    from opforge.examples.decoder import _rotate

    class CacheIO(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, tokens, positions, caches):
            m = self.model
            x = m.embed(tokens)
            cos, sin = m.cos_table[positions], m.sin_table[positions]
            mask = m.slots[None, :] > positions[:, None]
            new = []
            for i, block in enumerate(m.blocks):
                a, h = block.attn, block.norm1(x)
                seq = h.shape[0]
                q = a.q(h).view(seq, a.heads, a.head_dim)
                k = a.k(h).view(seq, a.kv_heads, a.head_dim)
                v = a.v(h).view(seq, a.kv_heads, a.head_dim)
                q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
                k_cache = caches[2 * i].index_copy(0, positions, k)
                v_cache = caches[2 * i + 1].index_copy(0, positions, v)
                new += [k_cache, v_cache]
                group = a.heads // a.kv_heads
                keys = k_cache.repeat_interleave(group, dim=1).transpose(0, 1)
                values = v_cache.repeat_interleave(group, dim=1).transpose(0, 1)
                scores = q.transpose(0, 1) @ keys.transpose(1, 2) / a.head_dim ** 0.5
                scores = scores.masked_fill(mask, float("-inf"))
                out = torch.softmax(scores, dim=-1) @ values
                x = x + a.o(out.transpose(0, 1).reshape(seq, -1))
                h = block.norm2(x)
                x = x + block.down(torch.nn.functional.silu(block.gate(h)) * block.up(h))
            if m.logits_to_keep:
                x = x[-m.logits_to_keep:]
            return (m.head(m.norm(x)), *new)

    return CacheIO().eval()


def empty_caches(config: str):
    """Zeroed key/value caches for ``cache_functional``: 2 per layer, [max_len, kv, d]."""
    import numpy as np

    c = CONFIGS[config]
    shape = (c["max_len"], c["kv_heads"], c["dim"] // c["heads"])
    return [np.zeros(shape, np.float32) for _ in range(2 * c["layers"])]
