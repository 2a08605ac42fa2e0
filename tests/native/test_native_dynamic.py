"""Native kernels in a program with dynamic shapes: through the unchanged kernel ABI they
receive every tensor, outs included, at the call's actual sizes."""

import numpy as np
import pytest
import torch
from torch.export import Dim

from opforge.errors import ProgramError
from opforge.examples.custom_model import custom_op_model
from opforge.export import export
from opforge.runtime import load


def test_native_kernels_run_at_each_bound_size(full):
    model, (x,) = custom_op_model(0)
    program = export(model, (x,), dynamic_shapes=({0: Dim("batch", min=1, max=16)},),
                     kernels=["portable", set(full.ops)])
    keys = {op.key for op in program.method("forward").operators}
    assert "my_ops::mul3.out" in keys and program.method("forward").symbols
    forward = load(program, kernels=[full.path]).method("forward")
    for n in (1, 2, 3, 7, 16, 2):
        batch = torch.randn(n, 8)
        with torch.no_grad():
            expected = model(batch).numpy()
        (got,) = forward(batch.numpy())
        assert got.shape == expected.shape == (n,)
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(ProgramError, match="batch in \\[1, 16\\]"):
        forward(np.zeros((17, 8), np.float32))
