"""Small valid programs for tests, fuzzing, benchmarks and the docs (not public API).

``sample_program()`` uses every value kind, every instruction kind, constants in two
segments, a delegate blob with compile specs and user metadata, so a round trip through
it exercises the whole format.
"""

from __future__ import annotations

import zlib

import numpy as np

from opforge.program import _format as F
from opforge.program.encode import encode
from opforge.program.model import (
    DelegateBlob, DelegateCall, Free, KernelCall, MemoryPlan, Method, Move, Operator, Program,
    Segment,
)
from opforge.program.scalar_type import ScalarType
from opforge.program.values import (
    ArenaStorage, BoolListValue, BoolValue, ConstantStorage, DoubleListValue, DoubleValue,
    IntListValue, IntValue, NoneValue, OptionalTensorListValue, ScalarTypeValue, StringValue,
    TensorListValue, TensorValue,
)

F32 = ScalarType.FLOAT32


def sample_program() -> Program:
    """forward(x: f32[2, 4]) -> (y: f32[2, 3], n: int): linear → relu6 → delegate → cat."""
    weight = np.arange(12, dtype=np.float32).reshape(3, 4) / 10
    bias = np.array([0.5, -0.5, 0.25], dtype=np.float32)
    values = (
        TensorValue(F32, (2, 4), storage=ArenaStorage(0, 0)),          # 0 x (input)
        TensorValue(F32, (3, 4), storage=ConstantStorage(0, 0)),       # 1 weight
        TensorValue(F32, (3,), storage=ConstantStorage(1, 0)),         # 2 bias
        TensorValue(F32, (2, 3), storage=ArenaStorage(0, 64)),         # 3 linear out
        TensorValue(F32, (2, 3), storage=ArenaStorage(0, 128)),        # 4 relu6 out
        TensorValue(F32, (2, 3), storage=ArenaStorage(0, 192)),        # 5 y (output)
        IntValue(2),                                                    # 6 n (output)
        DoubleValue(6.0),                                               # 7
        BoolValue(True),                                                # 8
        StringValue("tanh"),                                            # 9
        NoneValue(),                                                    # 10
        IntListValue((1, -1)),                                          # 11
        DoubleListValue((0.5, 2.0)),                                    # 12
        BoolListValue((True, False)),                                   # 13
        TensorListValue((3, 4)),                                        # 14
        OptionalTensorListValue((3, None)),                             # 15
        ScalarTypeValue(F32),                                           # 16
        TensorValue(F32, (4, 3), (1, 0), ArenaStorage(1, 0)),           # 17 scratch, other arena
        TensorValue(ScalarType.INT64, (0,)),                            # 18 empty, unplanned
        TensorValue(F32, (2, 3), storage=ArenaStorage(0, 256)),         # 19 delegate out
    )
    method = Method(
        name="forward",
        values=values,
        inputs=(0,),
        outputs=(5, 6),
        instructions=(
            KernelCall(0, (0, 1, 2, 3)),          # aten::linear.out(x, w, b, out)
            KernelCall(1, (3, 7, 9, 4)),          # my_ops::relu6.out(in, cap, mode, out)
            DelegateCall(0, (4, 19)),
            KernelCall(2, (14, 6, 5)),            # aten::cat.out([..], dim, out) (shape-agnostic)
            Move(19, 5),
            Free(3),
        ),
        operators=(Operator("aten::linear", "out"),
                   Operator("my_ops::relu6", "out"), Operator("aten::cat", "out")),
        memory_plan=MemoryPlan((320, 48)),
    )
    delegate = DelegateBlob("cpu_fused", 2, (("target", b"x86_64"), ("opt", b"\x03")))
    return Program(
        methods=(method, Method("empty", (), (), (), ())),
        segments=(Segment(weight), Segment(bias), Segment(b"\xde\xad\xbe\xef" * 5)),
        delegates=(delegate,),
        user_metadata=(("model", "tiny"), ("exporter", "opforge 0.1.0")),
    )


def chain_program(n: int) -> Program:
    """A straight chain of ``n`` add.out calls over 2n+1 tensors (for load-time benchmarks)."""
    values = [TensorValue(F32, (64,), storage=ArenaStorage(0, (i % 2) * 256))
              for i in range(n + 1)]
    values += [TensorValue(F32, (64,), storage=ConstantStorage(0, 256 * i)) for i in range(n)]
    instructions = tuple(KernelCall(0, (i, n + 1 + i, i + 1)) for i in range(n))
    method = Method("forward", tuple(values), (0,), (n,), instructions,
                    (Operator("aten::add", "out"),), MemoryPlan((512,)))
    weights = Segment(np.zeros(64 * n, dtype=np.float32))
    return Program(methods=(method,), segments=(weights,))


def one_kernel_program(op: str, overload: str, args: list, inputs: list[int],
                       outputs: list[int]) -> Program:
    """One ``op.overload`` call on ``args`` (values in schema order; a ``(dtype, shape)``
    pair is a tensor given the next 64-byte aligned slot of arena 0), ``inputs`` and
    ``outputs`` indices into ``args`` — for kernel tests and benchmarks.

    >>> one_kernel_program("aten::exp", "out", [(F32, (4,)), (F32, (4,))], [0], [1]).methods[0].name
    'forward'
    """
    offset, values = 0, []
    for value in args:
        if isinstance(value, tuple):
            value = TensorValue(value[0], value[1], storage=ArenaStorage(0, offset))
            offset += -(-max(value.nbytes, 1) // 64) * 64
        values.append(value)
    method = Method("forward", tuple(values), tuple(inputs), tuple(outputs),
                    (KernelCall(0, tuple(range(len(values)))),), (Operator(op, overload),),
                    MemoryPlan((max(offset, 64),)))
    return Program(methods=(method,))


def reseal(data: bytes | bytearray, *, fix_file_size: bool = False) -> bytes:
    """``data`` with the header's metadata CRC-32 recomputed (for structure-aware fuzzing:
    a mutated metadata byte then reaches the parser instead of stopping at the checksum);
    with ``fix_file_size`` also ``header.file_size`` set to the real length."""
    out = bytearray(data)
    if len(out) < F.HEADER_SIZE:
        return bytes(out)
    fields = list(F.HEADER.unpack_from(out, 0))
    if fix_file_size:
        fields[3] = len(out)
    start, size = fields[4], fields[5]
    if start + size <= len(out):
        fields[6] = zlib.crc32(out[start:start + size])
        F.HEADER.pack_into(out, 0, *fields)
    return bytes(out)


def unverified_bytes(program: Program) -> bytes:
    """``program`` as file bytes *without* the verifier that ``to_bytes`` runs first: how
    tests and the fuzzer write programs the loader must refuse (indices out of range,
    cycles, wrong kinds) without hand-editing bytes."""
    head, segments = encode(program)
    out = bytearray(head)
    for offset, chunk in segments:
        out += bytes(offset - len(out)) + bytes(chunk)
    return bytes(out)


def symbolic_program() -> Program:
    """A version-3 program: ``y = abs(x)`` over ``s`` in [1, 16], a derived second input
    ``(2 * s)``, a guard, a view-like ``int[]`` argument with an expression, and a counter
    state updated by a Move (every version-3 field in use)."""
    from opforge.program.symbolic import Guard, SizeExpr, StateSlot, Symbol, SymbolicValue

    values = (
        TensorValue(F32, (16,), storage=ArenaStorage(0, 0)),  # x: (s,)
        TensorValue(F32, (32,), storage=ArenaStorage(0, 64)),  # z: (2 * s,)
        TensorValue(F32, (16,), storage=ArenaStorage(0, 192)),  # y = abs(x): (s,)
        IntListValue((4,)),  # [s]: a size argument
        TensorValue(F32, (1,), storage=ConstantStorage(0, 0)),  # state initial value
        TensorValue(F32, (1,), storage=ArenaStorage(0, 256)),  # new state
    )
    s = SizeExpr.sym("s")
    symbolic = (SymbolicValue(0, (s,)), SymbolicValue(1, (SizeExpr("*", (SizeExpr.const(2), s)),)),
                SymbolicValue(2, (s,)), SymbolicValue(3, (s,)))
    method = Method(
        "forward", values, (0, 1), (2,),
        (KernelCall(0, (0, 2)), KernelCall(0, (4, 5)), Move(5, 4)),
        (Operator("aten::abs", "out"),), MemoryPlan((320,)),
        symbols=(Symbol("s", 1, 16),), symbolic_values=symbolic,
        guards=(Guard(SizeExpr("mod", (s, SizeExpr.const(16))), "<=", SizeExpr.const(15)),),
        state=(StateSlot("count", 4),))
    return Program(methods=(method,), segments=(Segment(np.ones(1, dtype=np.float32)),))


def growing_program() -> Program:
    """A version-4 program: ``y = abs(x)`` over a growing symbol ``s`` (no storage for ``x``
    and ``y``: the runtime allocates them at ``(4,)`` first and grows them), next to a
    planned static tensor ``z = abs(w)``."""
    from opforge.program.symbolic import SizeExpr, Symbol, SymbolicValue

    values = (
        TensorValue(F32, (4,)),  # x: (s,), growing
        TensorValue(F32, (4,)),  # y = abs(x): (s,), growing
        TensorValue(F32, (3,), storage=ArenaStorage(0, 0)),  # w
        TensorValue(F32, (3,), storage=ArenaStorage(0, 64)),  # z = abs(w)
    )
    s = SizeExpr.sym("s")
    method = Method(
        "forward", values, (0, 2), (1, 3), (KernelCall(0, (0, 1)), KernelCall(0, (2, 3))),
        (Operator("aten::abs", "out"),), MemoryPlan((128,)),
        symbols=(Symbol("s", 1, 2**31 - 1, grow=True),),
        symbolic_values=(SymbolicValue(0, (s,)), SymbolicValue(1, (s,))))
    return Program(methods=(method,))


def splat_state_program() -> Program:
    """A version-5 program: a state ``last`` of 1,024 floats whose initial value is a zero
    splat (one element in the segment); each call returns ``abs(last)`` and stores its
    input as the new ``last``."""
    from opforge.program.symbolic import StateSlot
    from opforge.program.values import PACKING_SPLAT

    values = (
        TensorValue(F32, (1024,), storage=ArenaStorage(0, 0)),  # x
        TensorValue(F32, (1024,), storage=ConstantStorage(0, 0, PACKING_SPLAT)),  # last
        TensorValue(F32, (1024,), storage=ArenaStorage(0, 4096)),  # y = abs(last)
    )
    method = Method(
        "forward", values, (0,), (2,), (KernelCall(0, (1, 2)), Move(0, 1)),
        (Operator("aten::abs", "out"),), MemoryPlan((8192,)), state=(StateSlot("last", 1),))
    return Program(methods=(method,), segments=(Segment(np.zeros(1, dtype=np.float32)),))
