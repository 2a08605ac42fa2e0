"""Bounded dynamic shapes end to end: export → file → lean and ATen runtimes vs eager,
over size classes 1, primes, the maximum, and one past it (refused)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.export import Dim

from opforge.errors import ExportError, ProgramError
from opforge.export import export
from opforge.program import from_bytes, to_bytes
from opforge.runtime import load

MAX = 16
SIZES = (1, 2, 3, 5, 7, 13, MAX)


def _roundtrip(program):
    return from_bytes(to_bytes(program))


def _check(program, module, make_inputs, sizes, past_max, rtol=1e-4):
    for mode in ("lean", "aten"):
        method = load(program, mode=mode).method("forward")
        for n in (*sizes, sizes[1]):  # the repeat hits the binding cache
            inputs = make_inputs(n)
            with torch.no_grad():
                expected = module(*inputs)
            (got,) = method(*(t.numpy() for t in inputs))
            assert got.shape == tuple(expected.shape)
            np.testing.assert_allclose(got, expected.numpy(), rtol=rtol, atol=rtol)
        with pytest.raises(ProgramError, match=r"dimension \d+ — found size") as info:
            method(*(t.numpy() for t in make_inputs(past_max)))
        assert "re-export with a larger max" in str(info.value)


def test_dynamic_batch_mlp():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.ReLU(), torch.nn.Linear(12, 3))
    batch = Dim("batch", min=1, max=MAX)
    program = _roundtrip(export(model, (torch.randn(4, 6),), dynamic_shapes=({0: batch},),
                                kernels="portable"))
    forward = program.method("forward")
    assert [(s.name, s.min, s.max) for s in forward.symbols] == [("batch", 1, MAX)]
    assert forward.values[forward.inputs[0]].sizes == (MAX, 6)  # planned at the upper bound
    _check(program, model, lambda n: (torch.randn(n, 6),), SIZES, MAX + 1)


def test_dynamic_batch_cnn():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
        torch.nn.MaxPool2d(2), torch.nn.Flatten(), torch.nn.Linear(4 * 4 * 4, 5)).eval()
    batch = Dim("batch", min=1, max=8)
    program = _roundtrip(export(model, (torch.randn(2, 3, 8, 8),),
                                dynamic_shapes=({0: batch},), kernels="portable"))
    _check(program, model, lambda n: (torch.randn(n, 3, 8, 8),), (1, 2, 3, 5, 7, 8), 9)


class _Encoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)

    def forward(self, x, mask):
        return self.layer(x, src_key_padding_mask=mask)


def test_dynamic_sequence_transformer_encoder_with_padding_mask():
    torch.manual_seed(0)
    model = _Encoder().eval()
    seq = Dim("seq", min=2, max=MAX)
    example = (torch.randn(2, 5, 16), torch.zeros(2, 5, dtype=torch.bool))
    program = _roundtrip(export(model, example, dynamic_shapes=({1: seq}, {1: seq}),
                                kernels="portable"))

    def inputs(n):
        mask = torch.zeros(2, n, dtype=torch.bool)
        mask[0, max(1, n - 2):] = True  # the first sequence is padded
        return torch.randn(2, n, 16), mask

    _check(program, model, inputs, (2, 3, 5, 7, 13, MAX), MAX + 1)


class _Derived(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x, y, z):
        both = torch.cat([x, x], 0) + y
        return self.linear(both).reshape(-1, 4, 2).sum(1) + z[1:].repeat(2, 1)


def test_derived_and_shared_dims():
    torch.manual_seed(0)
    model = _Derived()
    s = Dim("s", min=1, max=MAX)
    example = (torch.randn(3, 8), torch.randn(6, 8), torch.randn(4, 2))
    program = _roundtrip(export(model, example, dynamic_shapes=({0: s}, {0: 2 * s}, {0: s + 1}),
                                kernels="portable"))
    _check(program, model, lambda n: (torch.randn(n, 8), torch.randn(2 * n, 8),
                                      torch.randn(n + 1, 2)), SIZES, MAX + 1)
    method = load(program).method("forward")
    with pytest.raises(ProgramError, match=r"input 1 dimension 0 — found size 5 — valid: \(2 \* s\) = 6"):
        method(np.zeros((3, 8), np.float32), np.zeros((5, 8), np.float32),
               np.zeros((4, 2), np.float32))


def test_unbounded_dim_is_refused_naming_input_and_dimension():
    model = torch.nn.Linear(4, 2)
    with pytest.raises(ExportError, match=r"input 'input' dimension 0 — has no upper bound"):
        export(model, (torch.randn(3, 4),), dynamic_shapes=({0: Dim("batch")},))


def test_cpu_backend_takes_symbolic_nodes():
    """The cpu backend lowers dynamic methods (tests/backends/test_cpu_dynamic.py covers it)."""
    from opforge.export import delegation_report

    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU())
    program = export(model, (torch.randn(3, 4),), backends=["cpu"], kernels="portable",
                     dynamic_shapes=({0: Dim("batch", min=1, max=8)},))
    report = delegation_report(program)["forward"]
    assert report["rejected"] == [] and len(report["delegates"]) == 1
    x = torch.randn(7, 4)
    np.testing.assert_allclose(load(program).method("forward")(x.numpy())[0],
                               model(x).detach().numpy(), rtol=1e-5, atol=1e-6)


def test_export_accepts_an_exported_program():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU())
    exported = torch.export.export(model, (torch.randn(3, 4),),
                                   dynamic_shapes=({0: Dim("batch", min=1, max=8)},))
    program = export(exported, kernels="portable")
    forward = load(program).method("forward")
    x = torch.randn(5, 4)
    np.testing.assert_allclose(forward(x.numpy())[0], model(x).detach().numpy(), rtol=1e-5)


def test_static_programs_stay_version_1_and_static():
    program = export(torch.nn.Linear(4, 2), (torch.randn(3, 4),))
    data = to_bytes(program)
    assert int.from_bytes(data[8:12], "little") == 1
    method = load(program).method("forward")
    assert not method._dynamic
    with pytest.raises(ProgramError, match="static shapes"):
        method(np.zeros((5, 4), np.float32))



def test_fully_dynamic_tensors_are_planned_at_their_upper_bound():
    # every dim symbolic: no static dim keeps the planner on the upper-bound path
    class Scale(torch.nn.Module):
        def forward(self, x):
            return (x * 2.0).relu() + 1.0

    n = Dim("n", min=1, max=MAX)
    program = _roundtrip(export(Scale(), (torch.randn(4),), dynamic_shapes=({0: n},),
                                kernels="portable"))
    forward = program.method("forward")
    assert forward.values[forward.inputs[0]].sizes == (MAX,)
    plan = forward.memory_plan
    _check(program, Scale(), lambda k: (torch.randn(k),), SIZES, MAX + 1)
    assert plan.arena_sizes[0] >= 2 * MAX * 4  # the input and a temporary at MAX at once
