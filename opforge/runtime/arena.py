"""Memory arenas and the run-time objects of a method's values.

Each ``Method`` instance owns one zero-filled NumPy byte buffer per arena of its memory
plan (``MemoryPlan.arena_sizes[mem_id]``), 64-byte aligned like the planner's offsets.
Their total is checked against the memory limit (``opforge.runtime.limits``: 8 GiB unless
``load(max_memory=...)`` or ``OPFORGE_MAX_MEMORY`` say otherwise) before anything is
allocated; the verifier has already bounded each arena by the tensors placed in it.
Every planned tensor becomes a NumPy view into its arena at its offset, made once; a
constant becomes a read-only view of the program's (memory-mapped) segment. The other
values become the Python objects the portable calling convention expects
(``opforge.kernels.portable``): ints, floats, bools, str, None, tuples for ``int[]``,
``float[]`` and ``bool[]``, lists of arrays for ``Tensor[]`` / ``Tensor?[]`` and a NumPy
dtype for a ``ScalarType``.
"""

from __future__ import annotations

import numpy as np

from opforge.errors import ProgramError
from opforge.program import (
    ArenaStorage, BoolListValue, BoolValue, ConstantStorage, DoubleListValue, DoubleValue,
    IntListValue, IntValue, Method, NoneValue, OptionalTensorListValue, Program,
    ScalarTypeValue, StringValue, TensorListValue, TensorValue, constant_array,
)
from opforge.runtime.limits import check_memory

__all__ = ["ALIGNMENT", "allocate_arenas", "arena_bytes", "ValueTable", "tensor_dtype"]

ALIGNMENT = 64  # the memory planner's alignment; a typed view needs only the itemsize

_SCALARS = (IntValue, DoubleValue, BoolValue, StringValue)
_LISTS = (IntListValue, DoubleListValue, BoolListValue)


def arena_bytes(method: Method) -> int:
    """What ``allocate_arenas`` allocates for ``method``: its arenas plus alignment slack."""
    sizes = method.memory_plan.arena_sizes
    return sum(sizes) + ALIGNMENT * len(sizes)


def allocate_arenas(method: Method, *, api: str = "opforge.runtime.Method",
                    limit: int | None = None) -> list[np.ndarray]:
    """One zero-filled, 64-byte aligned ``uint8`` buffer per arena of ``method``'s plan.

    ``ProgramError`` before allocating anything when the total exceeds ``limit`` (default:
    the current memory limit, ``opforge.runtime.limits.max_memory()``), or when the system
    cannot provide the memory: never a raw ``MemoryError``.
    """
    sizes = method.memory_plan.arena_sizes
    subject = f"method {method.name!r} memory plan ({len(sizes)} arena(s))"
    check_memory(api, subject, arena_bytes(method), limit=limit)
    arenas = []
    try:
        for size in sizes:
            raw = np.zeros(size + ALIGNMENT, dtype=np.uint8)
            pad = -raw.ctypes.data % ALIGNMENT
            arenas.append(raw[pad:pad + size])
    except MemoryError:
        arenas.clear()
        raise ProgramError(
            f"`{api}`: {subject} — needs {arena_bytes(method)} bytes, which the system could "
            "not allocate — valid: a plan that fits in free memory — fix: free memory, or "
            "lower the memory limit (load(..., max_memory=N) / OPFORGE_MAX_MEMORY) so that "
            "such programs are refused at load") from None
    return arenas


def tensor_dtype(api: str, where: str, tensor: TensorValue) -> np.dtype:
    """The NumPy dtype of ``tensor``; ProgramError naming ``where`` for BFLOAT16/COMPLEX32."""
    try:
        return tensor.dtype.numpy_dtype()
    except ProgramError as e:
        raise ProgramError(f"`{api}`: {where} — {e}") from None


class ValueTable:
    """The run-time object of each value of one method, made on first use and kept.

    ``get(i)`` is what a kernel receives for value ``i``; tensors are views (arena) or
    read-only views (constants), never copies.
    """

    def __init__(self, api: str, program: Program, method: Method,
                 arenas: list[np.ndarray], *, base: "ValueTable | None" = None,
                 dependent: frozenset[int] = frozenset(), growing=None,
                 objects: dict[int, object] | None = None) -> None:
        self._api = api
        self._program = program
        self._method = method
        self._arenas = arenas
        # ``objects``: objects already made (a per-shape table's views, runtime/rebinding.py)
        self._objects: dict[int, object] = {} if objects is None else objects
        # a per-shape table of a dynamic method: what does not depend on the symbols
        # (constants, static tensors, scalars) is the base table's object, made once
        self._base = base
        self._dependent = dependent
        self._growing = growing  # a GrowingMemory (runtime/growth.py): tensors outside arenas

    def get(self, index: int) -> object:
        obj = self._objects.get(index, _MISSING)
        if obj is _MISSING:
            if self._base is not None and index not in self._dependent:
                obj = self._objects[index] = self._base.get(index)
            else:
                obj = self._objects[index] = self._make(index)
        return obj

    def set_sizes(self, index: int, sizes: tuple[int, ...]) -> None:
        """Make value ``index`` at ``sizes``: a tensor's view of that shape in its slot, an
        ``int`` (one size) or an ``int[]``."""
        value = self._method.values[index]
        if type(value) is TensorValue:
            storage = value.storage
            if type(storage) is ArenaStorage and value.dim_order == _CONTIGUOUS[len(sizes)]:
                # the common case, per shape and per tensor: one ndarray, no checks redone
                self._objects[index] = np.ndarray(
                    sizes, _numpy_dtype(value.dtype), self._arenas[storage.mem_id],
                    storage.offset)
            elif storage is None and self._growing is not None and \
                    index in self._growing.buffers:
                self._objects[index] = self._growing.view(index, value, sizes)
            else:
                self._objects[index] = self._view(index, value, sizes)
        elif type(value) is IntValue:
            self._objects[index] = sizes[0]
        else:
            self._objects[index] = tuple(sizes)

    def set(self, index: int, obj: object) -> None:
        """Replace a scalar value's object (a scalar method input given at call time)."""
        self._objects[index] = obj

    def _make(self, index: int) -> object:
        value = self._method.values[index]
        kind = type(value)
        if kind is TensorValue:
            return self._tensor(index, value)
        if kind in _SCALARS:
            return value.value
        if kind is NoneValue:
            return None
        if kind in _LISTS:
            return tuple(value.values)
        if kind is TensorListValue:
            return [self.get(i) for i in value.items]
        if kind is OptionalTensorListValue:
            return [None if i is None else self.get(i) for i in value.items]
        if kind is ScalarTypeValue:
            where = f"method {self._method.name!r} values[{index}]"
            try:
                return value.dtype.numpy_dtype()
            except ProgramError as e:
                raise ProgramError(f"`{self._api}`: {where} — {e}") from None
        raise ProgramError(  # the verifier admits no other kinds; a new kind needs code here
            f"`{self._api}`: method {self._method.name!r} values[{index}] — found "
            f"{kind.__name__} — valid: the value kinds of opforge.program — "
            "fix: upgrade opforge"
        )

    def _tensor(self, index: int, value: TensorValue) -> np.ndarray:
        return self._view(index, value, value.sizes)

    def _view(self, index: int, value: TensorValue, sizes: tuple[int, ...]) -> np.ndarray:
        where = f"method {self._method.name!r} values[{index}]"
        dtype = tensor_dtype(self._api, where, value)
        storage = value.storage
        if type(storage) is ConstantStorage:
            return constant_array(self._program, value)
        if type(storage) is ArenaStorage:
            order = value.dim_order
            physical = tuple(sizes[d] for d in order)
            view = np.ndarray(physical, dtype=dtype, buffer=self._arenas[storage.mem_id],
                              offset=storage.offset)
            if order != tuple(range(len(order))):
                view = view.transpose(np.argsort(order))
            return view
        if value.nbytes == 0:  # the verifier lets zero-byte tensors go unplanned
            return np.empty(sizes, dtype=dtype)
        raise ProgramError(
            f"`{self._api}`: {where} — a tensor of {value.nbytes} bytes without storage — "
            "valid: every tensor with bytes planned into an arena or stored as a constant — "
            "fix: export with memory planning (the default)"
        )


_MISSING = object()
_CONTIGUOUS = tuple(tuple(range(rank)) for rank in range(65))
_DTYPES: dict = {}


def _numpy_dtype(scalar_type) -> np.dtype:
    dtype = _DTYPES.get(scalar_type)
    if dtype is None:
        dtype = _DTYPES[scalar_type] = scalar_type.numpy_dtype()
    return dtype
