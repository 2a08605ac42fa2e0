"""Every op family the cpu backend takes, with parameters and buffers away from their
defaults, in each position that changes how it is lowered:

- ``input``: it reads a graph input directly;
- ``view``: it reads a strided view (a permuted input permuted back: not row-major);
- ``cat``: it reads a concatenation (written by several copies);
- ``two_readers``: its operand is also read by another op (no in-place reuse, no folding);
- ``output``: its operand is also a graph output, and its own result is one.

Each case is exported with the cpu backend, must be delegated (the op itself, not just its
neighbours), and is compared with eager float64 under the criterion of cpu_reference.py.
BatchNorm's positions, folding included, are in test_cpu_batchnorm.py.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from opforge.export import delegation_report, export
from opforge.runtime import load

from cpu_reference import check_against_float64, spread


class Fn(nn.Module):
    """A function with constant tensors drawn at construction (then spread like weights)."""

    def __init__(self, fn, *consts):
        super().__init__()
        self.fn = fn
        self.consts = nn.ParameterList([nn.Parameter(c, requires_grad=False) for c in consts])

    def forward(self, x):
        return self.fn(x, *self.consts)


def _r(*shape):
    return torch.randn(*shape)


# name: (module factory, input shape); the op reads a rank ≥ 2 float32 tensor
OPS = {
    "conv1d": (lambda: nn.Conv1d(4, 6, 3, padding=1), (2, 4, 9)),
    "conv2d_strided_grouped": (lambda: nn.Conv2d(4, 6, 3, stride=2, padding=1, groups=2), (2, 4, 7, 7)),
    "conv2d_dilated": (lambda: nn.Conv2d(4, 5, 3, dilation=2, padding=2), (2, 4, 8, 8)),
    "conv3d": (lambda: nn.Conv3d(4, 3, 3, padding=1), (1, 4, 4, 5, 5)),
    "conv_transpose2d": (lambda: nn.ConvTranspose2d(4, 3, 3, stride=2, padding=1, output_padding=1), (2, 4, 5, 5)),
    "linear": (lambda: nn.Linear(6, 5), (3, 4, 6)),
    "matmul_const": (lambda: Fn(lambda x, w: x @ w, _r(6, 3)), (2, 4, 6)),
    "bmm_const": (lambda: Fn(lambda x, w: torch.bmm(x, w), _r(2, 6, 3)), (2, 4, 6)),
    "layer_norm": (lambda: nn.LayerNorm(6), (2, 5, 6)),
    "group_norm": (lambda: nn.GroupNorm(2, 4), (2, 4, 3, 5)),
    "max_pool2d": (lambda: nn.MaxPool2d(3, stride=2, padding=1), (2, 4, 7, 7)),
    "avg_pool2d": (lambda: nn.AvgPool2d(2, stride=2, padding=1, count_include_pad=False), (2, 4, 7, 7)),
    "adaptive_avg_pool2d": (lambda: nn.AdaptiveAvgPool2d(1), (2, 4, 5, 5)),
    "softmax": (lambda: nn.Softmax(dim=1), (2, 5, 3)),
    "log_softmax": (lambda: nn.LogSoftmax(dim=-1), (2, 5, 3)),
    "gelu": (lambda: nn.GELU(), (2, 4, 5)),
    "gelu_tanh": (lambda: nn.GELU(approximate="tanh"), (2, 4, 5)),
    "silu": (lambda: nn.SiLU(), (2, 4, 5)),
    "hardswish": (lambda: nn.Hardswish(), (2, 4, 5)),
    "leaky_relu": (lambda: nn.LeakyReLU(0.2), (2, 4, 5)),
    "elu": (lambda: nn.ELU(0.7), (2, 4, 5)),
    "hardtanh": (lambda: nn.Hardtanh(-0.5, 0.7), (2, 4, 5)),
    "tanh_sigmoid": (lambda: Fn(lambda x: torch.tanh(x) * torch.sigmoid(x)), (2, 4, 5)),
    "exp_sqrt_abs": (lambda: Fn(lambda x: torch.exp(x * 0.5) + torch.sqrt(x.abs())), (2, 4, 5)),
    "add_broadcast": (lambda: Fn(lambda x, c: x + c, _r(4, 1)), (2, 4, 5)),
    "mul_broadcast": (lambda: Fn(lambda x, c: x * c, _r(5)), (2, 4, 5)),
    "div_const": (lambda: Fn(lambda x, c: x / (c.abs() + 0.5), _r(1, 4, 1)), (2, 4, 5)),
    "maximum_minimum": (lambda: Fn(lambda x, c: torch.minimum(torch.maximum(x, c), c + 1), _r(4, 5)), (2, 4, 5)),
    "clamp": (lambda: Fn(lambda x: x.clamp(-0.3, 0.6)), (2, 4, 5)),
    "pow": (lambda: Fn(lambda x: x.pow(2)), (2, 4, 5)),
    "sum": (lambda: Fn(lambda x: x.sum(dim=1, keepdim=True)), (2, 4, 5)),
    "mean": (lambda: Fn(lambda x: x.mean(dim=(1, 2))), (2, 4, 5)),
    "amax_amin": (lambda: Fn(lambda x: x.amax(dim=-1) - x.amin(dim=-1)), (2, 4, 5)),
    "where": (lambda: Fn(lambda x, c: torch.where(x > 0.1, x, c), _r(4, 5)), (2, 4, 5)),
    "masked_fill": (lambda: Fn(lambda x: x.masked_fill(x < -0.2, -3.0)), (2, 4, 5)),
    "constant_pad": (lambda: Fn(lambda x: F.pad(x, (1, 2, 0, 1), value=0.7)), (2, 4, 5)),
    "index_select": (lambda: Fn(lambda x: torch.index_select(x, 1, torch.tensor([3, 0, 0, 2]))), (2, 4, 5)),
    # the engine's indexing ops (indexing.py) on a value that is no program state: out of place
    "index_rows": (lambda: Fn(lambda x: x[:, torch.tensor([3, -1, 0, 3])]), (2, 4, 5)),
    "index_put_rows": (lambda: Fn(lambda x, v: torch.index_put(x, (torch.tensor([1, -2]),), v),
                                  _r(2, 4, 5)), (2, 4, 5)),
    "slice_scatter": (lambda: Fn(lambda x, v: torch.slice_scatter(x, v, 2, 1, 5, 2), _r(2, 4, 2)),
                      (2, 4, 5)),
}


class Position(nn.Module):
    def __init__(self, op: nn.Module, position: str):
        super().__init__()
        self.op = op
        self.position = position

    def forward(self, x):
        p = self.position
        if p == "input":
            return self.op(x)
        if p == "view":  # the input arrives with its dims reversed
            return self.op(x.permute(*reversed(range(x.dim()))))
        if p == "cat":
            h = x.shape[1] // 2
            return self.op(torch.cat([x[:, :h] * 2.0, x[:, h:] + 0.5], 1))
        if p == "two_readers":
            t = x * 1.5
            return self.op(t), t - 0.25
        if p == "output":
            t = x + 0.75
            return t, self.op(t)
        raise AssertionError(p)


# oneDNN's vectorised log: ~16 ulp (see test_cpu_ops.py)
ULPS = {"log_softmax": 64}
POSITIONS = ["input", "view", "cat", "two_readers", "output"]


@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("name", sorted(OPS))
def test_op_matches_float64_in_every_lowering_position(name, position):
    factory, shape = OPS[name]
    torch.manual_seed(0)
    model = Position(spread(factory(), seed=len(name)), position).eval()
    x = torch.randn(*reversed(shape)) if position == "view" else torch.randn(shape)
    program = export(model, (x,), kernels="portable", backends=["cpu"])
    report = delegation_report(program)["forward"]
    assert not report["rejected"], report["rejected"][:3]
    got = load(program).method("forward")(x.numpy())
    check_against_float64(model, (x,), got, ulps=ULPS.get(name, 2))
