"""The greedy arena planner (pure Python) against an independent overlap check."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opforge.export.memory_planning import TensorLifetime, plan_arenas


def _overlaps(plan, tensors):
    bad = []
    for i, a in enumerate(tensors):
        for b in tensors[i + 1:]:
            pa, pb = plan.allocations[a.name], plan.allocations[b.name]
            if pa.mem_id != pb.mem_id or not (a.start <= b.end and b.start <= a.end):
                continue
            if a.nbytes and b.nbytes and pa.offset < pb.offset + b.nbytes and pb.offset < pa.offset + a.nbytes:
                bad.append((a.name, b.name))
    return bad


def test_disjoint_lifetimes_share_memory():
    tensors = [TensorLifetime("a", 1000, 0, 1), TensorLifetime("b", 1000, 2, 3), TensorLifetime("c", 500, 4, 5)]
    plan = plan_arenas(tensors)
    assert {a.offset for a in plan.allocations.values()} == {0}
    assert plan.arena_sizes == [1024] and plan.naive_bytes == 2500 and plan.reuse_ratio > 2


def test_overlapping_lifetimes_get_aligned_disjoint_slots():
    tensors = [TensorLifetime("a", 100, 0, 2), TensorLifetime("b", 10, 1, 3), TensorLifetime("c", 10, 2, 2)]
    plan = plan_arenas(tensors)
    assert all(a.offset % 64 == 0 for a in plan.allocations.values())
    assert _overlaps(plan, tensors) == []
    assert plan.arena_sizes == [256]


def test_small_tensor_fills_the_gap_left_by_a_dead_one():
    # a (big) and c (big) live apart; b is small and lives with both: it goes after them.
    tensors = [TensorLifetime("a", 640, 0, 1), TensorLifetime("c", 640, 2, 3), TensorLifetime("b", 64, 0, 3)]
    plan = plan_arenas(tensors)
    assert plan.arena_sizes == [704]


def test_mem_id_policy_splits_arenas():
    tensors = [TensorLifetime("in", 64, 0, 0), TensorLifetime("t", 64, 0, 1)]
    plan = plan_arenas(tensors, mem_id_of=lambda t: 1 if t.name == "in" else 0)
    assert plan.allocations["in"].mem_id == 1 and plan.arena_sizes == [64, 64]


@pytest.mark.parametrize("bad", [0, 3, -64])
def test_bad_alignment(bad):
    with pytest.raises(ValueError):
        plan_arenas([TensorLifetime("a", 1, 0, 0)], alignment=bad)


def test_bad_lifetime():
    with pytest.raises(ValueError):
        TensorLifetime("a", 1, 3, 2)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5000), st.integers(0, 30), st.integers(0, 10)), min_size=1, max_size=40))
def test_random_plans_never_overlap_and_never_exceed_the_aligned_naive_sum(specs):
    tensors = [TensorLifetime(f"t{i}", size, start, start + length) for i, (size, start, length) in enumerate(specs)]
    plan = plan_arenas(tensors)
    assert _overlaps(plan, tensors) == []
    assert plan.arena_bytes <= sum((t.nbytes + 63) // 64 * 64 for t in tensors)
    for name, slot in plan.allocations.items():
        assert slot.offset % 64 == 0 and slot.offset + slot.nbytes <= plan.arena_sizes[slot.mem_id]
