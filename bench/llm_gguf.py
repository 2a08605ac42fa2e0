"""The benchmark's decoder as a llama.cpp model: ``TinyDecoder`` weights written as an F32
GGUF file of llama.cpp's ``llama`` architecture whose forward pass is the decoder's.

    python bench/llm_gguf.py base bench/work/llamacpp/base-f32.gguf

What maps onto what (opforge/examples/decoder.py ↔ llama.cpp's LLAMA graph):

- RMSNorm ``x * rsqrt(mean(x²) + 1e-6) * w`` ↔ ``layer_norm_rms_epsilon`` 1e-6;
- rotary with base 10000 over the whole head ↔ ``rope.freq_base`` 10000,
  ``rope.dimension_count`` = head_dim. The decoder rotates the *half-split* pairs
  ``(x[i], x[i + d/2])`` (``_rotate``: ``cat(-x2, x1)``); llama.cpp's LLAMA architecture uses
  the *interleaved* pairs ``(x[2i], x[2i + 1])`` (rope type NORM). So the rows of the q and
  k projections are reordered within each head, row ``2i`` ← ``i`` and row ``2i + 1`` ←
  ``i + d/2`` (what llama.cpp's own HF converter does for Llama checkpoints): llama.cpp's
  rotation of the reordered q and k is the decoder's rotation, reordered the same way,
  and ``q·k`` does not see a permutation applied to both; v and the output projection are
  untouched, so the attention output is unchanged;
- grouped-query attention, scale 1/sqrt(head_dim), causal ↔ ``head_count`` /
  ``head_count_kv`` (the decoder's ``repeat_interleave``: query head h reads KV head
  ``h // group``, as llama.cpp's broadcast does);
- SwiGLU ``down(silu(gate(h)) * up(h))`` ↔ ``ffn_gate``, ``ffn_up``, ``ffn_down``;
- separate embedding and output projection (the decoder does not tie them) ↔
  ``token_embd`` and ``output``.

The vocabulary is a placeholder that lets token ids pass through unchanged: ``<unk>``,
``<s>``, ``</s>``, byte tokens ``<0x00>``…, then ``t<id>``; nothing is ever tokenized from
text (llama-bench draws random ids; the tokens check feeds ids).
"""

from __future__ import annotations

import pathlib
import sys

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

__all__ = ["gguf_tensors", "interleave_rotary_rows", "vocabulary", "write_gguf"]

RMS_EPS = 1e-6  # opforge.examples.decoder.RMSNorm's default
ROPE_BASE = 10000.0  # TinyDecoder's rotary tables


def interleave_rotary_rows(weight: np.ndarray, heads: int) -> np.ndarray:
    """Rows of a q or k projection ``[heads * d, in]`` reordered within each head from the
    half-split rotary layout to the interleaved one: row ``2i`` ← ``i``, ``2i + 1`` ← ``i + d/2``."""
    rows, cols = weight.shape
    d = rows // heads
    if d * heads != rows or d % 2:
        raise ValueError(f"interleave_rotary_rows: weight of {rows} rows — found {heads} heads "
                         f"— valid: rows a multiple of 2 × heads — fix: pass the projection's "
                         "head count")
    return np.ascontiguousarray(weight.reshape(heads, 2, d // 2, cols).swapaxes(1, 2)
                                .reshape(rows, cols))


def gguf_tensors(state: dict, config: dict) -> list[tuple[str, np.ndarray]]:
    """``(GGUF name, float32 array)`` for every weight of a TinyDecoder ``state_dict``
    (tensors or arrays), in llama.cpp's names; arrays in PyTorch's ``[out, in]`` layout,
    which GGUF stores as ``ne = [in, out]``."""
    def get(name):
        value = state[name]
        value = value.detach().cpu().numpy() if hasattr(value, "detach") else np.asarray(value)
        return np.ascontiguousarray(value, dtype=np.float32)

    out = [("token_embd.weight", get("embed.weight"))]
    for i in range(config["layers"]):
        p, b = f"blocks.{i}.", f"blk.{i}."
        out += [(b + "attn_norm.weight", get(p + "norm1.weight")),
                (b + "attn_q.weight", interleave_rotary_rows(get(p + "attn.q.weight"),
                                                             config["heads"])),
                (b + "attn_k.weight", interleave_rotary_rows(get(p + "attn.k.weight"),
                                                             config["kv_heads"])),
                (b + "attn_v.weight", get(p + "attn.v.weight")),
                (b + "attn_output.weight", get(p + "attn.o.weight")),
                (b + "ffn_norm.weight", get(p + "norm2.weight")),
                (b + "ffn_gate.weight", get(p + "gate.weight")),
                (b + "ffn_up.weight", get(p + "up.weight")),
                (b + "ffn_down.weight", get(p + "down.weight"))]
    out += [("output_norm.weight", get("norm.weight")), ("output.weight", get("head.weight"))]
    return out


def vocabulary(size: int) -> tuple[list[str], list[int]]:
    """Token strings and llama.cpp token types (1 normal, 2 unknown, 3 control, 6 byte) for
    ``size`` ids that mean nothing but themselves."""
    special = [("<unk>", 2), ("<s>", 3), ("</s>", 3)]
    byte = [(f"<0x{b:02X}>", 6) for b in range(256)]
    pairs = (special + byte)[:size]
    pairs += [(f"t{i}", 1) for i in range(len(pairs), size)]
    return [t for t, _ in pairs], [k for _, k in pairs]


def write_gguf(model, config: dict, path: pathlib.Path, name: str = "opforge TinyDecoder") -> int:
    """Write ``model`` (a TinyDecoder built from ``config``) as an F32 llama GGUF; returns the
    file's bytes."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    head_dim = config["dim"] // config["heads"]
    writer.add_name(name)
    writer.add_context_length(config["max_len"])
    writer.add_embedding_length(config["dim"])
    writer.add_block_count(config["layers"])
    writer.add_feed_forward_length(config["hidden"])
    writer.add_head_count(config["heads"])
    writer.add_head_count_kv(config["kv_heads"])
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(ROPE_BASE)
    writer.add_layer_norm_rms_eps(RMS_EPS)
    writer.add_vocab_size(config["vocab"])
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    tokens, types = vocabulary(config["vocab"])
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * len(tokens))
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(False)
    for tensor_name, array in gguf_tensors(model.state_dict(), config):
        writer.add_tensor(tensor_name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path.stat().st_size


def main(argv=None) -> int:
    import argparse

    from llm_models import CONFIGS, build

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", choices=list(CONFIGS))
    parser.add_argument("path", type=pathlib.Path)
    args = parser.parse_args(argv)
    size = write_gguf(build(args.config), CONFIGS[args.config], args.path)
    print(f"{args.path}: {size / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
