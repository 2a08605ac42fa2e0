"""Several of the engine's own kernels of different shapes in one engine: they share its
scratch (a padded small convolution copies its input there, inside zeros it writes itself),
so each must set every byte it reads, whatever the kernel before it left there. Each model
below runs three calls (other inputs each time) and must match eager float64 on every one;
the kernels it is about must be the ones that ran.

A small convolution that skips clearing its right padding reads the previous kernel's
padded image there: Conv2d(8, 12, 3, padding=1) → ReLU → Conv2d(12, 24, 5, padding=2) was
then off by 0.49 from the first call, while every test of one convolution passed (a fresh
engine's scratch is zeros).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from opforge.backends.cpu import blob
from opforge.backends.cpu import engine as cpu_engine
from opforge.backends.cpu.binding import Binding
from opforge.backends.named_data import NamedDataMap
from opforge.export import export

from cpu_reference import check_against_float64, spread
from test_cpu_hostile_plans import cpu_flags

pytestmark = pytest.mark.skipif(cpu_engine.missing() is not None,
                                reason=f"cpu backend: {cpu_engine.missing()}")

SMALL = "convolution (own small kernel)"
WINOGRAD = "convolution (Winograd F(4x4 3x3))"


def _convs(*layers):
    """Conv2d layers (in, out, kernel, stride, padding) with a ReLU between each two."""
    mods = []
    for i, (c, k, size, stride, pad) in enumerate(layers):
        mods += [nn.ReLU()] if i else []
        mods.append(nn.Conv2d(c, k, size, stride=stride, padding=pad))
    return nn.Sequential(*mods)


class WinogradThenSmall(nn.Module):
    """A Winograd 3×3 convolution, a padded strided small one, and a softmax over rows of 25
    (the row kernel's 16 and a tail of 9) read from them."""

    def __init__(self):
        super().__init__()
        self.body = _convs((16, 16, 3, 1, 1), (16, 12, 3, 2, 1))

    def forward(self, x):
        y = self.body(x)
        return y, torch.softmax(y.flatten(2), dim=-1)


# name: (model, input shape, the own kernels it must run, in op order)
MODELS = {
    # the case: the second convolution's padded image is larger than the first's
    "small convs, the second larger": (lambda: _convs((8, 12, 3, 1, 1), (12, 24, 5, 1, 2)),
                                       (1, 8, 10, 10), [SMALL, SMALL]),
    # the first larger: the second's image sits inside what the first left
    "small convs, the second smaller": (lambda: _convs((8, 16, 5, 1, 2), (16, 8, 3, 1, 1)),
                                        (1, 8, 9, 11), [SMALL, SMALL]),
    # three sizes, a stride of 2, a batch of 2, one unpadded between two padded
    "three small convs, strided, batched": (
        lambda: _convs((8, 10, 3, 2, 1), (10, 9, 1, 1, 0), (9, 20, 3, 1, 2)),
        (2, 8, 13, 9), [SMALL, SMALL, SMALL]),
    "winograd, small conv and softmax rows": (WinogradThenSmall, (1, 16, 10, 10), [WINOGRAD, SMALL]),
}


@pytest.fixture(autouse=True)
def _own_kernels(monkeypatch):
    monkeypatch.delenv("OPFORGE_CPU_CAPABILITY", raising=False)
    for switch in ("OPFORGE_CPU_WINOGRAD", "OPFORGE_CPU_SMALL_CONV"):
        monkeypatch.delenv(switch, raising=False)


@pytest.mark.parametrize("name", list(MODELS))
def test_own_kernels_sharing_one_engine_match_float64_on_every_call(name):
    make, shape, kernels = MODELS[name]
    model = spread(make())
    g = torch.Generator().manual_seed(2)
    inputs = [torch.randn(shape, generator=g) for _ in range(3)]
    program = export(model, (inputs[0],), backends=["cpu"])
    assert len(program.delegates) == 1
    plan, data = blob.parse(program.segments[program.delegates[0].segment].data)
    handle = cpu_engine.EngineHandle(plan, data, 1, 1 << 30, None, {}, named=NamedDataMap(program))
    try:
        if "avx512f" in cpu_flags():  # (elsewhere oneDNN runs them all: still checked)
            ran = [op for op in handle.describe() if op in (SMALL, WINOGRAD)]
            assert ran == kernels, f"{name}: the engine's own kernels are {ran}, not {kernels}"
        for call, x in enumerate(inputs):
            outs = [np.zeros(dims, cpu_engine.NUMPY[dtype]) for dims, dtype in handle.outputs]
            Binding(handle, [x.numpy()], outs)()
            try:
                check_against_float64(model, (x,), outs)
            except AssertionError as e:
                what = e.args[0] if e.args else None
                if isinstance(what, tuple) and len(what) == 3:  # (error, eager's, scale)
                    what = (f"off float64 by {what[0]:.3g} (eager float32 by {what[1]:.3g}, "
                            f"outputs up to {what[2]:.3g})")
                raise AssertionError(f"{name}, call {call + 1} of 3 (one engine, its scratch "
                                     f"shared by {kernels}): {what}") from None
    finally:
        handle.close()
