"""The bundled decoder (RMSNorm, rotary, grouped-query attention, KV cache as state):
prefill a prompt in one call and greedy-decode 32 tokens, exactly eager's tokens."""

from __future__ import annotations

import pytest
import torch

from opforge.examples.decoder import TinyDecoder, export_decoder, greedy_decode
from opforge.export import export
from opforge.program import from_bytes, to_bytes
from opforge.runtime import load

PROMPT = [5, 9, 1, 3]


@pytest.fixture(scope="module")
def expected():
    model = TinyDecoder().eval()
    with torch.no_grad():
        return greedy_decode(lambda t, p: model(t, p), PROMPT, 32)


@pytest.fixture(scope="module")
def program():
    return from_bytes(to_bytes(export_decoder(TinyDecoder().eval(), kernels="portable")))


@pytest.mark.parametrize("mode", ["lean", "aten"])
def test_prefill_and_greedy_decode_match_eager(program, expected, mode):
    loaded = load(program, mode=mode)
    forward = loaded.method("forward")
    step = lambda t, p: forward(t.numpy(), p.numpy())[0]  # noqa: E731
    assert greedy_decode(step, PROMPT, 32) == expected
    assert len(forward._shapes) == 2  # the prompt's shape and one token's
    loaded.reset_state()  # a fresh cache: the same tokens again
    assert greedy_decode(step, PROMPT, 32) == expected


def test_prefill_and_decode_methods_share_one_cache(expected):
    model = TinyDecoder().eval()
    seq = torch.export.Dim("seq", min=1, max=model.max_len)
    program = export(None, methods={
        "prefill": (model, (torch.tensor(PROMPT), torch.arange(len(PROMPT))),
                    ({0: seq}, {0: seq})),
        "decode": (model, (torch.tensor([0]), torch.tensor([0]))),
    }, kernels="portable")
    assert {s.name for s in program.method("prefill").state} == {
        s.name for s in program.method("decode").state}
    loaded = load(from_bytes(to_bytes(program)))
    prefill, decode = loaded.method("prefill"), loaded.method("decode")
    assert not decode._dynamic

    def step(tokens, positions):
        method = prefill if len(tokens) > 1 else decode
        return method(tokens.numpy(), positions.numpy())[0]

    assert greedy_decode(step, PROMPT, 32) == expected
