"""The engine's typed fast paths, against eager PyTorch, where they apply and where not.

Comparisons of float32 operands into bool, logical_not of bool and float32 fill run as
typed row loops; a reduction of a row-major input over its trailing dimensions runs as
contiguous runs (uint8 any/all as a vectorized pass). Everything else takes the generic
loops. Each case below is built to land on one side of those conditions (trailing vs
leading vs middle dimensions, size-1 dimensions, permuted and broadcast operands) and
must give exactly eager's booleans, and eager's sums within float32 rounding (the engine
accumulates in float64, eager in float32: the criterion is the float64 reference's).
Special values (NaN, ±inf, -0.0) and a float32 scalar that is not a double (0.1) are in
every input.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn

from opforge.export import export
from opforge.runtime import load

SPECIAL = torch.tensor([float("nan"), float("inf"), float("-inf"), -0.0, 0.0, 0.1, 0.2, 1.0])


def _input(shape, seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=gen)
    flat = x.view(-1)
    picks = torch.randint(0, flat.numel(), (max(1, flat.numel() // 4),), generator=gen)
    flat[picks] = SPECIAL[torch.randint(0, len(SPECIAL), (len(picks),), generator=gen)]
    return x


class Logic(nn.Module):
    def __init__(self, dims):
        super().__init__()
        self.dims = dims

    def forward(self, x, y):
        p = x.permute(*reversed(range(x.dim())))  # a non-row-major operand
        masks = [x == 0.1, x != y, x < 0.2, x <= y, x > -0.0, x >= 0.1, x == float("-inf"),
                 p > 0.0, x < y[..., :1]]  # the last: a broadcast operand
        out = [torch.logical_not(m) for m in masks] + masks
        for d in self.dims:
            out += [masks[0].any(d, keepdim=True), masks[6].all(d, keepdim=True),
                    torch.logical_not(masks[2]).any(d, keepdim=True)]
        out.append(torch.where(masks[6].any(-1, keepdim=True), torch.zeros_like(x), x))
        return tuple(out)


class Sums(nn.Module):
    def __init__(self, dims):
        super().__init__()
        self.dims = dims

    def forward(self, x):
        out = []
        for d in self.dims:
            clean = torch.nan_to_num(x, nan=0.5, posinf=3.0, neginf=-3.0)
            out += [clean.sum(d, keepdim=True), clean.mean(d, keepdim=True),
                    x.amax(d, keepdim=True), x.amin(d, keepdim=True)]
        return tuple(out)


SHAPES = [((4, 8), [-1, 0, (0, 1)]), ((2, 3, 5), [-1, (1, 2), 1, 0]),
          ((1, 4, 6, 6), [-1, (2, 3), 1, (0, 1)]), ((3, 1, 7), [-1, (1, 2), 0])]


def _run(model, inputs):
    program = export(model, inputs, backends=["cpu"])
    assert any(type(i).__name__ == "DelegateCall" for m in program.methods
               for i in m.instructions)
    return load(program).method("forward")(*[t.numpy() for t in inputs])


@pytest.mark.parametrize("shape,dims", SHAPES, ids=[str(s) for s, _ in SHAPES])
def test_comparisons_masks_and_bool_reductions_are_eager_exactly(shape, dims):
    x, y = _input(shape, 1), _input(shape, 2)
    y.view(-1)[::3] = x.view(-1)[::3]  # equal pairs, NaN pairs among them
    model = Logic(dims)
    got = _run(model, (x, y))
    want = model(x, y)
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == w.numpy().dtype, i
        np.testing.assert_array_equal(g, w.numpy(), err_msg=f"output {i}")


@pytest.mark.parametrize("shape,dims", SHAPES, ids=[str(s) for s, _ in SHAPES])
def test_reductions_match_float64(shape, dims):
    x = _input(shape, 3)
    model = Sums(dims)
    got = _run(model, (x,))
    want64 = model(x.double())
    for i, (g, w) in enumerate(zip(got, want64)):
        w = w.numpy()
        kind = i % 4  # sum, mean, amax, amin
        if kind >= 2:  # max/min (NaN-propagating) are exact
            np.testing.assert_array_equal(g, w.astype(np.float32), err_msg=f"output {i}")
        else:  # float32 summation (oneDNN, or the engine's float64 loop): the textbook
            # bound n * eps * sum|x| on the error of a sum of n terms, per output
            d = dims[i // 4]
            clean = torch.nan_to_num(x, nan=0.5, posinf=3.0, neginf=-3.0).double()
            n = clean.numel() // max(w.size, 1)
            bound = n * 2**-23 * clean.abs().sum(d, keepdim=True).numpy()
            if kind == 1:
                bound = bound / n + 2**-24 * np.abs(w)
            assert np.all(np.abs(g - w) <= bound + 2**-24 * np.abs(w)), f"output {i}"
