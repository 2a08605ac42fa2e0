"""Quantized decoders keep their accuracy on prompts the calibration did not see.

The bundled ``TinyDecoder`` (RMSNorm, rotary embeddings, grouped-query attention with a
KV cache, SwiGLU), random weights from its own seed, quantized as docs/quantization.md
exports decoders (a dynamic sequence), calibrated on two prompts, measured on four other
prompts against the float32 model: the logits' SQNR (``sqnr_db``) and, as the bound the
weights set, the same with the activations left in float (``weights_only``).

Floors and why:

* **16a16w >= 50 dB** (issue 46): 16-bit weights and activations round at ~90 dB per
  tensor; this random model amplifies an error ~12 dB through one layer and ~24 dB
  through eight (its weights-only SQNR, 16-bit weights alone: 75.6 and 63.9 dB), and the ~40
  activations per layer add up: 62.3 dB at 1 layer, 50.6 at 8 (issue config), 62.8 on the
  small config. Before the fix, held-out values went past the calibrated ranges and clipped:
  37.7 and 23.7 dB (issue config), 22.8 dB on the small one, so this floor fails there.
* **16-bit activations cost <= 1 dB beyond the weights** (16a8w, 16a4w, 16a4w_block):
  their activation noise sits ~30 dB under 8-bit weights' and ~55 dB under 4-bit
  weights', so the scheme must land on its weights-only SQNR (measured within 0.01 dB);
  1 dB is about what one clipped tensor costs at 8-bit weights.
* **16a8w >= 30 dB** (issue 46) holds on the small config: 30.3 dB, all of it the
  weights' (per-channel 8-bit weights round at ~42 dB; the model amplifies ~12 dB).
* **4-bit schemes >= 6 dB, not the issue's 12**: per-channel 4-bit weights round at ~17
  dB (Gaussian weights, scale max|w|/7: a step of ~0.4 sigma), per block of 128 at ~19,
  and the ~10 dB this model amplifies leaves 7.1 (16a4w) and 8.0 dB (16a4w_block) with
  exact float activations. No activation treatment beats its weights: at the issue's
  config the weights alone give 5.0-6.1 dB at 1 layer and ~0 at 8, and 8-bit weights
  27.8 and 18 dB, under the issue's 30. The tests hold the weights-only bound there
  (docs/quantization.md, "Decoders", has the table).
* **8a8w >= 15 dB**: 8-bit per-tensor activations round at 59 + 20 log10(sigma / range) dB;
  the RMSNorm outputs, whose per-channel weights make a few channels set the range
  (range/sigma ~ 37), round at ~28 dB, and the amplification leaves 17.9 dB (weights
  alone: 30.3). 8a4w: its 4-bit weights dominate (within 1 dB of their bound).

Without the fix (observed ranges used as they are, ``act_headroom=1``) 16a16w gives 22.8 dB
on the small config: ``test_headroom_is_what_keeps_held_out_values_in_range``.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

from opforge.examples.decoder import TinyDecoder, greedy_decode
from opforge.quantize import QuantConfig, quantize, sqnr_db
from opforge.quantize.weights_only import weights_only

SMALL = dict(vocab=64, dim=128, heads=8, kv_heads=4, hidden=384, layers=2, max_len=128, seed=0)
ISSUE = dict(vocab=64, dim=512, heads=8, kv_heads=4, hidden=1536, max_len=256, seed=0)


def _prompts(lengths, seed):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randint(0, 64, (n,), generator=g), torch.arange(n)) for n in lengths]


def _measure(config: dict, scheme, calibration_lengths, held_out_lengths) -> dict:
    model = TinyDecoder(**config).eval()
    calibration = _prompts(calibration_lengths, seed=1)
    held_out = _prompts(held_out_lengths, seed=2)  # other tokens than the calibration's
    seq = torch.export.Dim("seq", min=1, max=model.max_len)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = quantize(model, calibration[0], scheme, calibration=calibration,
                          dynamic_shapes=({0: seq}, {0: seq}))
    bound = weights_only(result.model)
    with torch.no_grad():
        reference = [model(*p) for p in held_out]
        quantized = [result.model(*p) for p in held_out]
        weights = [bound(*p) for p in held_out]
    return {"sqnr": sqnr_db(reference, quantized), "weights_only": sqnr_db(reference, weights),
            "model": model, "result": result, "held_out": held_out}


_CACHE: dict = {}


def small(scheme: str) -> dict:
    if scheme not in _CACHE:
        _CACHE[scheme] = _measure(SMALL, scheme, [32, 64], [32] * 4)
    return _CACHE[scheme]


def test_16a16w_decoder_is_near_lossless_on_held_out_prompts():
    m = small("16a16w")
    assert m["sqnr"] >= 50.0, m["sqnr"]


@pytest.mark.parametrize("scheme", ["16a8w", "16a4w_block"])
def test_16_bit_activations_cost_at_most_1_db_beyond_the_weights(scheme):
    m = small(scheme)
    assert m["sqnr"] >= m["weights_only"] - 1.0, (m["sqnr"], m["weights_only"])


@pytest.mark.parametrize("scheme,floor", [("16a8w", 30.0), ("16a4w_block", 6.0), ("8a8w", 15.0)])
def test_floors_on_the_small_decoder(scheme, floor):
    m = small(scheme)
    assert m["sqnr"] >= floor, (scheme, m["sqnr"], m["weights_only"])


@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["16a4w", "8a4w"])
def test_the_other_4_bit_schemes_on_the_small_decoder(scheme):
    m = small(scheme)
    assert m["sqnr"] >= 6.0, (scheme, m["sqnr"], m["weights_only"])
    assert m["sqnr"] >= m["weights_only"] - 1.0, (m["sqnr"], m["weights_only"])


def test_16a16w_greedy_tokens_are_float32_s():
    # at >= 50 dB the logits move by ~0.3% of their spread: only a near tie could flip an
    # argmax, and these prompts have none (checked: every token equal)
    m = small("16a16w")
    model, converted = m["model"], m["result"].model
    for tokens, _ in m["held_out"][:2]:
        step = copy.deepcopy(converted)  # its caches are state
        with torch.no_grad():
            want = greedy_decode(lambda t, p: model(t, p), tokens.tolist(), 8)
            got = greedy_decode(lambda t, p: step(t, p), tokens.tolist(), 8)
        assert got == want


def test_headroom_is_what_keeps_held_out_values_in_range():
    # the same quantization with the observed ranges as they are (the old behaviour):
    # held-out values clip and the SQNR falls far under the floor; this is the test that
    # says the floor above measures the fix, not luck
    old = _measure(SMALL, QuantConfig("16a16w", act_headroom=1.0), [32, 64], [32] * 4)
    assert old["sqnr"] < 50.0 <= small("16a16w")["sqnr"], old["sqnr"]


def test_a_cache_write_shares_the_written_values_qparams():
    decisions = small("16a16w")["result"].report.decisions
    writes = [d for d in decisions if d.op == "aten::index_copy_"]
    assert writes and all("shares the written values' qparams" in d.detail for d in writes)


def test_act_headroom_below_one_is_refused():
    from opforge.quantize import QuantizeError

    with pytest.raises(QuantizeError, match="act_headroom"):
        QuantConfig("16a16w", act_headroom=0.5)


@pytest.mark.slow
@pytest.mark.parametrize("layers", [1, 8])
def test_issue_config_16a16w_and_the_weights_bound(layers):
    """Issue 46's config, calibrated on 64- and 128-token prompts, 4 held-out 64-token
    prompts (1 layer ~10 s per scheme, 8 layers ~30 s)."""
    config = dict(ISSUE, layers=layers)
    m = _measure(config, "16a16w", [64, 128], [64] * 4)
    assert m["sqnr"] >= 50.0, m["sqnr"]
    for scheme in ("16a8w", "16a4w_block"):
        m = _measure(config, scheme, [64, 128], [64] * 4)
        assert m["sqnr"] >= m["weights_only"] - 1.0, (scheme, m["sqnr"], m["weights_only"])


def test_compare_names_the_nodes_whose_values_were_clipped():
    # the old behaviour (ranges as observed) on a one-layer decoder: a held-out prompt goes
    # past the calibrated ranges; compare's quantized run says where, and by how much
    from opforge.compare import compare
    from opforge.compare.report import clipping_line

    model = TinyDecoder(**dict(SMALL, dim=64, hidden=192, layers=1, max_len=32)).eval()
    calibration, prompt = _prompts([32, 32], seed=1), _prompts([32], seed=2)[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = compare(model, prompt, against=["quantized"], calibration=calibration,
                         scheme=QuantConfig("16a16w", act_headroom=1.0), min_sqnr=50)
    run = result.runs[0]
    assert run.clipped, "a held-out prompt past the observed ranges is reported"
    key, (count, size, ratio) = next(iter(run.clipped.items()))
    assert 0 < count <= size and ratio > 1.0
    assert "values clipped" in run.integers[key]
    line = clipping_line(result, run)
    row = next(r for r in result.rows if (r.name, r.item) == key)
    assert f"`{row.label}`" in line or len(run.clipped) > 5
    cells = [c for n in result.as_dict()["nodes"] for c in n["runs"].values() if c and "clipped" in c]
    assert len(cells) == len(run.clipped)


def test_compare_cli_calibrates_on_a_list_and_reports_clipping(tmp_path, monkeypatch):
    # 8a8w keeps the observed ranges (no headroom at 8 bits): a prompt other than the
    # calibration's goes past some of them, and `opforge compare` says where
    import numpy as np
    from click.testing import CliRunner

    from opforge.cli.compare_cmd import compare as compare_cli

    (tmp_path / "dec.py").write_text(
        "import torch\nfrom opforge.examples.decoder import TinyDecoder\n"
        "def make():\n    return TinyDecoder(vocab=64, dim=64, heads=8, kv_heads=4, hidden=192, "
        "layers=1, max_len=32, seed=0).eval(), (torch.arange(32) % 64, torch.arange(32))\n")
    rng = np.random.default_rng(1)
    for name in ("t0", "t1", "test"):
        np.save(tmp_path / f"{name}.npy", rng.integers(0, 64, 32).astype(np.int64))
    np.save(tmp_path / "pos.npy", np.arange(32, dtype=np.int64))
    (tmp_path / "cal.txt").write_text("t0.npy pos.npy\nt1.npy pos.npy\n")
    monkeypatch.chdir(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = CliRunner().invoke(compare_cli, [
            "dec.py:make", "--inputs", "test.npy,pos.npy", "--against", "quantized",
            "--scheme", "8a8w", "--calibration", "cal.txt", "--rows", "diverged"])
    assert "values past the calibrated range (clipped)" in out.output, out.output
