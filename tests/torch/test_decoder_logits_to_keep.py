"""TinyDecoder(logits_to_keep=1): the prompt's call returns the last row's logits only
(transformers' name; llama.cpp's prompt processing computes that row only). Eager gives
the full model's last row; a program exported with it (a dynamic prefill and a one-token
decode, lean kernels and the cpu backend) generates the full model's greedy tokens."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from opforge.examples.decoder import TinyDecoder, greedy_decode
from opforge.export import export
from opforge.program import from_bytes, to_bytes
from opforge.runtime import load
from opforge.runtime.generate import Generator

PROMPT = [5, 9, 1, 3, 7, 2]
NEW = 12
# Float32 logits of the same model through another summation order (one row's matmul
# instead of six rows', oneDNN instead of torch): ~1e-7 apart at |logits| up to ~10; 1e-4
# relative is ~1000 ulp. Rows of this random model differ by O(1) (checked below), so a
# wrong row cannot pass.
TOLERANCE = dict(rtol=1e-4, atol=1e-5)


def _full_logits() -> torch.Tensor:
    with torch.no_grad():
        return TinyDecoder().eval()(torch.tensor(PROMPT), torch.arange(len(PROMPT)))


def _expected_tokens() -> list[int]:
    model = TinyDecoder().eval()
    with torch.no_grad():
        return greedy_decode(lambda t, p: model(t, p), PROMPT, NEW)


def export_last_row(backends=None):
    """TinyDecoder(logits_to_keep=1) as a dynamic prefill and a one-token decode method."""
    model = TinyDecoder(logits_to_keep=1).eval()
    seq = torch.export.Dim("seq", min=1, max=model.max_len)
    program = export(None, methods={
        "prefill": (model, (torch.tensor(PROMPT[:3]), torch.arange(3)), ({0: seq}, {0: seq})),
        "decode": (model, (torch.tensor([0]), torch.tensor([0])))},
        kernels="portable", backends=backends)
    return from_bytes(to_bytes(program))


@pytest.mark.parametrize("keep", [1, 2, 100])
def test_eager_keeps_the_last_rows(keep):
    full = _full_logits()
    assert (full[-1] - full[0]).abs().max() > 1.0  # rows differ: a wrong row would show
    with torch.no_grad():
        got = TinyDecoder(logits_to_keep=keep).eval()(torch.tensor(PROMPT),
                                                       torch.arange(len(PROMPT)))
    assert got.shape == (min(keep, len(PROMPT)), full.shape[1])
    torch.testing.assert_close(got, full[-min(keep, len(PROMPT)):], **TOLERANCE)


@pytest.mark.parametrize("keep", [-1, 1.0, True])
def test_a_bad_count_is_refused(keep):
    with pytest.raises(ValueError, match="logits_to_keep"):
        TinyDecoder(logits_to_keep=keep)


@pytest.mark.parametrize("backends", [None, ["cpu"]], ids=["lean", "cpu"])
def test_a_last_row_program_generates_the_full_models_tokens(backends):
    program = export_last_row(backends)
    loaded = load(program)
    (logits,) = loaded.method("prefill")(np.array(PROMPT), np.arange(len(PROMPT)))
    assert logits.shape == (1, 64)
    np.testing.assert_allclose(logits[0], _full_logits()[-1].numpy(), **TOLERANCE)
    loaded.reset_state()
    assert list(Generator(loaded).generate(PROMPT, NEW).tokens) == _expected_tokens()
