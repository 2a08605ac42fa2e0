"""``linear`` (and ``matmul`` with 2-d weights) on a batch of rows: the lowering runs one
2-d oneDNN matmul over all rows when they are one dense run, instead of a batched matmul
with broadcast weights (7x slower on a transformer's [1, 128, 256] x [256, 768]
projection); other layouts are copied to rows first or keep the batched form. Values
against float64 either way.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from opforge.backends.cpu import blob
from opforge.backends.cpu import engine as cpu_engine
from opforge.export import export
from opforge.runtime import load

pytestmark = pytest.mark.skipif(cpu_engine.missing() is not None,
                                reason=f"cpu backend: {cpu_engine.missing()}")


class Project(nn.Module):
    def __init__(self, k: int, n: int, bias: bool, permute: bool) -> None:
        super().__init__()
        self.fc = nn.Linear(k, n, bias=bias)
        self.permute = permute
        with torch.no_grad():
            self.fc.weight.mul_(3.0)
            if bias:
                self.fc.bias.uniform_(-2.0, 2.0)

    def forward(self, x):
        if self.permute:  # rows no longer one dense run: (b, s, k) read as (s, b, k)
            x = x.transpose(0, 1)
        return torch.tanh(self.fc(x))


def _matmul_ranks(program) -> list[int]:
    plan, _ = blob.parse(program.segments[program.delegates[0].segment].data)
    return [len(plan["tensors"][op["in"][0]]["dims"]) for op in plan["ops"] if op["kind"] == "matmul"]


@pytest.mark.parametrize("kernels", [None, "portable"])
@pytest.mark.parametrize("shape, bias, permute, rank", [
    ((1, 128, 64), True, False, 2),
    ((3, 7, 16), False, False, 2),
    ((2, 1, 5, 16), True, False, 2),
    ((3, 7, 16), True, True, None),  # batched, or copied to rows first: the values decide
])
def test_linear_rows_match_float64(shape, bias, permute, rank, kernels):
    torch.manual_seed(len(shape) + shape[-2])
    model = Project(shape[-1], 24, bias, permute).eval()
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(shape[1]))
    program = export(model, (x,), backends=["cpu"], **({"kernels": kernels} if kernels else {}))
    if rank is not None:
        assert _matmul_ranks(program) == [rank]
    got = load(program).method("forward")(x.numpy())[0]
    with torch.no_grad():
        want = model.double()(x.double()).numpy()
    # float32 sums of 16-64 products then tanh: a few ulp of values up to ~1
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-6)
