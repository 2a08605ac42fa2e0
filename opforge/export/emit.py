"""Emission: planned method graphs → one ``opforge.program.Program``.

Per method: a value table (every tensor with dtype, sizes, contiguous dim order and its
storage: arena slot from the memory plan or constant segment offset; scalars, lists and
None for the other arguments, identical ones shared), one ``KernelCall`` per out-variant
call with its arguments in the out overload's schema order (outputs and defaults
included), the operator table (each operator once, in order of first use), inputs,
outputs and the memory plan. Constants of all methods go into one segment, 64-byte
aligned, each distinct tensor once (keyed by content, see ``LiftConstants``).
"""

from __future__ import annotations

import json
from typing import Any, Sequence

import torch
import torch.fx

from opforge.errors import ExportError, InternalError
from opforge.export.argument_values import argument_value, python_value, scalar_type_of
from opforge.export.memory_planning import DEFAULT_ALIGNMENT, align_up
from opforge.export.method_graph import InputKind, MethodGraph, is_alloc, is_size_read
from opforge.export.out_variants import bind_arguments
from opforge.export.delegation import METADATA_KEY
from opforge.backends.named_data import check_layouts
from opforge.export.lowered import DelegateOut
from opforge.export.debug_table import DebugTable
from opforge.program.debug import DEBUG_KEY, DebugInfo
from opforge.program import (
    PACKING_SPLAT, ArenaStorage, ConstantStorage, DelegateBlob, DelegateCall, IntValue, KernelCall, MemoryPlan, Method, Move,
    NamedData, Operator, Program,
    Segment, StateSlot, SymbolicValue, TensorValue, Value,
)

__all__ = ["emit_program", "ConstantPool"]


class ConstantPool:
    """The program's constant segment: each distinct tensor once, 64-byte aligned.

    Holds a view of each tensor until ``segments`` copies them, once, into the segment
    (a model's weights are not copied twice: no bytes per tensor, then a join)."""

    def __init__(self) -> None:
        self._offsets: dict[str, int] = {}
        self._chunks: list[tuple[int, memoryview]] = []  # (offset, bytes) per tensor
        self._size = 0

    def offset(self, key: str, tensor: torch.Tensor) -> int:
        if key not in self._offsets:
            start = align_up(self._size, DEFAULT_ALIGNMENT)
            data = memoryview(tensor.contiguous().view(-1).view(torch.uint8).numpy()) \
                if tensor.numel() else memoryview(b"")
            self._chunks.append((start, data))
            self._offsets[key] = start
            self._size = start + data.nbytes
        return self._offsets[key]

    def splat_offset(self, key: str, tensor: torch.Tensor) -> int:
        """Where the one element of a uniform ``tensor`` (see ``uniform``) is stored."""
        return self.offset("splat:" + key, tensor.reshape(-1)[:1])

    def segments(self) -> tuple[Segment, ...]:
        if not self._offsets:
            return ()
        segment = bytearray(self._size)  # zeros: the padding between tensors
        for start, data in self._chunks:
            segment[start:start + data.nbytes] = data
        self._chunks = []
        return (Segment(segment),)


def uniform(tensor: torch.Tensor) -> bool:
    """Whether every element of ``tensor`` (two or more) has the first one's bytes: a state
    initial value stored as a splat (``PACKING_SPLAT``; a zeroed KV cache costs the program
    one element and the runtime no resident memory until it is written)."""
    if tensor.numel() < 2:
        return False
    rows = tensor.contiguous().view(-1).view(torch.uint8).view(tensor.numel(), -1)
    return bool((rows == rows[0]).all())


class _Delegates:
    """The program's delegate blobs, each a segment after the constant segment, then the
    named data they refer to: one segment per distinct key, whichever blobs name it."""

    def __init__(self) -> None:
        self.blobs: list[tuple[str, bytes, tuple]] = []
        self.index: dict[int, int] = {}
        self.named: dict[str, bytes] = {}
        self.lowered: list[Any] = []

    def add(self, lowered: Any) -> int:
        if id(lowered) not in self.index:
            self.blobs.append((lowered.backend, lowered.blob, lowered.specs))
            self.index[id(lowered)] = len(self.blobs) - 1
            self.lowered.append(lowered)
            getattr(lowered, "report", {})["delegate"] = len(self.blobs) - 1
            for key, data in getattr(lowered, "named_data", {}).items():
                self.named.setdefault(key, data)  # keys are content addresses
        return self.index[id(lowered)]

    def finish(self, first_segment: int) -> tuple[tuple[Segment, ...], tuple[DelegateBlob, ...],
                                                  tuple[NamedData, ...]]:
        segments = tuple(Segment(blob) for _, blob, _ in self.blobs)
        delegates = tuple(DelegateBlob(backend, first_segment + i, specs)
                          for i, (backend, _, specs) in enumerate(self.blobs))
        check_layouts((f"delegate {self.index[id(lowered)]} ({lowered.backend!r})",
                       getattr(lowered, "named_layouts", {})) for lowered in self.lowered)
        first_named = first_segment + len(segments)
        named = tuple(NamedData(key, first_named + i) for i, key in enumerate(self.named))
        return segments + tuple(Segment(data) for data in self.named.values()), delegates, named


class _MethodEmitter:
    def __init__(self, method: MethodGraph, pool: ConstantPool, delegates: _Delegates,
                 state_names: frozenset[str] = frozenset()) -> None:
        self.method = method
        self.state_names = state_names
        self.pool = pool
        self.delegates = delegates
        self.values: list[Value] = []
        self.node_index: dict[str, int] = {}
        self.shared: dict[tuple[str, str], int] = {}
        self.operators: list[Operator] = []
        self.operator_index: dict[str, int] = {}
        self.plan = method.notes["memory_plan"]
        self.symbolic: list[SymbolicValue] = []
        self.debug = DebugTable(method.notes.get("debug_nodes", {}))

    def add_value(self, value: Value) -> int:
        key = (type(value).__name__, repr(value))
        if key not in self.shared:
            self.values.append(value)
            self.shared[key] = len(self.values) - 1
        return self.shared[key]

    def tensor_index(self, node: torch.fx.Node) -> int:
        index = self.node_index.get(node.name)
        if index is None:
            raise InternalError(f"emit: node {node.name} used before it was emitted")
        return index

    def _is_state(self, placeholder: str) -> bool:
        notes = self.method.notes
        return placeholder in notes.get("state", {}) or \
            notes.get("buffer_names", {}).get(placeholder) in self.state_names

    def _tensor(self, node: torch.fx.Node) -> int:
        fake = node.meta["val"]
        kind = self.method.input_kinds.get(node.name, InputKind.USER) if node.op == "placeholder" else None
        if kind not in (None, InputKind.USER):
            key = self.method.notes["constant_keys"][node.name]
            tensor = self.method.constants[node.name]
            if self._is_state(node.name) and uniform(tensor):
                storage = ConstantStorage(0, self.pool.splat_offset(key, tensor), PACKING_SPLAT)
            else:
                storage = ConstantStorage(0, self.pool.offset(key, tensor))
        table = self.method.notes.get("symbols")
        symbolic = table and any(not isinstance(s, int) for s in fake.shape)
        grows = kind in (None, InputKind.USER) and symbolic and table.grows(fake)
        sizes = (table.hint_sizes(fake) if grows  # its first allocation; grown by the runtime
                 else table.upper_sizes(fake) if symbolic else tuple(int(s) for s in fake.shape))
        if grows:
            storage = None
        elif kind in (None, InputKind.USER):
            slot = self.plan.allocations[node.name]
            storage = ArenaStorage(slot.mem_id, slot.offset)
        value = TensorValue(scalar_type_of(fake.dtype), sizes, None, storage)
        self.values.append(value)
        self.node_index[node.name] = len(self.values) - 1
        if symbolic:
            exprs = tuple(table.expr_of(s) for s in fake.shape)
            self.symbolic.append(SymbolicValue(len(self.values) - 1, exprs))
        return self.node_index[node.name]

    def add_symbolic(self, value: Value, exprs: tuple) -> int:
        """A value whose ints are sizes computed per call: never shared with another."""
        self.values.append(value)
        self.symbolic.append(SymbolicValue(len(self.values) - 1, exprs))
        return len(self.values) - 1

    def _operator(self, op: Any) -> int:
        name = op._schema.name
        overload = op._schema.overload_name
        key = f"{name}.{overload}" if overload else name
        if key not in self.operator_index:
            self.operators.append(Operator(name, overload))
            self.operator_index[key] = len(self.operators) - 1
        return self.operator_index[key]

    def _kernel_call(self, node: torch.fx.Node) -> KernelCall:
        schema = node.target._schema
        bound = bind_arguments(schema, node.args, node.kwargs)
        args = []
        for arg in schema.arguments:
            if arg.name in bound:
                value = bound[arg.name]
            elif arg.has_default_value():
                value = arg.default_value
            else:
                raise InternalError(f"emit: {node.name} lacks argument {arg.name} of {schema}")
            args.append(argument_value(arg, value, self.tensor_index, self.add_value,
                                       self.add_symbolic))
        return KernelCall(self._operator(node.target), tuple(args))

    def emit(self) -> Method:
        instructions = []
        inputs = []
        for node in self.method.graph.nodes:
            if node.op == "placeholder":
                if isinstance(node.meta.get("val"), torch.Tensor):
                    index = self._tensor(node)
                else:  # a scalar user input
                    self.values.append(python_value(node.meta.get("val")))
                    index = self.node_index[node.name] = len(self.values) - 1
                if self.method.input_kinds[node.name] == InputKind.USER:
                    inputs.append(index)
            elif is_alloc(node):
                self._tensor(node)
            elif node.op == "call_function" and isinstance(node.target, DelegateOut):
                lowered = node.target.lowered
                index = self.delegates.add(lowered)
                instructions.append(DelegateCall(index, tuple(self.tensor_index(a) for a in node.args)))
                outs = node.args[lowered.num_inputs:]
                self.debug.delegate(len(instructions) - 1, index, lowered,
                                    [self.tensor_index(o) for o in outs])
            elif is_size_read(node):  # item() as a size: a Move into an int produces it
                table = self.method.notes["symbols"]
                expr = table.expr_of(node.meta["val"])
                dst = self.add_symbolic(IntValue(table.hint(expr)), (expr,))
                instructions.append(Move(self.tensor_index(node.args[0]), dst))
            elif node.op == "call_function":
                instructions.append(self._kernel_call(node))
                self.debug.kernel_call(len(instructions) - 1, node, self.tensor_index)
        state_outputs = self.method.notes.get("state_outputs", {})
        outputs = []
        for position, v in enumerate(self.method.output_args()):
            if position in state_outputs:  # the new value of a state tensor: copied in place
                dst = self.node_index[state_outputs[position]]
                src = self.tensor_index(v)
                if src != dst:  # equal: written in place (passes/update_state_in_place.py)
                    instructions.append(Move(src, dst))
            else:
                outputs.append(self._output(v))
        written = self.method.notes.get("state", {})
        read = {p: name for p, name in self.method.notes.get("buffer_names", {}).items()
                if name in self.state_names and p not in written and p in self.node_index}
        state = tuple(StateSlot(name, self.node_index[placeholder])
                      for placeholder, name in {**written, **read}.items())
        table = self.method.notes.get("symbols")
        return Method(
            name=self.method.name,
            values=tuple(self.values),
            inputs=tuple(inputs),
            outputs=tuple(outputs),
            instructions=tuple(instructions),
            operators=tuple(self.operators),
            memory_plan=MemoryPlan(tuple(self.plan.arena_sizes)),
            symbols=tuple(table.symbols) if table else (),
            symbolic_values=tuple(self.symbolic),
            guards=tuple(dict.fromkeys(table.guards)) if table else (),
            state=state,
        )

    def _output(self, value: Any) -> int:
        if isinstance(value, torch.fx.Node):
            return self.tensor_index(value)
        if isinstance(value, (bool, int, float)):
            self.values.append(python_value(value))
            return len(self.values) - 1
        raise ExportError(
            f"`opforge.export.export()`: method {self.method.name!r} output {value!r} — "
            f"found {type(value).__name__} — valid: tensors, ints, floats, bools — "
            "fix: return only tensors (drop None and string outputs)"
        )


def emit_program(methods: Sequence[MethodGraph], *, user_metadata: dict[str, str] | None = None,
                 debug_handles: bool = True) -> Program:
    """Emit planned methods as one Program (not yet verified; ``export`` verifies it).

    ``debug_handles`` writes the debug table (``opforge/program/debug.py``) into the user
    metadata."""
    pool = ConstantPool()
    delegates = _Delegates()
    # a buffer one method updates is state in every method that reads it (shared by name)
    state_names = frozenset(name for m in methods for name in m.notes.get("state", {}).values())
    emitters = [_MethodEmitter(method, pool, delegates, state_names) for method in methods]
    emitted = tuple(e.emit() for e in emitters)
    constants = pool.segments()
    blob_segments, blobs, named = delegates.finish(len(constants))
    metadata = dict(user_metadata or {})
    report = {m.name: m.notes["delegation"] for m in methods if "delegation" in m.notes}
    if report:
        metadata[METADATA_KEY] = json.dumps(report, sort_keys=True, separators=(",", ":"))
    if debug_handles:
        info = DebugInfo({e.method.name: e.debug.finish() for e in emitters})
        metadata[DEBUG_KEY] = info.to_text()
    return Program(methods=emitted, segments=constants + blob_segments, delegates=blobs,
                   named_data=named,
                   user_metadata=metadata)
