"""bench/llm_gguf.py maps TinyDecoder's weights onto llama.cpp's llama architecture: every
weight under llama.cpp's name at PyTorch's [out, in] shape, and the q/k rows reordered so
that llama.cpp's interleaved rotary gives the decoder's half-split one. NumPy only: the
rotary check compares two NumPy rotations (the decoder's ``_rotate`` formula and llama.cpp's
rope type NORM as its docs define it), no llama.cpp and no torch."""

from __future__ import annotations

import pathlib
import sys

import numpy as np
import pytest

BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
llm_gguf = pytest.importorskip("llm_gguf")  # bench/llm_gguf.py (NumPy at import)

CONFIG = dict(vocab=300, dim=32, heads=4, kv_heads=2, hidden=48, layers=2, max_len=16)


def state_dict(config: dict, seed: int = 0) -> dict[str, np.ndarray]:
    """TinyDecoder's parameter names and shapes (opforge/examples/decoder.py), random."""
    rng = np.random.default_rng(seed)
    d, h, kv = config["dim"], config["heads"], config["kv_heads"]
    hd = d // h
    shapes = {"embed.weight": (config["vocab"], d), "norm.weight": (d,),
              "head.weight": (config["vocab"], d)}
    for i in range(config["layers"]):
        p = f"blocks.{i}."
        shapes.update({p + "norm1.weight": (d,), p + "norm2.weight": (d,),
                       p + "attn.q.weight": (h * hd, d), p + "attn.k.weight": (kv * hd, d),
                       p + "attn.v.weight": (kv * hd, d), p + "attn.o.weight": (d, h * hd),
                       p + "gate.weight": (config["hidden"], d),
                       p + "up.weight": (config["hidden"], d),
                       p + "down.weight": (d, config["hidden"])})
    return {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}


def half_split_rope(x: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """The decoder's rotation: pairs (x[i], x[i + d/2]), x*cos + cat(-x2, x1)*sin with the
    angle table duplicated over both halves. x: [seq, heads, d]."""
    d = x.shape[-1]
    inv = 1.0 / (llm_gguf.ROPE_BASE ** (np.arange(0, d, 2) / d))
    angles = positions[:, None] * inv[None, :]
    cos = np.cos(np.concatenate([angles, angles], -1))[:, None, :]
    sin = np.sin(np.concatenate([angles, angles], -1))[:, None, :]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + np.concatenate([-x2, x1], -1) * sin


def interleaved_rope(x: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """llama.cpp's rope type NORM (the LLAMA architecture): pairs (x[2i], x[2i+1]) rotated
    by pos * base^(-2i/d)."""
    d = x.shape[-1]
    theta = positions[:, None] * llm_gguf.ROPE_BASE ** (-np.arange(0, d, 2) / d)[None, :]
    cos, sin = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    even, odd = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = even * cos - odd * sin
    out[..., 1::2] = even * sin + odd * cos
    return out


def test_every_weight_is_mapped_once_at_its_shape():
    state = state_dict(CONFIG)
    tensors = llm_gguf.gguf_tensors(state, CONFIG)
    names = [name for name, _ in tensors]
    assert len(names) == len(set(names)) == len(state)
    shapes = {name: array.shape for name, array in tensors}
    d, hd = CONFIG["dim"], CONFIG["dim"] // CONFIG["heads"]
    assert shapes["token_embd.weight"] == shapes["output.weight"] == (CONFIG["vocab"], d)
    assert shapes["output_norm.weight"] == (d,)
    for i in range(CONFIG["layers"]):
        b = f"blk.{i}."
        assert shapes[b + "attn_q.weight"] == (CONFIG["heads"] * hd, d)
        assert shapes[b + "attn_k.weight"] == shapes[b + "attn_v.weight"] == \
            (CONFIG["kv_heads"] * hd, d)
        assert shapes[b + "ffn_gate.weight"] == shapes[b + "ffn_up.weight"] == \
            (CONFIG["hidden"], d)
        assert shapes[b + "ffn_down.weight"] == (d, CONFIG["hidden"])
    # untouched weights pass through as they are (only q and k are reordered)
    arrays = dict(tensors)
    np.testing.assert_array_equal(arrays["blk.1.ffn_down.weight"], state["blocks.1.down.weight"])
    np.testing.assert_array_equal(arrays["blk.0.attn_v.weight"], state["blocks.0.attn.v.weight"])
    np.testing.assert_array_equal(arrays["output.weight"], state["head.weight"])
    assert all(a.dtype == np.float32 and a.flags.c_contiguous for _, a in tensors)


@pytest.mark.parametrize("projection,heads", [("q", "heads"), ("k", "kv_heads")])
def test_llamacpp_rotary_of_reordered_rows_is_the_decoders(projection, heads):
    """llama.cpp rotating the reordered projection gives the decoder's rotated vector,
    reordered the same way, so attention scores q·k are the decoder's."""
    state = state_dict(CONFIG, seed=1)
    arrays = dict(llm_gguf.gguf_tensors(state, CONFIG))
    n, hd = CONFIG[heads], CONFIG["dim"] // CONFIG["heads"]
    x = np.random.default_rng(2).standard_normal((5, CONFIG["dim"]))
    positions = np.array([0, 1, 7, 12, 15], np.float64)
    ours = (x @ state[f"blocks.0.attn.{projection}.weight"].T.astype(np.float64)).reshape(5, n, hd)
    theirs = (x @ arrays[f"blk.0.attn_{projection}.weight"].T.astype(np.float64)).reshape(5, n, hd)
    order = np.stack([np.arange(hd // 2), np.arange(hd // 2) + hd // 2], -1).reshape(-1)
    # float64 throughout: only rounding of sums of products separates the two (1e-9)
    np.testing.assert_allclose(interleaved_rope(theirs, positions),
                               half_split_rope(ours, positions)[..., order], rtol=0, atol=1e-9)


def test_without_the_reordering_the_rotations_differ():
    """The check above can fail: the unreordered rows under llama.cpp's rotation give
    other vectors (at any position but 0)."""
    x = np.random.default_rng(3).standard_normal((3, 2, 8))
    positions = np.array([1.0, 2.0, 5.0])
    assert np.abs(interleaved_rope(x, positions) - half_split_rope(x, positions)).max() > 0.1


def test_interleave_refuses_a_head_count_that_does_not_divide():
    with pytest.raises(ValueError, match="head count"):
        llm_gguf.interleave_rotary_rows(np.zeros((12, 4), np.float32), heads=5)


def test_vocabulary_is_one_string_per_id():
    tokens, kinds = llm_gguf.vocabulary(300)
    assert len(tokens) == len(set(tokens)) == len(kinds) == 300
    assert tokens[:3] == ["<unk>", "<s>", "</s>"] and kinds[:3] == [2, 3, 3]
    assert tokens[3 + 0x0A] == "<0x0A>" and kinds[3 + 0x0A] == 6
    assert tokens[299] == "t299" and kinds[299] == 1
    small, _ = llm_gguf.vocabulary(64)  # the tiny config: fewer ids than byte tokens
    assert len(small) == len(set(small)) == 64
