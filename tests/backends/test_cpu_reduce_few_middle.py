"""A reduction of a few elements over a dim that is not innermost, the dims before it of any
(or a run-time) size: the mixture-of-experts decoders of transformers (mixtral, qwen2_moe,
qwen3_moe) sum their top-2 experts' outputs, [tokens, 2, hidden] over dim 1, which oneDNN
runs on its reference reduction (``ref:any``; bench/transformers_decoders.py found it,
issue 47). The lowering copies the source with the reduced dims moved innermost and reduces
there on oneDNN's jit kernel (``lowering/reduction.py``).

Results are compared with eager float64 by ``cpu_reference.check_against_float64`` (8x
eager float32's own error plus 2 ulp of the output's scale): the copy moves values without
rounding them, and a sum of 2 to 8 numbers in another order stays inside that bound.
"""

from __future__ import annotations

import pytest
import torch
from torch.export import Dim

from opforge.backends.cpu import engine as cpu_engine
from opforge.export import export
from opforge.runtime import load

from cpu_reference import check_against_float64


class Reduce(torch.nn.Module):
    def __init__(self, how: str, dims) -> None:
        super().__init__()
        self.how, self.dims = how, dims

    def forward(self, x):
        return getattr(torch, self.how)(x, dim=self.dims) * 1.5


def _reference(impl: str) -> bool:
    name, _, isa = impl.partition(":")
    return bool(impl) and (name.startswith("ref") or isa == "any")


@pytest.mark.parametrize("how,dims,shape,dynamic", [
    ("sum", 1, (6, 2, 64), True),        # the MoE decoders' pattern, tokens at run time
    ("sum", 1, (6, 2, 64), False),
    ("amax", (1, 2), (3, 2, 4, 16), False),
    ("amin", 0, (5, 7, 3), False),
])
def test_few_middle_elements_reduce_on_the_jit_kernel(how, dims, shape, dynamic):
    model = Reduce(how, dims).eval()
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(len(shape)))
    program = export(model, (x,), backends=["cpu"],
                     dynamic_shapes=({0: Dim("rows", min=1, max=9)},) if dynamic else None)
    impls = cpu_engine.program_impls(program)
    assert [p for p in impls if p[0] == "reduction"], impls
    assert not [p for p in impls if _reference(p[1])], impls
    forward = load(program).method("forward")
    for rows in ((shape[0], 1, 9) if dynamic else (shape[0],)):
        inputs = (torch.randn(rows, *shape[1:], generator=torch.Generator().manual_seed(rows)),)
        check_against_float64(model, inputs, forward(*[t.numpy() for t in inputs]))
