"""aten::roll and zero padding inside cpu delegates, as torchvision's Swin has them (issue 47):
its shifted windows roll the feature map before and after attention (lowering/roll.py; a
roll on the kernels cut swin_t into 11 delegates), and every block pads its input to whole
windows, by 0 when they fit (lowering/views.py: the input itself, no fill and copy). Both
only move values, so the delegate's result must equal eager's bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from opforge.export import delegation_report, export
from opforge.backends.cpu import engine as cpu_engine
from opforge.runtime import load


class Rolls(nn.Module):
    """Swin's shift and its inverse around an op, then rolls of other kinds: one dim, a
    shift past the size, a dim named twice, a transposed (strided) source, a zero shift."""

    def forward(self, x):
        shifted = torch.roll(x * 2.0, shifts=(-3, -3), dims=(1, 2))
        back = torch.roll(shifted + 1.0, shifts=(3, 3), dims=(1, 2))
        return (back, torch.roll(x, 5, 0), torch.roll(x, 31, 2), torch.roll(x, (2, -5), (1, 1)),
                torch.roll(x.transpose(1, 2), (2, 7, -1), (1, 3, 1)), torch.roll(x, 0, 3) - 1.0)


def _report(program):
    return delegation_report(program)["forward"]


@pytest.mark.parametrize("kernels", [None, "portable"])
def test_rolls_run_in_one_delegate_and_match_eager_exactly(kernels):
    x = torch.randn(2, 14, 13, 8, generator=torch.Generator().manual_seed(11))
    model = Rolls().eval()
    program = export(model, (x,), backends=["cpu"], kernels=kernels)
    report = _report(program)
    assert len(report["delegates"]) == 1 and not report["rejected"], report
    got = load(program).method("forward")(x.numpy())
    with torch.no_grad():
        want = model(x)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.asarray(g), w.numpy())


class FlatRoll(nn.Module):
    def forward(self, x):
        return torch.roll(x + 1.0, 3) * 2.0


@pytest.mark.parametrize("kernels", [None, "portable"])
def test_a_roll_of_the_flattened_tensor(kernels):
    # torch's decomposition rolls the flattened view over dim 0 (delegated); the portable
    # set keeps roll without dims, which stays on the kernels
    x = torch.randn(3, 5)
    program = export(FlatRoll().eval(), (x,), backends=["cpu"], kernels=kernels)
    rejected = [r["op"] for r in _report(program)["rejected"]]
    assert rejected == ([] if kernels is None else ["aten::roll.default"]), rejected
    got = load(program).method("forward")(x.numpy())
    np.testing.assert_array_equal(np.asarray(got[0]), FlatRoll()(x).numpy())


class Pads(nn.Module):
    """Padding by 0 (Swin's when the windows fit), a crop, a pad of two dims, CoaT's row
    before the tokens, an output that is the input padded by 0."""

    def forward(self, x):
        return (F.pad(x * 2.0, (0, 0, 0, 0, 0, 0)) + 1.0, F.pad(x, (0, 0, -1, 0, 0, -2)),
                F.pad(x + 1.0, (0, 0, 0, 1, 2, 1), value=3.0), F.pad(x, (0, 0, 0, 0)),
                F.pad(x - 1.0, (0, 0, 1, 0)))


@pytest.mark.parametrize("kernels", [None, "portable"])
def test_pads_by_zero_are_the_input_itself(kernels):
    x = torch.randn(1, 7, 9, 4, generator=torch.Generator().manual_seed(12))
    model = Pads().eval()
    program = export(model, (x,), backends=["cpu"], kernels=kernels)
    ops = [op for op, _ in cpu_engine.program_impls(program)]
    # a pad fills its padding alone (one fill per padded side: 3 and 1) and copies; the
    # crop copies; a pad by 0 is no op at all, except the copy that makes the input padded
    # by 0 an output of its own
    assert ops.count("elementwise") == 4 and ops.count("copy") == 4, ops
    got = load(program).method("forward")(x.numpy())
    with torch.no_grad():
        want = model(x)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.asarray(g), w.numpy())
