"""Schemes 8da8w / 8da4w (opforge/quantize/dynamic.py): dynamic int8 activations per block
of 32 along K, int8 / int4 (Q4_0) weights in the same blocks.

Checked against torch itself (the module's own ops, eager) and float64 arithmetic: the
weights' integers and scales, the activations' integers (round half to even, at .5 steps),
the exported program on the lean runtime and the native runtime (the same float32 chain,
matmul sums in another order: within 2·γ(K+1)·Σ|a·w| of each other), 4-bit packing.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

pytest.importorskip("torchao")

from opforge.export import export  # noqa: E402
from opforge.quantize.dynamic import (  # noqa: E402
    DynamicQuantLinear, QuantEmbedding, quantize_dynamic, quantize_weight,
)
from opforge.runtime import load  # noqa: E402

U = 2.0 ** -24


def test_weights_blocks_and_q4_0_scale():
    w = torch.randn(8, 64, generator=torch.Generator().manual_seed(0))
    for bits, (lo, hi) in ((8, (-127, 127)), (4, (-8, 7))):
        q, s = quantize_weight(w, bits, 32)
        assert q.dtype == torch.int8 and s.shape == (8, 2)
        assert int(q.min()) >= lo and int(q.max()) <= hi
        blocks = w.reshape(8, 2, 32)
        if bits == 4:  # the value of largest magnitude is -8 · scale, exactly
            idx = blocks.abs().argmax(-1)
            assert (q.reshape(8, 2, 32).gather(-1, idx[..., None]) == -8).all()
        # each weight rounds to its nearest step (clamped): within half a step (+ clamp)
        deq = q.reshape(8, 2, 32).double() * s.double()[..., None]
        err = (deq - blocks.double()).abs()
        assert (err <= s.double().abs()[..., None] * (0.5 + 1e-6) + (bits == 4) * s.double().abs()[..., None]).all()


def test_activation_integers_round_half_to_even():
    """x on .5 steps of a block with scale 1 (max |x| = 127) quantize half to even."""
    x = torch.zeros(1, 32)
    x[0, 0] = 127.0
    x[0, 1:6] = torch.tensor([2.5, -2.5, 3.5, 0.5, 126.5])
    # the chain DynamicQuantLinear.forward runs
    s = x.reshape(1, 1, 32).abs().amax(-1).clamp(min=2.0 ** -64) / 127
    assert float(s) == 1.0
    zero = torch.zeros_like(s, dtype=torch.int32)
    q = torch.ops.torchao.quantize_affine(x, [1, 32], s, zero, torch.int8, -127, 127)
    got = q[0, 1:6].tolist()
    assert got == [2, -2, 4, 0, 126]


@pytest.mark.parametrize("scheme", ["8da8w", "8da4w"])
def test_program_on_lean_and_native(scheme):
    from opforge.quantize.packing import pack_4bit_weights

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(50, 64), torch.nn.Linear(64, 40),
                                torch.nn.ReLU(), torch.nn.Linear(40, 17, bias=False))
    q = quantize_dynamic(model, scheme)
    assert isinstance(q[0], QuantEmbedding) and isinstance(q[1], DynamicQuantLinear)
    assert q[1].group == 32 and q[3].group == 40  # 32 does not divide 40: one block
    x = torch.randint(0, 50, (5,), generator=torch.Generator().manual_seed(1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = pack_4bit_weights(export(q, (x,)))
    with torch.no_grad():
        eager = q(x).double().numpy()
        # the last linear's terms, for the bound: |dequantized activation| · |weight|
        h = torch.relu(q[1](q[0](x)))
        terms = np.abs(h.double().numpy()) @ np.abs(q[3].weight().double().numpy()).T
    bound = 2 * (41 * U / (1 - 41 * U)) * terms + 1e-30
    for executor in ("lean", "native"):
        loaded = load(program) if executor == "lean" else load(program, executor="native")
        got = loaded.method("forward")(x.numpy())[0]
        # the same integers on both sides; a changed activation integer would move a
        # result by a step times a weight, far past the matmul's order-of-sums bound
        assert (np.abs(got - eager) <= bound).all(), (executor, float(np.abs(got - eager).max()))
    if scheme == "8da4w":
        from opforge.program import PACKING_INT4, ConstantStorage, TensorValue

        packed = [v for v in program.method("forward").values if isinstance(v, TensorValue)
                  and isinstance(v.storage, ConstantStorage) and v.storage.packing == PACKING_INT4]
        assert len(packed) == 3  # the table and both linears' weights


def test_unknown_scheme_refused():
    from opforge.quantize.schemes import QuantizeError

    with pytest.raises(QuantizeError, match="8da8w, 8da4w"):
        quantize_dynamic(torch.nn.Linear(4, 4), "8da2w")


def test_cli_8da4w_exports_the_swapped_model_and_refuses_pt2e_options(tmp_path, monkeypatch):
    """`opforge quantize --scheme 8da4w`: no calibration, the linears and the table swapped,
    4-bit weights packed, the program's logits those of quantize_dynamic's model (the same
    export), and the PT2E flow's options refused by name, writing nothing."""
    from click.testing import CliRunner

    from opforge.cli import cli
    from opforge.program import PACKING_INT4, ConstantStorage, TensorValue
    from opforge.program import load as load_file

    from tests.quantize.quantize_support import decoder_factory

    decoder_factory(tmp_path, monkeypatch, "da_decoder", seed=3)
    out = tmp_path / "da.opf"
    run = CliRunner().invoke(cli, ["quantize", "da_decoder:make", "--scheme", "8da4w",
                                   "-o", str(out), "--json"])
    assert run.exit_code == 0, run.output
    assert '"linears": 8' in run.output and '"embeddings": 1' in run.output  # q k v o gate up down head
    program = load_file(out)
    packed = [v for v in program.method("forward").values if isinstance(v, TensorValue)
              and isinstance(v.storage, ConstantStorage) and v.storage.packing == PACKING_INT4]
    assert len(packed) == 9
    from da_decoder import make

    model, (tokens, positions) = make()
    with torch.no_grad():
        want = quantize_dynamic(model, "8da4w")(tokens, positions)
    want = (want[0] if isinstance(want, tuple) else want).numpy()
    got = load(program).method("forward")(tokens.numpy(), positions.numpy())[0]
    # the same activation integers; the matmuls' sums in another order (see above)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))
    bad = tmp_path / "bad.opf"
    for option in (["--per-tensor"], ["--observer", "histogram"], ["--discard-op", "aten::mul"]):
        refused = CliRunner().invoke(cli, ["quantize", "da_decoder:make", "--scheme", "8da8w",
                                           "-o", str(bad), *option])
        assert refused.exit_code != 0 and "not used by --scheme 8da8w" in refused.output, option
        assert option[0] in refused.output and not bad.exists()
