"""Bugs of the cpu backend found by bench/external_models.py (models written elsewhere:
torchvision, timm, transformers), each reduced to the smallest model that shows it.

Every test runs the model on the cpu backend and on the lean runtime and compares both with
eager float32: the lowering must compute what the portable kernels compute.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from opforge.backends import get_backend
from opforge.export import delegation_report, export
from opforge.runtime import load


def _check_delegated_and_matching(model, inputs, atol=1e-5):
    problem = get_backend("cpu").unavailable()
    assert problem is None, f"the cpu backend must be usable in this environment: {problem}"
    model.eval()
    with torch.no_grad():
        want = model(*inputs).numpy()
    program = export(model, inputs, kernels="portable", backends=["cpu"])
    assert delegation_report(program)["forward"]["delegates"], "nothing was delegated"
    for mode in ("lean", "aten"):
        got = load(program, mode=mode).method("forward")(*[t.numpy() for t in inputs])[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=atol, err_msg=mode)


class _PoolOfChannelSlice(torch.nn.Module):
    """A pooling of some channels of a convolution's output (timm's Res2Net: the first block
    of a stage average-pools the last of the split channel groups). The convolution's
    output is channels-last, so the slice has channel stride 1 with gaps between pixels."""

    def __init__(self, pool: str, first: bool) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(8, 8, 1)
        self.pool, self.first = pool, first

    def forward(self, x):
        a, b = torch.split(self.conv(x), 4, 1)
        t = a if self.first else b
        if self.pool == "avg":
            return F.avg_pool2d(t, 3, 1, 1)
        if self.pool == "max":
            return F.max_pool2d(t, 3, 2, 1)
        return F.adaptive_avg_pool2d(t, 2)


@pytest.mark.parametrize("first", [True, False], ids=["first-group", "last-group"])
@pytest.mark.parametrize("pool", ["avg", "max", "adaptive"])
def test_pooling_of_a_channel_slice_of_a_channels_last_tensor(pool, first):
    # The engine writes a pooling's destination channels-last whenever the source's channel
    # stride is 1; the lowering planned it row-major unless the source was exactly
    # channels-last, so the next op read the pooled values in the wrong order (Res2Net's
    # error was 4× its output's scale).
    torch.manual_seed(0)
    _check_delegated_and_matching(_PoolOfChannelSlice(pool, first), (torch.randn(1, 8, 6, 6),))


def test_res2net_first_block_layout():
    """The whole pattern of timm's Bottle2neck (is_first): split, a convolution per group,
    the last group pooled, concatenated."""

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = torch.nn.Conv2d(8, 12, 1)
            self.convs = torch.nn.ModuleList(torch.nn.Conv2d(4, 4, 3, padding=1) for _ in range(2))
            self.conv3 = torch.nn.Conv2d(12, 8, 1)

        def forward(self, x):
            parts = torch.split(torch.relu(self.conv1(x)), 4, 1)
            out = [torch.relu(conv(p)) for conv, p in zip(self.convs, parts)]
            out.append(F.avg_pool2d(parts[-1], 3, 1, 1))
            return self.conv3(torch.cat(out, 1)) + x

    torch.manual_seed(0)
    _check_delegated_and_matching(Block(), (torch.randn(1, 8, 7, 7),))


class _ResizeBicubic(torch.nn.Module):
    """timm's CrossViT resizes its 240×240 input to 224×224 for one branch (bicubic)."""

    def forward(self, x):
        return F.interpolate(x, size=(5, 5), mode="bicubic", align_corners=False)


class _WeightsFromIndexMath(torch.nn.Module):
    """The same pattern, small: weights 1 - t computed from constants, around a gather that
    stays on the kernels."""

    def forward(self, x):
        i = torch.arange(4, dtype=torch.float32) * 0.6
        f = torch.floor(i)
        t = torch.clamp(i - f, 0, 1)
        y = x[:, :, f.long()]
        return y * t + y * (1 - t)


@pytest.mark.parametrize("model", [_ResizeBicubic, _WeightsFromIndexMath])
def test_rsub_of_a_scalar_runs_in_a_delegate(model):
    # The support check folds `1 - t` (aten::rsub.Scalar) when t comes from constants, but
    # the partitioner can put t's producer in another partition (a rejected gather sits
    # between them); t is then a runtime input of the delegate and preprocess raised
    # Unsupported, failing the whole export. rsub of a scalar now lowers at run time too.
    torch.manual_seed(0)
    _check_delegated_and_matching(model(), (torch.randn(1, 2, 4, 4),))


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_stack_of_computed_tensors(dim):
    # aten::stack had no run-time lowering (only folding on constants), so bicubic
    # interpolation's stacked weights failed the export as rsub did (timm's CrossViT).
    class Stack(torch.nn.Module):
        def forward(self, x):
            return torch.stack([torch.relu(x), x * 2, x + 1], dim)

    x = torch.randn(2, 3, 4)
    _check_delegated_and_matching(Stack(), (x,))
    report = delegation_report(export(Stack(), (x,), kernels="portable", backends=["cpu"]))
    assert not report["forward"]["rejected"], report["forward"]["rejected"]


def test_a_group_preprocess_cannot_compile_stays_on_the_kernels():
    """The partition check folds ops whose inputs are constants; a gather that stays on the
    kernels can put such values into a delegate at run time, where an op without a run-time
    lowering (cos here) used to fail the whole export. The group now stays on the kernels,
    each node saying why, and the program runs right."""
    import numpy as np
    import torch

    from opforge.export import delegation_report, export
    from opforge.runtime import load

    class M(torch.nn.Module):
        def forward(self, x):
            i = torch.arange(4, dtype=torch.float32) * 0.6
            f = torch.floor(i)
            t = torch.clamp(i - f, 0, 1)
            # gather: no cpu lowering (x[:, :, idx] is an index op the engine runs now)
            return torch.gather(x, 2, f.long().expand(2, 3, 4)) * torch.cos(t)

    x = torch.randn(2, 3, 5)
    program = export(M(), (x,), kernels="portable", backends=["cpu"])
    rejected = delegation_report(program)["forward"]["rejected"]
    assert any("left on the kernels with its whole delegate group" in r["reason"] for r in rejected), rejected
    np.testing.assert_allclose(load(program).method("forward")(x.numpy())[0], M()(x).numpy(),
                               rtol=1e-6, atol=1e-6)
