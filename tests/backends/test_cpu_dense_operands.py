"""No oneDNN eltwise op on a gapped operand: oneDNN runs those in its reference loop.
And, checked by the name oneDNN gives each op's implementation: no op of the zoo, of the
models here or of the patterns of models written elsewhere (test_cpu_reference_cliffs.py:
CoaT's softmax over tokens, Swin's window-attention bias and mask) runs a reference kernel,
with the engine's own kernels or without them.

Measured on a ``TransformerEncoderLayer`` (d=256, 4 heads, sequence 128, one thread): the
scaling of one head of the fused QKV projection (a ``(1, 4, 128, 64)`` view with strides
``(98304, 64, 768, 1)``) took 1.6 ms per op in oneDNN's reference eltwise, against 4 µs
for a copy to dense plus 4 µs for the fast kernel. Each plan of the models below must give
every eltwise op dense operands (``_dense``: no gaps, no broadcasts), and each model must
still match eager float64.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from opforge.backends.cpu import blob
from opforge.backends.cpu import engine as cpu_engine
from opforge.backends.cpu.lowering.core import _dense
from opforge.examples.zoo import ZOO
from opforge.export import export
from opforge.runtime import load

from cpu_reference import check_against_float64, spread
from test_cpu_hostile_plans import capability  # noqa: F401 (a fixture: own kernels, then oneDNN's)
from test_cpu_reference_cliffs import pattern_models


class HeadScale(nn.Module):
    """One head of a fused projection, scaled by a scalar, squared and divided."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 48)

    def forward(self, x):
        q, k, v = self.proj(x).split(16, dim=-1)
        q = q.view(x.shape[0], 4, 4).transpose(0, 1) * 0.5
        k = k.view(x.shape[0], 4, 4).transpose(0, 1).pow(2)
        return q @ k.transpose(1, 2) + (v[:, ::2] / 4.0).sum()


def _models():
    encoder = nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64,
                                         batch_first=True, dropout=0.0)
    return {
        "transformer_layer": (encoder, (torch.randn(2, 12, 32),)),
        "head_scale": (HeadScale(), (torch.randn(6, 16),)),
    }


@pytest.mark.parametrize("name", ["transformer_layer", "head_scale"])
def test_eltwise_operands_are_dense_and_results_match(name, monkeypatch):
    model, inputs = _models()[name]
    model = spread(model.eval())
    plans = []
    encode = blob.encode
    monkeypatch.setattr(blob, "encode", lambda plan, *named: plans.append(plan) or encode(plan, *named))
    program = export(model, inputs, backends=["cpu"])
    eltwise = [(plan, op) for plan in plans for op in plan.ops if op["kind"] == "eltwise"]
    assert eltwise, "the model has scalar elementwise ops on the cpu backend"
    for plan, op in eltwise:
        for tid in op["in"] + op["out"]:
            spec = plan.tensors[tid]
            assert _dense(spec), (op["name"], spec.dims, spec.strides)
    got = load(program).method("forward")(*[t.numpy() for t in inputs])
    check_against_float64(model, inputs, got)


def _reference_kernel(impl: str) -> bool:
    """oneDNN's reference implementations: ``ref:any``, ``ref_int8:any`` and other plain C++
    loops, whose ISA is ``any`` (jit kernels name theirs: ``jit:avx512_core``, ``jit:uni``)."""
    name, _, isa = impl.partition(":")
    return name.startswith("ref") or isa == "any"


@pytest.mark.parametrize("name", [*ZOO, "transformer_layer_batch2", "head_scale", *pattern_models()])
def test_no_op_runs_a_onednn_reference_kernel(name, capability):
    if name in ZOO:
        model, inputs = ZOO[name]()
    elif name in pattern_models():
        model, inputs = pattern_models()[name]
    else:
        model, inputs = _models()[name.removesuffix("_batch2")]
    program = export(model.eval(), inputs, backends=["cpu"])
    assert program.delegates
    seen = [(op, impl) for op, impl in cpu_engine.program_impls(program) if impl]
    assert seen or capability == "native", "without its own kernels the engine runs oneDNN's"
    slow = [(op, impl) for op, impl in seen if _reference_kernel(impl)]
    assert not slow, slow
