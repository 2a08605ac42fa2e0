"""The generation runner's Python API (opforge.runtime.generate) on exported decoders:
greedy tokens equal eager's, sampling is seeded and stays in the top-k, the cache's capacity
and end tokens stop it, both calling conventions and chunked prefill work, and a program it
cannot drive is refused with a reason."""

from __future__ import annotations

import pytest
import torch

from generate_models import PROMPT, eager_logits, eager_tokens, program
from opforge.errors import GenerationError
from opforge.runtime import load
from opforge.runtime.generate import Generator, generate


@pytest.fixture(scope="module")
def generator():
    return Generator(load(program("flat")))


def test_greedy_tokens_equal_eager(generator):
    result = generator.generate(PROMPT, 32)
    assert list(result.tokens) == eager_tokens(tuple(PROMPT), 32)
    assert result.stop_reason == "length" and result.decode_steps == 31
    assert result.prefill_tokens_per_s > 0 and result.decode_tokens_per_s > 0
    assert generator.generate(PROMPT, 32).tokens == result.tokens  # a fresh cache each time


def test_describes_the_bundled_decoder(generator):
    sig = generator.signature
    assert (sig.layout, sig.vocab, sig.capacity) == ("flat", 64, 48)
    assert sig.prefill is sig.decode and sig.prefill.name == "forward"
    assert len(sig.caches) == 4 and sig.cache_bytes == 4 * 48 * 2 * 8 * 4
    assert "dim 0" in sig.capacity_source


def test_sampling_is_seeded_and_top_1_is_greedy(generator):
    first = generator.generate(PROMPT, 20, temperature=1.0, seed=3)
    again = generator.generate(PROMPT, 20, temperature=1.0, seed=3)
    assert first.tokens == again.tokens
    other = generator.generate(PROMPT, 20, temperature=1.0, seed=4)
    assert other.tokens != first.tokens  # 20 draws from 64 tokens: equal only by accident
    greedy = generator.generate(PROMPT, 20).tokens
    assert generator.generate(PROMPT, 20, temperature=2.0, top_k=1, seed=9).tokens == greedy


def test_sampled_tokens_come_from_the_top_k(generator):
    k = 3
    for seed in range(3):
        tokens = list(generator.generate(PROMPT, 16, temperature=5.0, top_k=k,
                                         seed=seed).tokens)
        for token, logits in zip(tokens, eager_logits(PROMPT, tokens)):
            assert token in set(torch.topk(logits, k).indices.tolist())


def test_capacity_stops_with_what_fits(generator):
    result = generator.generate(PROMPT, 100)
    assert result.stop_reason == "capacity" and len(result.tokens) == 48 - len(PROMPT) + 1
    assert list(result.tokens) == eager_tokens(tuple(PROMPT), 45)
    assert "48 positions" in result.message and "fewer than the 100 asked for" in result.message
    with pytest.raises(GenerationError, match=r"prompt — 49 tokens .* at most the cache's "
                                              r"capacity, 48 positions"):
        generator.generate([1] * 49, 1)


def test_an_end_token_stops_generation(generator):
    expected = eager_tokens(tuple(PROMPT), 32)
    eos = expected[5]
    result = generator.generate(PROMPT, 32, eos_ids=[eos])
    assert list(result.tokens) == expected[:expected.index(eos) + 1]
    assert result.stop_reason == "eos" and f"end token {eos}" in result.message


@pytest.mark.parametrize("prompt", [[], [64], [-1], [1, 2.5], ["a"]])
def test_bad_prompts_are_refused(generator, prompt):
    with pytest.raises(GenerationError, match="prompt"):
        generator.generate(prompt, 4)


def test_text_without_a_tokenizer_is_refused(generator):
    with pytest.raises(GenerationError, match="prompt — found text .* tokenizer="):
        generator.generate("hello", 4)


def test_bad_options_are_refused(generator):
    with pytest.raises(GenerationError, match="temperature"):
        generator.generate(PROMPT, 4, temperature=-1.0)
    with pytest.raises(GenerationError, match="top_k"):
        generator.generate(PROMPT, 4, temperature=1.0, top_k=0)
    with pytest.raises(GenerationError, match=r"eos_ids — found \[99\]"):
        generator.generate(PROMPT, 4, eos_ids=[99])


@pytest.mark.parametrize("kind", ["batched", "positions_first"])
def test_transformers_convention(kind):
    generator = Generator(load(program(kind)))
    assert generator.signature.layout == "batched" and generator.capacity == 48
    assert list(generator.generate(PROMPT, 24).tokens) == eager_tokens(tuple(PROMPT), 24)
    with pytest.raises(GenerationError, match="layout 'flat'"):
        Generator(load(program(kind)), layout="flat")


def test_a_prompt_longer_than_a_call_is_prefilled_in_chunks():
    prompt = [(7 * i + 3) % 64 for i in range(21)]  # 8 + 8 + 5 tokens
    result = generate(program("short_calls"), prompt, 12)
    assert list(result.tokens) == eager_tokens(tuple(prompt), 12)


def test_separate_prefill_and_decode_methods():
    from opforge.examples.decoder import TinyDecoder
    from opforge.export import export

    model = TinyDecoder().eval()
    seq = torch.export.Dim("seq", min=2, max=model.max_len)
    exported = export(None, methods={
        "prefill": (model, (torch.tensor(PROMPT), torch.arange(len(PROMPT))),
                    ({0: seq}, {0: seq})),
        "decode": (model, (torch.tensor([0]), torch.tensor([0]))),
    }, kernels="portable")
    generator = Generator(load(exported))
    assert (generator.signature.prefill.name, generator.signature.decode.name) == (
        "prefill", "decode")
    assert list(generator.generate(PROMPT, 20).tokens) == eager_tokens(tuple(PROMPT), 20)
    # one prompt token: under prefill's minimum of 2, so it goes through decode
    assert list(generator.generate([5], 6).tokens) == eager_tokens((5,), 6)
    with pytest.raises(GenerationError, match="takes 2..48 tokens per call"):
        Generator(load(exported), method="prefill")


def test_a_program_without_state_is_refused():
    with pytest.raises(GenerationError, match="has no state .* fix: register the caches"):
        Generator(load(program("stateless")))


def test_a_program_without_a_decoder_method_is_refused():
    from opforge.export import export

    linear = export(torch.nn.Linear(4, 2), (torch.randn(1, 4),), kernels="portable")
    with pytest.raises(GenerationError, match=r"inputs — found \(float32\[1, 4\]\)"):
        Generator(load(linear))
    with pytest.raises(GenerationError, match="method 'decode' — not in the program"):
        Generator(load(program("flat")), method="decode")
