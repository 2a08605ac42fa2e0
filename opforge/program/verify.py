"""The program verifier: every cross-reference checked before anything uses it.

The dataclasses check their own fields on construction (types, non-negative sizes, the
2**48-byte cap, dim orders). ``verify`` checks what needs the whole program:

* each method name is unique; each operator appears once in its method's table;
* every value index (inputs, outputs, instruction args, tensor-list items, Move, Free) is in
  range and refers to the right kind of value; every operator and delegate index is in range;
* every named datum's segment index is in range and its key unique;
* every planned tensor lies inside its arena (``offset + nbytes <= arena_sizes[mem_id]``) and
  every constant inside its segment, at an offset that is a multiple of its itemsize (the
  planner uses 64; itemsize alignment is what a typed view needs, so that is the rule);
* no arena is larger than its tensors need: ``arena_sizes[mem_id] <= max(align_up(end, g),
  4096)``, ``end`` the highest ``offset + nbytes`` placed in it (0 for an arena nobody
  uses) and ``g`` the alignment its placements share, at least 64 and at most 4096 (the
  planner rounds each arena up to the alignment it placed at: 64 unless export was told
  otherwise); an arena of one page or less is always accepted (hand-built programs round
  generously; 4 KiB is nothing to a runtime). An arena is memory the runtime allocates, so
  a 200-byte file cannot ask for a terabyte of it; what the tensors themselves ask for is
  bounded by the runtime's memory limit (``opforge.runtime.limits``), checked at load;
* a tensor without storage has no bytes, unless the caller allows unplanned tensors;
* inputs and outputs are tensors or scalars, inputs are not constants (they are written),
  and no Move writes into a constant (constants are read-only mapped memory) unless the
  constant is a state tensor's initial value (the runtime writes the live copy);
* a splat constant (one element stored, format version 5) is a state's initial value: the
  runtime makes a dense live copy, so no kernel ever reads the splat itself;
* symbolic sizes, growing tensors and state: ``verify_symbolic.py``; a growing tensor
  (``growing_values``) has no storage;
* the debug handles (user metadata ``opforge.debug``, when present): ``debug.py``.

Cost is linear in the size of the tables; a program with thousands of instructions takes
milliseconds.
"""

from __future__ import annotations

from opforge.errors import ProgramError
from opforge.program._errors import program_error, with_api
from opforge.program.debug import DEBUG_KEY, check_debug_table
from opforge.program.model import (
    INSTRUCTION_TYPES, DelegateCall, Free, KernelCall, Method, Move, NamedData, Operator, Program,
    Segment, DelegateBlob,
)
from opforge.program.symbolic import growing_values
from opforge.program.verify_symbolic import state_values, verify_shared_state, verify_symbolic
from opforge.program.values import (
    PACKING_SPLAT, VALUE_TYPES, ArenaStorage, BoolValue, ConstantStorage, DoubleValue, IntValue,
    OptionalTensorListValue, TensorListValue, TensorValue,
)

__all__ = ["verify"]

_IO_TYPES = (TensorValue, IntValue, DoubleValue, BoolValue)
_DANGLING = "the exporter wrote a dangling reference: re-export the model"


def verify(program: Program, *, allow_unplanned: bool = False) -> None:
    """Raise ProgramError naming the first broken reference in ``program``.

    ``allow_unplanned`` accepts tensors with ``storage=None`` that have bytes (the runtime
    must then allocate them); zero-byte tensors never need storage.

    >>> from opforge.program import Program, Method, IntValue
    >>> verify(Program(methods=(Method("forward", (IntValue(3),), (0,), (0,), ()),)))
    """
    try:
        check_program(program, allow_unplanned)
    except ProgramError as e:
        raise with_api("opforge.program.verify()", e) from None


def _kind(value: object) -> str:
    name = type(value).__name__
    return f"{'an' if name[0] in 'AEIOU' else 'a'} {name}"


def _index(subject: str, index: object, count: int, what: str) -> None:
    if type(index) is not int or not 0 <= index < count:
        valid = f"0..{count - 1} ({count} {what}s)" if count else f"none (there are no {what}s)"
        raise program_error(subject, f"{what} index {index!r}", valid, _DANGLING)


def check_program(program: Program, allow_unplanned: bool) -> None:
    """``verify`` without the API prefix, for ``load``/``save``/... to report as their own."""
    if not isinstance(program, Program):
        raise program_error("program", type(program).__name__, "an opforge.program.Program")
    for i, segment in enumerate(program.segments):
        if not isinstance(segment, Segment):
            raise program_error(f"segments[{i}]", type(segment).__name__, "a Segment")
    for i, blob in enumerate(program.delegates):
        if not isinstance(blob, DelegateBlob):
            raise program_error(f"delegates[{i}]", type(blob).__name__, "a DelegateBlob")
        _index(f"delegates[{i}] ({blob.id!r}).segment", blob.segment, len(program.segments),
               "segment")
    keys: dict[str, int] = {}
    for i, named in enumerate(program.named_data):
        if not isinstance(named, NamedData):
            raise program_error(f"named_data[{i}]", type(named).__name__, "a NamedData")
        _index(f"named_data[{i}] ({named.key!r}).segment", named.segment,
               len(program.segments), "segment")
        if named.key in keys:
            raise program_error(f"named_data[{i}].key", f"{named.key!r}, already the key of "
                                f"named_data[{keys[named.key]}]", "unique keys", _DANGLING)
        keys[named.key] = i
    names: dict[str, int] = {}
    for i, method in enumerate(program.methods):
        if not isinstance(method, Method):
            raise program_error(f"methods[{i}]", type(method).__name__, "a Method")
        if method.name in names:
            raise program_error(
                f"methods[{i}].name", f"{method.name!r}, already the name of "
                f"methods[{names[method.name]}]", "unique method names", "rename one method",
            )
        names[method.name] = i
        _verify_method(program, method, f"method {method.name!r}", allow_unplanned)
    verify_shared_state(program)
    if any(key == DEBUG_KEY for key, _ in program.user_metadata):
        check_debug_table(program)  # the debug handles' indices (opforge/program/debug.py)


ARENA_ALIGNMENT = 64  # the memory planner's default alignment (opforge.export)
MAX_ARENA_ALIGNMENT = 4096  # the most an arena may be rounded up to (a page)
ARENA_ALLOWANCE = 4096  # any arena up to one page is accepted, used or not


def align_up(value: int, alignment: int) -> int:
    return -(-value // alignment) * alignment


def _verify_method(program: Program, method: Method, where: str, allow_unplanned: bool) -> None:
    values = method.values
    n = len(values)
    arenas = method.memory_plan.arena_sizes
    ends = [0] * len(arenas)  # per arena: the highest offset + nbytes placed in it
    offsets = [0] * len(arenas)  # per arena: every offset OR'ed (its lowest bit: alignment)
    growing = growing_values(method)  # unplanned by design: the runtime grows them
    for i, value in enumerate(values):
        kind = type(value)
        if kind is TensorValue:
            _verify_tensor(program, arenas, value, f"{where} values[{i}]",
                           allow_unplanned or i in growing)
            storage = value.storage
            if type(storage) is ConstantStorage and storage.packing == PACKING_SPLAT and \
                    i not in state_values(method):
                raise program_error(
                    f"{where} values[{i}].storage", "a splat constant that is no state's "
                    "initial value", "splat storage only for a state tensor's initial value "
                    "(kernels read constants as dense tensors)", _DANGLING)
            if type(storage) is ArenaStorage:
                ends[storage.mem_id] = max(ends[storage.mem_id], storage.offset + value.nbytes)
                offsets[storage.mem_id] |= storage.offset
        elif kind is TensorListValue or kind is OptionalTensorListValue:
            for j, item in enumerate(value.items):
                if item is None and kind is OptionalTensorListValue:
                    continue
                _index(f"{where} values[{i}].items[{j}]", item, n, "value")
                if type(values[item]) is not TensorValue:
                    raise program_error(
                        f"{where} values[{i}].items[{j}]",
                        f"value {item}, {_kind(values[item])}",
                        "the index of a TensorValue", _DANGLING)
        elif kind not in VALUE_TYPES:
            raise program_error(f"{where} values[{i}]", kind.__name__,
                                ", ".join(t.__name__ for t in VALUE_TYPES))
    for field in ("inputs", "outputs"):
        seen = set()
        for j, index in enumerate(getattr(method, field)):
            _index(f"{where} {field}[{j}]", index, n, "value")
            value = values[index]
            if not isinstance(value, _IO_TYPES):
                raise program_error(
                    f"{where} {field}[{j}]", f"value {index}, {_kind(value)}",
                    "a TensorValue, IntValue, DoubleValue or BoolValue", _DANGLING)
            if field == "inputs":
                if index in seen:
                    raise program_error(f"{where} inputs[{j}]", f"value {index} a second time",
                                        "each input once", _DANGLING)
                if type(value) is TensorValue and type(value.storage) is ConstantStorage:
                    raise program_error(
                        f"{where} inputs[{j}]", f"value {index}, a constant tensor",
                        "arena or unplanned tensors (inputs are written by the caller)",
                        _DANGLING)
                seen.add(index)
    keys: dict[str, int] = {}
    for j, op in enumerate(method.operators):
        if not isinstance(op, Operator):
            raise program_error(f"{where} operators[{j}]", type(op).__name__, "an Operator")
        if op.key in keys:
            raise program_error(
                f"{where} operators[{j}]", f"{op.key!r}, already operators[{keys[op.key]}]",
                "each operator once per table", _DANGLING)
        keys[op.key] = j
    _verify_instructions(program, method, where)
    _verify_arena_sizes(arenas, ends, offsets, where)
    if method.symbols or method.symbolic_values or method.guards or method.state:
        verify_symbolic(method, where)


def _verify_arena_sizes(arenas: tuple[int, ...], ends: list[int], offsets: list[int],
                        where: str) -> None:
    for mem_id, (size, end, bits) in enumerate(zip(arenas, ends, offsets)):
        shared = bits & -bits if bits else MAX_ARENA_ALIGNMENT  # 2**k dividing every offset
        alignment = min(max(shared, ARENA_ALIGNMENT), MAX_ARENA_ALIGNMENT)
        needed = max(align_up(end, alignment), ARENA_ALLOWANCE)
        if size > needed:
            placed = (f"its tensors end at byte {end}" if end else "no tensor is placed in it")
            raise program_error(
                f"{where} memory_plan.arena_sizes[{mem_id}]",
                f"{size} bytes, but {placed}",
                f"at most {needed} bytes (the end of its last tensor rounded up to "
                f"{alignment}, or {ARENA_ALLOWANCE}): an arena is what its tensors need",
                "re-export the model; a plan larger than its tensors was altered or corrupted")


def _verify_tensor(program: Program, arenas: tuple[int, ...], value: TensorValue, where: str,
                   allow_unplanned: bool) -> None:
    storage = value.storage
    nbytes = value.stored_nbytes  # ceil(numel / 2) for an int4-packed constant
    itemsize = value.dtype.itemsize
    if storage is None:
        if nbytes and not allow_unplanned:
            raise program_error(
                f"{where}.storage", f"None for a tensor of {nbytes} bytes",
                "ArenaStorage or ConstantStorage (only zero-byte tensors may be unplanned)",
                "run the memory-planning pass, or verify with allow_unplanned=True")
        return
    if type(storage) is ArenaStorage:
        _index(f"{where}.storage.mem_id", storage.mem_id, len(arenas), "arena")
        region, limit = f"arena {storage.mem_id}", arenas[storage.mem_id]
    else:
        _index(f"{where}.storage.segment", storage.segment, len(program.segments), "segment")
        region = f"segment {storage.segment}"
        limit = program.segments[storage.segment].nbytes
    if storage.offset % itemsize:
        raise program_error(
            f"{where}.storage.offset", f"{storage.offset} in {region}",
            f"a multiple of the {value.dtype.name.lower()} itemsize {itemsize}",
            "align placements (the memory planner uses 64)")
    if storage.offset + nbytes > limit:
        raise program_error(
            f"{where}.storage", f"bytes [{storage.offset}, {storage.offset + nbytes}) "
            f"({value.dtype.name.lower()}{list(value.sizes)})",
            f"within {region}, which has {limit} bytes", _DANGLING)


def _verify_instructions(program: Program, method: Method, where: str) -> None:
    values = method.values
    n, n_ops, n_delegates = len(values), len(method.operators), len(program.delegates)
    for i, ins in enumerate(method.instructions):
        kind = type(ins)
        at = f"{where} instructions[{i}]"
        if kind is KernelCall:
            _index(f"{at} (KernelCall).op", ins.op, n_ops, "operator")
            args = ins.args
        elif kind is DelegateCall:
            _index(f"{at} (DelegateCall).delegate", ins.delegate, n_delegates, "delegate")
            args = ins.args
        elif kind is Move:
            _index(f"{at} (Move).src", ins.src, n, "value")
            _index(f"{at} (Move).dst", ins.dst, n, "value")
            dst = values[ins.dst]
            if type(dst) is TensorValue and type(dst.storage) is ConstantStorage and (
                    ins.dst not in state_values(method)):
                raise program_error(f"{at} (Move).dst", f"value {ins.dst}, a constant tensor",
                                    "a writable value", _DANGLING)
            continue
        elif kind is Free:
            _index(f"{at} (Free).value", ins.value, n, "value")
            if type(values[ins.value]) is not TensorValue:
                raise program_error(f"{at} (Free).value",
                                    f"value {ins.value}, {_kind(values[ins.value])}",
                                    "a TensorValue", _DANGLING)
            continue
        else:
            raise program_error(at, kind.__name__,
                                ", ".join(t.__name__ for t in INSTRUCTION_TYPES))
        for j, arg in enumerate(args):
            if type(arg) is not int or not 0 <= arg < n:
                _index(f"{at} ({kind.__name__}).args[{j}]", arg, n, "value")
