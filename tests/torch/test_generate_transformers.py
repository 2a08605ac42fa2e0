"""A transformers decoder with a static cache, exported by transformers' own exporter and then
by opforge, generates on the lean runtime exactly the tokens transformers' `generate` gives:
the batched calling convention (input_ids[1, seq], cache_position[seq]), the capacity read
from the cache's second-to-last dimension, a prompt longer than a call prefilled in chunks.

Needs transformers (not one of opforge's dependencies): skipped without it.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip(
    "transformers", reason="transformers is not installed (the check runs where it is)")

from opforge.export import export  # noqa: E402
from opforge.runtime import load  # noqa: E402
from opforge.runtime.generate import Generator  # noqa: E402

CACHE, MAX_SEQ = 64, 32


@pytest.fixture(scope="module")
def llama():
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM
    from transformers.integrations.executorch import TorchExportableModuleForDecoderOnlyLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=128)
    model = LlamaForCausalLM(config).eval()
    model.generation_config = GenerationConfig(
        use_cache=True, cache_implementation="static", max_length=CACHE,
        cache_config={"batch_size": 1, "max_cache_len": CACHE})
    seq = torch.export.Dim("seq", min=1, max=MAX_SEQ)
    exported = TorchExportableModuleForDecoderOnlyLM(
        model, batch_size=1, max_cache_len=CACHE).export(
        input_ids=torch.tensor([[1, 2, 3]]), cache_position=torch.arange(3),
        dynamic_shapes={"input_ids": {1: seq}, "cache_position": {0: seq}})
    return model, load(export(exported, kernels="portable"))


def _reference(model, prompt, n):
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n,
                             do_sample=False)
    return out[0, len(prompt):].tolist()


def test_transformers_static_cache_decoder(llama):
    model, loaded = llama
    generator = Generator(loaded)
    sig = generator.signature
    assert (sig.layout, sig.vocab, sig.capacity) == ("batched", 128, CACHE)
    assert sig.capacity_source == "state 'key_cache_0' dim 2"
    assert loaded.program.metadata["opforge.input_names.forward"] == "input_ids,cache_position"
    prompt = [5, 9, 1, 3, 7, 11]
    assert list(generator.generate(prompt, 20).tokens) == _reference(model, prompt, 20)
    long_prompt = list(range(1, 41))  # 32 + 8 tokens
    assert list(generator.generate(long_prompt, 6).tokens) == _reference(model, long_prompt, 6)
    full = generator.generate(prompt, 100)
    assert full.stop_reason == "capacity" and len(full.tokens) == CACHE - len(prompt) + 1
