"""Batched matmuls on the cpu backend write their result where it goes (issue 47, item 3).

A 4-d ``torch.matmul`` exports as views to 3-d, ``bmm`` and a view back to 4-d. When that
value is a program's output, the lowering made the bmm write a temporary and appended an
engine ``copy`` of it into the output (every batched program of
bench/batched_matmul_rate.py carried one: swin_t's stage-1 ``attn@v`` ran at 0.37 of a 2-d
matmul's rate with it, 0.93 without). Now the temporary becomes a view of the output.
Shapes: Swin's windows (49 tokens, head dim 32), CoaT's factorised attention (8 heads of 8
channels), a broadcast batch (one operand shared by every window) and transposed operands
(a key read as ``kᵀ``). Every result is checked against eager float64 by the bound of
tests/backends/test_cpu_models.py (cpu_reference.check_against_float64).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from opforge.backends.cpu import blob
from opforge.export import export
from opforge.runtime import load

from cpu_reference import check_against_float64


class MatMul(nn.Module):
    def __init__(self, transpose_b: bool = False):
        super().__init__()
        self.transpose_b = transpose_b

    def forward(self, a, b):
        return a @ (b.transpose(-1, -2) if self.transpose_b else b)


class WindowAttention(nn.Module):
    """Swin's q @ kᵀ and attn @ v over windows of 49 tokens (heads 3, head dim 32)."""

    def forward(self, q, k, v):
        attn = (q @ k.transpose(-2, -1)).softmax(-1)
        return attn @ v


# (a's shape, b's shape as passed, transpose b): the layouts a model hands the matmul
CASES = {
    "swin_attn_v": ((4, 3, 49, 49), (4, 3, 49, 32), False),
    "swin_q_kT": ((4, 3, 49, 32), (4, 3, 49, 32), True),
    "coat_q_factor": ((1, 8, 197, 8), (1, 8, 8, 8), False),
    "coat_kT_v": ((1, 8, 8, 197), (1, 8, 197, 8), False),
    "broadcast_b": ((4, 3, 49, 32), (1, 3, 32, 49), False),
    "broadcast_a": ((1, 3, 49, 32), (4, 3, 32, 49), False),
}


def _export(model, inputs):
    plans = []
    encode = blob.encode

    def keep(plan, *named):
        plans.append(plan)
        return encode(plan, *named)

    mp = pytest.MonkeyPatch()
    mp.setattr(blob, "encode", keep)
    try:
        program = export(model, inputs, backends=["cpu"])
    finally:
        mp.undo()
    return program, plans


def _root(plan, tid):
    while plan.tensors[tid].role == "alias":
        tid = plan.tensors[tid].base
    return tid


@pytest.mark.parametrize("case", sorted(CASES))
def test_batched_matmul_writes_the_output(case):
    a_shape, b_shape, transpose_b = CASES[case]
    torch.manual_seed(0)
    inputs = (torch.randn(*a_shape), torch.randn(*b_shape))
    model = MatMul(transpose_b).eval()
    program, plans = _export(model, inputs)
    (plan,) = plans
    kinds = [op["kind"] for op in plan.ops]
    assert kinds.count("matmul") == 1, kinds
    last = plan.ops[-1]
    # the matmul is the program's last op and writes its output: no copy after it
    assert last["kind"] == "matmul", kinds
    assert _root(plan, last["out"][0]) in {_root(plan, t) for t in plan.outputs}
    if not transpose_b and a_shape[0] == b_shape[0]:
        assert kinds == ["matmul"]  # dense operands of one batch: nothing else at all
    got = load(program).method("forward")(*[t.numpy() for t in inputs])
    check_against_float64(model, inputs, got)


def test_window_attention_matches_and_copies_only_its_key():
    """Inside a model (the value read by a softmax, not returned) nothing changes: the
    results still match, and the only copy is the key's transpose."""
    torch.manual_seed(0)
    inputs = tuple(torch.randn(4, 3, 49, 32) for _ in range(3))
    model = WindowAttention().eval()
    program, plans = _export(model, inputs)
    (plan,) = plans
    kinds = [op["kind"] for op in plan.ops]
    assert kinds.count("copy") <= 1 and plan.ops[-1]["kind"] == "matmul", kinds
    got = load(program).method("forward")(*[t.numpy() for t in inputs])
    check_against_float64(model, inputs, got)


def test_a_returned_temporary_read_again_is_copied():
    """The output is written directly only when nothing reads the temporary afterwards:
    here the product is returned and read by the add."""

    class Both(nn.Module):
        def forward(self, a, b):
            p = a @ b
            return p, p + 1.0

    torch.manual_seed(0)
    inputs = (torch.randn(2, 3, 5, 4), torch.randn(2, 3, 4, 6))
    model = Both().eval()
    program, _ = _export(model, inputs)
    got = load(program).method("forward")(*[t.numpy() for t in inputs])
    check_against_float64(model, inputs, got)


def test_one_row_linear_with_layer_scale_and_residual():
    """timm cait_xxs24_224's class-attention MLP, ``x + gamma * fc2(h)`` on one row (a
    decode-shaped matmul: 768 x 192 constant weights, two binary post-ops): the few-row
    kernel runs both post-ops in place after it, and the engine freed gamma at finalize (a
    constant only its late_reads named): the process died (SIGSEGV in oneDNN's binary
    kernel) whenever gamma was copied rather than borrowed. Checked against float64;
    test_cpu_post_op_constants.py runs it with gamma both ways, in a child process."""

    class LayerScaleMlp(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(768, 192)
            self.gamma = nn.Parameter(torch.rand(192) + 0.5)

        def forward(self, x, h):
            return x + self.gamma * self.fc(h)

    torch.manual_seed(0)
    inputs = (torch.randn(1, 192), torch.randn(1, 768))
    model = LayerScaleMlp().eval()
    program, _ = _export(model, inputs)
    got = load(program).method("forward")(*[t.numpy() for t in inputs])
    check_against_float64(model, inputs, got)


def test_two_outputs_viewing_one_batched_result():
    """Two delegate outputs that are views of one batched matmul's result (as a MoE layer's
    loop over experts returns): the result stays a temporary and both are copied from it;
    when the first output took its writers, the second read a tensor with no memory and
    the delegate was refused at load."""

    class TwoViews(nn.Module):
        def forward(self, a, b):
            y = a @ b
            return y, y.reshape(2, 3, -1)

    g = torch.Generator().manual_seed(0)
    inputs = (torch.randn(2, 3, 5, 7, generator=g), torch.randn(2, 3, 7, 4, generator=g))
    model = TwoViews().eval()
    program, _ = _export(model, inputs)
    got = load(program).method("forward")(*[t.numpy() for t in inputs])
    check_against_float64(model, inputs, got)
