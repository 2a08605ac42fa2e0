"""The program model: plain, index-based, frozen dataclasses.

    Program ─ methods ─► Method ─ values        (the value table; everything points here)
            │                   ├ inputs/outputs (value indices)
            │                   ├ instructions   (KernelCall / DelegateCall / Move / Free)
            │                   ├ operators      (the operator table KernelCall.op indexes)
            │                   ├ memory_plan    (arena sizes; placements live on TensorValue)
            │                   ├ symbols, symbolic_values, guards  (dynamic shapes, version 3)
            │                   └ state          (state tensors by name, version 3)
            ├ segments ──► Segment (raw bytes: constant weights, delegate blobs)
            ├ delegates ─► DelegateBlob (backend id, segment index, compile specs)
            ├ named_data ► NamedData (key → segment: data delegate blobs share, version 6)
            └ user_metadata (str → str pairs)

Nothing here refers to anything by Python reference: a C runtime can execute the same
tables. Construction checks local invariants; ``verify`` checks the cross-references.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Union

from opforge.program._errors import program_error
from opforge.program.symbolic import MAX_SYMBOLS, Guard, StateSlot, Symbol, SymbolicValue
from opforge.program.values import MAX_TENSOR_BYTES, Value, _as_tuple, _check_int

__all__ = [
    "Operator", "KernelCall", "DelegateCall", "Move", "Free", "Instruction",
    "INSTRUCTION_TYPES", "MemoryPlan", "Method", "Segment", "DelegateBlob", "NamedData", "Program",
]

_OP_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*::[A-Za-z_][A-Za-z0-9_]*\Z")
_OVERLOAD = re.compile(r"[A-Za-z0-9_]*\Z")


@dataclass(frozen=True, slots=True)
class Operator:
    """An entry of a method's operator table: ``name`` ("ns::op") and its ``overload``.

    ``overload`` is the overload name exactly as the schema writes it ("" for none, which
    torch calls ``.default``); ``key`` is what kernel registries are keyed by.

    >>> Operator("aten::add", "out").key
    'aten::add.out'
    >>> Operator("my_ops::relu6", "").key
    'my_ops::relu6'
    """

    name: str
    overload: str = ""

    def __post_init__(self) -> None:
        if type(self.name) is not str or not _OP_NAME.match(self.name):
            raise program_error(
                "`Operator`: name", repr(self.name), "'namespace::op' of identifier characters",
            )
        if type(self.overload) is not str or not _OVERLOAD.match(self.overload):
            raise program_error(
                "`Operator`: overload", repr(self.overload), "letters, digits and '_' (may be '')",
            )

    @property
    def key(self) -> str:
        """The registry key, "ns::op.overload" (or "ns::op" without an overload)."""
        return f"{self.name}.{self.overload}" if self.overload else self.name


@dataclass(frozen=True, slots=True)
class KernelCall:
    """Call ``operators[op]``'s out variant; ``args`` are value indices in schema order,
    out arguments included."""

    op: int
    args: tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "args", _as_tuple("KernelCall", "args", self.args))


@dataclass(frozen=True, slots=True)
class DelegateCall:
    """Run ``Program.delegates[delegate]`` on ``args`` (value indices, inputs then outputs)."""

    delegate: int
    args: tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "args", _as_tuple("DelegateCall", "args", self.args))


@dataclass(frozen=True, slots=True)
class Move:
    """Copy value ``src`` into value ``dst`` (e.g. a method output that aliases an input)."""

    src: int
    dst: int


@dataclass(frozen=True, slots=True)
class Free:
    """The tensor ``value`` is dead from here on (a hint for runtimes that allocate)."""

    value: int


Instruction = Union[KernelCall, DelegateCall, Move, Free]
INSTRUCTION_TYPES: tuple[type, ...] = Instruction.__args__


@dataclass(frozen=True, slots=True)
class MemoryPlan:
    """Arena sizes in bytes, indexed by ``ArenaStorage.mem_id`` (0 = activations)."""

    arena_sizes: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        sizes = _as_tuple("MemoryPlan", "arena_sizes", self.arena_sizes)
        object.__setattr__(self, "arena_sizes", sizes)
        for i, size in enumerate(sizes):
            _check_int("MemoryPlan", f"arena_sizes[{i}]", size, 0, MAX_TENSOR_BYTES)


@dataclass(frozen=True, slots=True)
class Method:
    """One entry point of a program (e.g. "forward"): a flat, index-based instruction list.

    A method with dynamic shapes declares ``symbols``, the sizes of the values that depend on
    them (``symbolic_values``; the values themselves hold their sizes at the upper bound) and
    the ``guards`` every call must meet. ``state`` names the constants that are program state
    (``opforge.program.symbolic``).
    """

    name: str
    values: tuple[Value, ...]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    instructions: tuple[Instruction, ...]
    operators: tuple[Operator, ...] = ()
    memory_plan: MemoryPlan = field(default_factory=MemoryPlan)
    symbols: tuple[Symbol, ...] = ()
    symbolic_values: tuple[SymbolicValue, ...] = ()
    guards: tuple[Guard, ...] = ()
    state: tuple[StateSlot, ...] = ()

    def __post_init__(self) -> None:
        if type(self.name) is not str or not self.name:
            raise program_error("`Method`: name", repr(self.name), "a non-empty str")
        for name in ("values", "inputs", "outputs", "instructions", "operators", "symbols",
                     "symbolic_values", "guards", "state"):
            object.__setattr__(self, name, _as_tuple("Method", name, getattr(self, name)))
        for name, kind in (("symbols", Symbol), ("symbolic_values", SymbolicValue),
                           ("guards", Guard), ("state", StateSlot)):
            for i, item in enumerate(getattr(self, name)):
                if type(item) is not kind:
                    raise program_error(f"`Method`: {name}[{i}]", type(item).__name__,
                                        f"a {kind.__name__}")
        if len(self.symbols) > MAX_SYMBOLS:
            raise program_error("`Method`: symbols", str(len(self.symbols)),
                                f"at most {MAX_SYMBOLS}")
        if not isinstance(self.memory_plan, MemoryPlan):
            raise program_error(
                "`Method`: memory_plan", type(self.memory_plan).__name__, "a MemoryPlan",
            )


@dataclass(frozen=True, slots=True)
class Segment:
    """Raw bytes stored 64-byte aligned in the file: constant weights or a delegate blob.

    ``data`` becomes a read-only byte memoryview; after ``load`` it points into the
    memory-mapped file (nothing is copied).

    >>> Segment(b"abc").nbytes
    3
    """

    data: memoryview

    def __post_init__(self) -> None:
        try:
            view = memoryview(self.data)
            view = view.cast("B") if view.format != "B" or view.ndim != 1 else view
        except TypeError as e:
            raise program_error(
                "`Segment`: data", type(self.data).__name__,
                "a C-contiguous bytes-like object (bytes, bytearray, numpy array)",
            ) from e
        object.__setattr__(self, "data", view.toreadonly())

    @property
    def nbytes(self) -> int:
        """Length of the segment in bytes."""
        return self.data.nbytes


@dataclass(frozen=True, slots=True)
class DelegateBlob:
    """A backend's preprocessed subgraph: backend ``id``, its bytes in ``segments[segment]``,
    and the compile specs it was built with, as ``(key, value bytes)`` pairs."""

    id: str
    segment: int
    compile_specs: tuple[tuple[str, bytes], ...] = ()

    def __post_init__(self) -> None:
        if type(self.id) is not str or not self.id:
            raise program_error("`DelegateBlob`: id", repr(self.id), "a non-empty backend id")
        _check_int("DelegateBlob", "segment", self.segment, 0, 2**32 - 1)
        specs = []
        for i, spec in enumerate(_as_tuple("DelegateBlob", "compile_specs", self.compile_specs)):
            if not (isinstance(spec, tuple) and len(spec) == 2 and type(spec[0]) is str
                    and isinstance(spec[1], (bytes, bytearray, memoryview))):
                raise program_error(
                    f"`DelegateBlob`: compile_specs[{i}]", repr(spec), "a (str, bytes) pair",
                )
            specs.append((spec[0], bytes(spec[1])))
        object.__setattr__(self, "compile_specs", tuple(specs))


MAX_NAMED_KEY = 256  # characters of a NamedData key


@dataclass(frozen=True, slots=True)
class NamedData:
    """Bytes stored once for every delegate blob that names them (weights a prefill and a
    decode method's delegates both read): ``key`` (what a blob refers to) → ``segment``.

    >>> NamedData("sha256:00ff", 3).segment
    3
    """

    key: str
    segment: int

    def __post_init__(self) -> None:
        if type(self.key) is not str or not 0 < len(self.key) <= MAX_NAMED_KEY \
                or not self.key.isprintable():
            raise program_error("`NamedData`: key", repr(self.key)[:80],
                                f"a printable string of 1 to {MAX_NAMED_KEY} characters")
        _check_int("NamedData", "segment", self.segment, 0, 2**32 - 1)


@dataclass(frozen=True, slots=True)
class Program:
    """A whole program: methods, constant/delegate segments, delegates and user metadata.

    >>> from opforge.program import Program, Method
    >>> p = Program(methods=(Method("forward", (), (), (), ()),), user_metadata={"k": "v"})
    >>> p.method("forward").name, p.user_metadata
    ('forward', (('k', 'v'),))
    """

    methods: tuple[Method, ...]
    segments: tuple[Segment, ...] = ()
    delegates: tuple[DelegateBlob, ...] = ()
    user_metadata: tuple[tuple[str, str], ...] = ()
    named_data: tuple[NamedData, ...] = ()

    def __post_init__(self) -> None:
        for name in ("methods", "segments", "delegates", "named_data"):
            object.__setattr__(self, name, _as_tuple("Program", name, getattr(self, name)))
        meta = self.user_metadata
        meta = tuple(meta.items()) if isinstance(meta, dict) else _as_tuple(
            "Program", "user_metadata", meta)
        seen: set[str] = set()
        for i, pair in enumerate(meta):
            if not (isinstance(pair, tuple) and len(pair) == 2
                    and type(pair[0]) is str and type(pair[1]) is str):
                raise program_error(
                    f"`Program`: user_metadata[{i}]", repr(pair), "a (str, str) pair",
                )
            if pair[0] in seen:
                raise program_error(
                    f"`Program`: user_metadata[{i}]", f"duplicate key {pair[0]!r}",
                    "unique keys", "merge the two entries",
                )
            seen.add(pair[0])
        object.__setattr__(self, "user_metadata", meta)

    def method(self, name: str) -> Method:
        """The method called ``name``; ProgramError listing the methods if there is none."""
        for method in self.methods:
            if method.name == name:
                return method
        raise program_error(
            f"`Program.method({name!r})`", "no such method",
            ", ".join(repr(m.name) for m in self.methods) or "(the program has no methods)",
        )

    @property
    def metadata(self) -> dict[str, str]:
        """``user_metadata`` as a dict."""
        return dict(self.user_metadata)
