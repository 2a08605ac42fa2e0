"""Growing memory: the tensors of a method that live outside its arenas and grow.

# Design
#
# A dimension exported with ``export(..., grow=[name])`` is a growing symbol
# (``Symbol.grow``, format version 4). The tensors whose sizes read one
# (``growing_values``) have no slot in the arenas: planning them at the upper bound is
# what the user opted out of (an unbounded Dim, or a bound so large that paying it up front
# is waste). Each gets its own buffer here, first at its size at the export example (its
# stored sizes). When a call's sizes need more, the buffer is replaced by one of
# ``max(needed, 2 * capacity)`` bytes (geometric: n calls of growing sizes cost O(log n)
# reallocations), trimmed to what the memory limit still allows; the old contents are not
# kept (a growing tensor is an input, an intermediate or an output: every call writes it
# before reading it). The arenas and every other planned tensor are unchanged.
#
# The limit covers the arenas plus every growing buffer: a growth beyond it is a
# ``ProgramError`` naming the value, the symbols' values, the bytes and the limit, raised
# before anything is allocated, and the method keeps its previous buffers (a later call at
# a size that fits still runs). A growth invalidates the views made over the old buffer,
# so the method drops its per-shape bindings (``Method._bind_shape``). Growth is counted
# (``growths``, ``Method.memory_growths``) and logged on the ``opforge.runtime`` logger.
"""

from __future__ import annotations

import logging
import math

import numpy as np

from opforge.errors import ProgramError
from opforge.program import Method as MethodDef, TensorValue
from opforge.program.symbolic import growing_values
from opforge.runtime.arena import ALIGNMENT, arena_bytes, tensor_dtype
from opforge.runtime.limits import check_memory

__all__ = ["GrowingMemory"]

log = logging.getLogger("opforge.runtime")


class GrowingMemory:
    """One buffer per growing tensor of one method instance; see the module docstring."""

    def __init__(self, api: str, method: MethodDef, limit: int) -> None:
        self.api = api
        self.method = method
        self.limit = limit
        self.growths = 0
        self._arenas = arena_bytes(method)
        self._dtypes = {}
        self.buffers: dict[int, np.ndarray] = {}
        indices = sorted(growing_values(method))
        for index in indices:
            value = method.values[index]
            self._dtypes[index] = tensor_dtype(api, f"method {method.name!r} values[{index}]",
                                               value)
        first = {i: max(method.values[i].nbytes, ALIGNMENT) for i in indices}
        check_memory(api, f"method {method.name!r} memory plan and growing tensors",
                     self._arenas + sum(first.values()), limit=limit)
        for index, nbytes in first.items():
            self.buffers[index] = _allocate(api, method, index, nbytes)

    @property
    def nbytes(self) -> int:
        """Bytes held by the growing buffers now."""
        return sum(b.nbytes for b in self.buffers.values())

    def ensure(self, sizes: dict[int, tuple[int, ...]], env: dict[str, int]) -> bool:
        """Make each growing tensor's buffer hold its ``sizes`` for this call; True when
        one grew (views over the old buffers are stale)."""
        needs = {}
        for index, buffer in self.buffers.items():
            need = math.prod(sizes[index]) * self._dtypes[index].itemsize
            if need > buffer.nbytes:
                needs[index] = need
        if not needs:
            return False
        others = self._arenas + sum(b.nbytes for i, b in self.buffers.items() if i not in needs)
        least = others + sum(needs.values())
        bound = ", ".join(f"{k}={v}" for k, v in sorted(env.items()))
        check_memory(
            self.api, f"method {self.method.name!r} growing tensors (values "
            f"{sorted(needs)}) at {bound}", least, limit=self.limit,
            fix="1. call with smaller sizes; 2. raise the memory limit: load(..., "
                "max_memory=N) or OPFORGE_MAX_MEMORY=N")
        spare = self.limit - least  # doubling where the limit allows, the bare need where not
        for index, need in sorted(needs.items()):
            extra = min(max(2 * self.buffers[index].nbytes - need, 0), spare)
            spare -= extra
            old = self.buffers[index].nbytes
            self.buffers[index] = _allocate(self.api, self.method, index, need + extra)
            self.growths += 1
            log.info("%s: method %r values[%d] grew from %d to %d bytes (%s)", self.api,
                     self.method.name, index, old, need + extra, bound)
        return True

    def view(self, index: int, value: TensorValue, sizes: tuple[int, ...]) -> np.ndarray:
        """The tensor ``index`` at ``sizes``, a view at the start of its buffer."""
        order = value.dim_order
        physical = tuple(sizes[d] for d in order)
        view = np.ndarray(physical, dtype=self._dtypes[index], buffer=self.buffers[index])
        if order != tuple(range(len(order))):
            view = view.transpose(np.argsort(order))
        return view


def _allocate(api: str, method: MethodDef, index: int, nbytes: int) -> np.ndarray:
    try:
        raw = np.zeros(nbytes + ALIGNMENT, dtype=np.uint8)
    except MemoryError:
        raise ProgramError(
            f"`{api}`: method {method.name!r} values[{index}] (a growing tensor) — needs "
            f"{nbytes} bytes, which the system could not allocate — valid: sizes that fit in "
            "free memory — fix: call with smaller sizes, or lower the memory limit "
            "(load(..., max_memory=N)) so that such calls are refused first") from None
    pad = -raw.ctypes.data % ALIGNMENT
    return raw[pad:pad + nbytes]
