"""The memory planner and the PlanMemory pass, with exact expected values: lifetimes derived
by hand from the pass's documented time steps, arena sizes and offsets worked out by hand,
and the limits of the planner's own checks probed at and one past each.

``test_export_memory_planning.py`` checks invariants (no overlap, never above the naive
sum); an off-by-one in a lifetime or a worse packing order keeps those invariants and
only shows in exact values.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from opforge.export import export
from opforge.export.memory_planning import TensorLifetime, plan_arenas
from opforge.program import ArenaStorage, TensorValue
from opforge.runtime import load

T = TensorLifetime


# --- plan_arenas ---------------------------------------------------------------------------

def test_a_tensor_fills_a_gap_of_exactly_its_size():
    # a [0, 192) and c [256, 320) live through step 3; b [192, 256) dies after step 0, so
    # d (64 bytes, steps 1-2) fits the gap b leaves exactly: [192, 256), not above c.
    tensors = [T("a", 192, 0, 3), T("b", 64, 0, 0), T("c", 64, 0, 3), T("d", 64, 1, 2)]
    plan = plan_arenas(tensors)
    assert [plan.allocations[n].offset for n in "abcd"] == [0, 192, 256, 192]
    assert plan.arena_sizes == [320]


def test_largest_first_packs_tighter_than_smallest_first():
    # Largest first: big at 0, early at 0 (apart in time), late above big: 256 bytes.
    # Smallest first would put early and late side by side and big above them: 320.
    tensors = [T("big", 192, 3, 5), T("early", 64, 0, 2), T("late", 64, 2, 4)]
    plan = plan_arenas(tensors)
    assert {n: a.offset for n, a in plan.allocations.items()} == \
        {"big": 0, "early": 0, "late": 192}
    assert plan.arena_sizes == [256]


def test_ties_go_earliest_first_then_by_name():
    # Same size, overlapping lifetimes: the earlier-starting tensor gets the lower offset,
    # and between equal starts the name decides.
    plan = plan_arenas([T("b", 64, 1, 3), T("a", 64, 1, 3), T("z", 64, 0, 3)])
    assert {n: a.offset for n, a in plan.allocations.items()} == {"z": 0, "a": 64, "b": 128}


def test_reuse_ratio_is_naive_over_arena():
    plan = plan_arenas([T("a", 1000, 0, 1), T("b", 1000, 2, 3), T("c", 500, 4, 5)])
    assert plan.naive_bytes == 2500 and plan.arena_bytes == 1024
    assert plan.reuse_ratio == pytest.approx(2500 / 1024)
    assert plan_arenas([]).reuse_ratio == 1.0


def test_empty_plan_has_one_empty_arena():
    plan = plan_arenas([])
    assert plan.arena_sizes == [0] and plan.allocations == {}


def test_an_unused_memory_id_is_an_empty_arena():
    plan = plan_arenas([T("a", 10, 0, 0), T("b", 10, 0, 0)],
                       mem_id_of=lambda t: 0 if t.name == "a" else 2)
    assert plan.arena_sizes == [64, 0, 64]


def test_zero_byte_tensors_take_no_room():
    plan = plan_arenas([T("empty", 0, 0, 3), T("a", 64, 0, 3)])
    assert plan.allocations["a"].offset == 0 and plan.arena_sizes == [64]


@pytest.mark.parametrize("alignment, a_offset, size", [(1, 7, 10), (2, 8, 12), (16, 16, 32),
                                                       (64, 64, 128)])
def test_every_power_of_two_is_an_alignment(alignment, a_offset, size):
    # b (7 bytes, the larger) at 0; a (3 bytes, live with b) at the next aligned offset.
    plan = plan_arenas([T("a", 3, 0, 1), T("b", 7, 0, 1)], alignment=alignment)
    assert plan.allocations["a"].offset == a_offset and plan.arena_sizes == [size]


@pytest.mark.parametrize("bad", [0, -1, 3, 6, 12, 48, 65])
def test_non_powers_of_two_are_refused(bad):
    with pytest.raises(ValueError, match="power of two"):
        plan_arenas([T("a", 1, 0, 0)], alignment=bad)


def test_memory_id_zero_accepted_minus_one_refused():
    assert plan_arenas([T("a", 1, 0, 0)], mem_id_of=lambda t: 0).arena_sizes == [64]
    with pytest.raises(ValueError, match="returned -1"):
        plan_arenas([T("a", 1, 0, 0)], mem_id_of=lambda t: -1)


def test_lifetime_limits():
    T("empty", 0, 2, 2)  # zero bytes, one step: valid
    with pytest.raises(ValueError):
        T("a", -1, 0, 0)
    with pytest.raises(ValueError):
        T("a", 1, 3, 2)
    assert T("a", 1, 0, 2).overlaps(T("b", 1, 2, 4)) and not T("a", 1, 0, 1).overlaps(
        T("b", 1, 2, 4)) and T("b", 1, 2, 4).overlaps(T("a", 1, 0, 2))


# --- the PlanMemory pass: lifetimes of an exported method ----------------------------------

class Chain(torch.nn.Module):
    """relu → add → neg → mul by a parameter; returns the last and the first result."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.full((2, 3), 2.0, dtype=torch.float64))

    def forward(self, x, y, unused):
        a = torch.relu(x)
        b = a + y
        c = torch.neg(b) * self.w
        return c, a


def _inputs():
    g = torch.Generator().manual_seed(0)
    return (torch.randn(2, 3, generator=g), torch.randn(2, 3, generator=g, dtype=torch.float64),
            torch.randn(16, generator=g))


def test_lifetimes_follow_the_documented_time_steps():
    # Inputs are written at step 0; instruction i runs at step i + 1 (relu 1, add 2, neg 3,
    # mul 4); outputs are read at step 5. The parameter is a constant: not planned.
    seen = {}

    def policy(lifetime, node):
        seen[lifetime.name] = lifetime
        return 0

    program = export(Chain(), _inputs(), kernels="portable", mem_id_policy=policy)
    assert {n: (t.nbytes, t.start, t.end) for n, t in seen.items()} == {
        "x": (24, 0, 1),  # float32 (2, 3)
        "y": (48, 0, 2),  # float64 (2, 3)
        "unused": (64, 0, 0),
        "relu_out": (24, 1, 5),  # an output: lives to the end
        "add_out": (48, 2, 3),
        "neg_out": (48, 3, 4),
        "mul_out": (48, 4, 5),
    }
    method = program.method("forward")
    assert len(method.instructions) == 4
    assert method.memory_plan.arena_sizes == tuple(plan_arenas(list(seen.values())).arena_sizes)


def test_the_planned_program_computes_what_eager_does():
    model, inputs = Chain(), _inputs()
    program = export(model, inputs, kernels="portable")
    outputs = load(program).method("forward")(*(t.numpy() for t in inputs))
    with torch.no_grad():
        expected = model(*inputs)
    for out, want in zip(outputs, expected):
        np.testing.assert_allclose(out, want.numpy(), rtol=1e-12, atol=0)


def test_without_a_policy_every_tensor_is_in_arena_zero():
    program = export(Chain(), _inputs(), kernels="portable")
    method = program.method("forward")
    mem_ids = {v.storage.mem_id for v in method.values
               if type(v) is TensorValue and type(v.storage) is ArenaStorage}
    assert mem_ids == {0} and len(method.memory_plan.arena_sizes) == 1
