"""Greedy arena packing of tensor lifetimes. Pure Python; no torch.

The problem: tensors with a size and a lifetime (a closed interval of time steps)
must get byte offsets in an arena such that two tensors whose lifetimes overlap never
overlap in memory, and the arena is as small as we can cheaply make it.

The algorithm (the "greedy by size" heuristic of TFLite's and ExecuTorch's planners):
take tensors largest first (ties: earliest first, then by name, so plans are
deterministic); place each at the lowest 64-byte aligned offset where it does not
overlap any already placed tensor whose lifetime overlaps its own. Large tensors placed
first leave gaps that small tensors later fill. Arena size is the highest end offset,
rounded up to the alignment.

Several arenas: ``mem_id_of(tensor)`` chooses the arena (memory id) of each tensor,
and each arena is packed on its own; the default puts everything in arena 0. A later
policy can keep, say, graph inputs and outputs in their own arena so that callers can
hand in their buffers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

__all__ = ["TensorLifetime", "Allocation", "MemoryPlan", "plan_arenas", "align_up", "DEFAULT_ALIGNMENT"]

DEFAULT_ALIGNMENT = 64


def align_up(value: int, alignment: int) -> int:
    return (value + alignment - 1) // alignment * alignment


@dataclass(frozen=True)
class TensorLifetime:
    """A tensor to place: ``nbytes`` live from time step ``start`` to ``end`` inclusive."""

    name: str
    nbytes: int
    start: int
    end: int

    def __post_init__(self) -> None:
        if self.nbytes < 0 or self.start > self.end:
            raise ValueError(f"TensorLifetime {self.name}: nbytes={self.nbytes}, [{self.start}, {self.end}]")

    def overlaps(self, other: "TensorLifetime") -> bool:
        return self.start <= other.end and other.start <= self.end


@dataclass(frozen=True)
class Allocation:
    """Where one tensor lives: arena ``mem_id``, bytes ``[offset, offset + nbytes)``."""

    mem_id: int
    offset: int
    nbytes: int


@dataclass
class MemoryPlan:
    """The result of planning: an allocation per tensor and the size of each arena.

    ``naive_bytes`` is what giving every tensor its own memory would take (the sum of
    all tensor sizes); ``arena_bytes`` (the sum of the arena sizes) is what the plan takes.
    """

    allocations: dict[str, Allocation]
    arena_sizes: list[int]
    naive_bytes: int
    lifetimes: dict[str, TensorLifetime] = field(default_factory=dict)

    @property
    def arena_bytes(self) -> int:
        return sum(self.arena_sizes)

    @property
    def reuse_ratio(self) -> float:
        """``naive_bytes / arena_bytes``: how many times over memory is reused (≥ 1)."""
        return self.naive_bytes / self.arena_bytes if self.arena_bytes else 1.0


def _place(tensor: TensorLifetime, placed: list[tuple[TensorLifetime, int]], alignment: int) -> int:
    busy = sorted(
        (offset, offset + other.nbytes) for other, offset in placed if other.overlaps(tensor) and other.nbytes
    )
    offset = 0
    for begin, end in busy:
        if offset + tensor.nbytes <= begin:
            break
        offset = max(offset, align_up(end, alignment))
    return offset


def plan_arenas(
    tensors: Sequence[TensorLifetime],
    *,
    alignment: int = DEFAULT_ALIGNMENT,
    mem_id_of: Callable[[TensorLifetime], int] = lambda tensor: 0,
) -> MemoryPlan:
    """Pack ``tensors`` into arenas; see the module docstring for the algorithm.

    >>> plan = plan_arenas([TensorLifetime("a", 100, 0, 1), TensorLifetime("b", 100, 2, 3)])
    >>> plan.allocations["b"].offset, plan.arena_sizes
    (0, [128])
    """
    if alignment <= 0 or alignment & (alignment - 1):
        raise ValueError(f"plan_arenas(): alignment must be a power of two, got {alignment}")
    names = [t.name for t in tensors]
    if len(set(names)) != len(names):
        raise ValueError("plan_arenas(): tensor names must be unique")
    by_arena: dict[int, list[TensorLifetime]] = {}
    for tensor in tensors:
        mem_id = mem_id_of(tensor)
        if mem_id < 0:
            raise ValueError(f"plan_arenas(): mem_id_of({tensor.name}) returned {mem_id}; must be >= 0")
        by_arena.setdefault(mem_id, []).append(tensor)
    arena_sizes = [0] * (max(by_arena) + 1 if by_arena else 1)
    allocations: dict[str, Allocation] = {}
    for mem_id, members in by_arena.items():
        placed: list[tuple[TensorLifetime, int]] = []
        for tensor in sorted(members, key=lambda t: (-t.nbytes, t.start, t.name)):
            offset = _place(tensor, placed, alignment)
            placed.append((tensor, offset))
            allocations[tensor.name] = Allocation(mem_id, offset, tensor.nbytes)
            arena_sizes[mem_id] = max(arena_sizes[mem_id], align_up(offset + tensor.nbytes, alignment))
    return MemoryPlan(
        allocations={name: allocations[name] for name in names},
        arena_sizes=arena_sizes,
        naive_bytes=sum(t.nbytes for t in tensors),
        lifetimes={t.name: t for t in tensors},
    )
