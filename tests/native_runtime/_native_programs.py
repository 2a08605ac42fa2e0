"""Hand-built programs (opforge.program dataclasses, no torch) for the native tools' and
binding's tests: each runs on the lean runtime, the reference the native runs are held to.

- ``add_program``: ``x + alpha * y`` (one ``aten::add.out``), the tiny call;
- ``scalar_alpha_program``: the same with ``alpha`` a double input;
- ``state_program``: ``count += x`` into program state, shared by two methods;
- ``toy_decoder``: a ``prefill`` (4 tokens) + ``decode`` (1 token) pair, flat layout,
  whose logits depend on the tokens, the positions and a state row the previous call
  left: ``fmod(t * W + p * U + memory, 2.5)``; ``memory = 0.5 * logits[-1]``.
"""

from __future__ import annotations

import numpy as np

from opforge.program import (
    ArenaStorage, ConstantStorage, DoubleValue, IntValue, KernelCall, MemoryPlan, Method, Move,
    Operator, Program, ScalarType, Segment, StateSlot, TensorValue,
)

F32, I64 = ScalarType.FLOAT32, ScalarType.INT64


class _Arena:
    """Bump allocation of 64-byte aligned slots in arena 0."""

    def __init__(self) -> None:
        self.size = 0

    def tensor(self, dtype: ScalarType, shape: tuple[int, ...]) -> TensorValue:
        value = TensorValue(dtype, shape, storage=ArenaStorage(0, self.size))
        self.size += -(-max(value.nbytes, 1) // 64) * 64
        return value

    def plan(self) -> MemoryPlan:
        return MemoryPlan((max(self.size, 64),))


def add_program(shape=(1, 4), dtype: ScalarType = F32, alpha: int = 1) -> Program:
    arena = _Arena()
    values = (arena.tensor(dtype, shape), arena.tensor(dtype, shape), IntValue(alpha),
              arena.tensor(dtype, shape))
    forward = Method("forward", values, (0, 1), (3,), (KernelCall(0, (0, 1, 2, 3)),),
                     (Operator("aten::add", "out"),), arena.plan())
    return Program(methods=(forward,))


def scalar_alpha_program(shape=(2, 3)) -> Program:
    arena = _Arena()
    values = (arena.tensor(F32, shape), arena.tensor(F32, shape), DoubleValue(1.0),
              arena.tensor(F32, shape))
    forward = Method("forward", values, (0, 1, 2), (3,), (KernelCall(0, (0, 1, 2, 3)),),
                     (Operator("aten::add", "out"),), arena.plan())
    return Program(methods=(forward,))


def state_program() -> Program:
    """``count`` starts at 5; each call of ``forward`` or ``other`` adds its input."""
    arena = _Arena()
    values = (TensorValue(F32, (1,), storage=ConstantStorage(0, 0)),  # the state
              arena.tensor(F32, (1,)), arena.tensor(F32, (1,)), DoubleValue(1.0))

    def method(name: str) -> Method:
        return Method(name, values, (1,), (2,), (KernelCall(0, (0, 1, 3, 2)), Move(2, 0)),
                      (Operator("aten::add", "out"),), arena.plan(),
                      state=(StateSlot("count", 0),))

    return Program(methods=(method("forward"), method("other")),
                   segments=(Segment(np.array([5.0], np.float32).tobytes()),))


def toy_decoder(vocab: int = 20, prefill_seq: int = 4, seed: int = 0,
                layout: str = "flat") -> Program:
    """A decoder ``opforge.runtime.generate`` drives: methods ``prefill`` (``prefill_seq``
    tokens) and ``decode`` (one), ``(tokens[int64, s], positions[int64, s]) -> logits[s,
    vocab]``, sharing the state ``memory[1, vocab]`` (capacity: ``vocab`` positions).
    ``layout="batched"``: the tokens are ``input_ids[int64, 1, s]`` (transposed inside)."""
    batched = layout == "batched"
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((1, vocab)).astype(np.float32)
    u = rng.standard_normal((1, vocab)).astype(np.float32)
    weights = Segment(w.tobytes() + bytes(-w.nbytes % 64) + u.tobytes())
    memory = Segment(np.zeros((1, vocab), np.float32).tobytes())

    def method(name: str, s: int) -> Method:
        arena = _Arena()
        t = arena.tensor
        values = (
            t(I64, (1, s) if batched else (s,)), t(I64, (s,)), IntValue(1),  # 0 tokens, 1 pos, 2
            t(I64, (s, 1)), t(I64, (s, 1)),                                 # 3, 4 unsqueezed
            TensorValue(F32, (1, vocab), storage=ConstantStorage(0, 0)),    # 5 W
            TensorValue(F32, (1, vocab), storage=ConstantStorage(0, w.nbytes + (-w.nbytes % 64))),
            t(F32, (s, vocab)), t(F32, (s, vocab)), IntValue(1),           # 7 a, 8 b, 9 alpha
            t(F32, (s, vocab)),                                             # 10 c = a + b
            TensorValue(F32, (1, vocab), storage=ConstantStorage(1, 0)),    # 11 memory (state)
            t(F32, (s, vocab)), DoubleValue(2.5), t(F32, (s, vocab)),      # 12 d, 13, 14 logits
            IntValue(0), IntValue(s - 1), IntValue(s), IntValue(1),         # 15-18 slice args
            t(F32, (1, vocab)), DoubleValue(0.5), t(F32, (1, vocab)),      # 19 last, 20, 21
        )
        operators = (Operator("aten::unsqueeze_copy", "out"), Operator("aten::mul", "out"),
                     Operator("aten::add", "out"), Operator("aten::fmod", "Scalar_out"),
                     Operator("aten::slice_copy", "Tensor_out"), Operator("aten::mul", "Scalar_out"),
                     Operator("aten::t_copy", "out"))
        instructions = (
            KernelCall(6, (0, 3)) if batched else KernelCall(0, (0, 2, 3)), KernelCall(0, (1, 2, 4)),
            KernelCall(1, (3, 5, 7)), KernelCall(1, (4, 6, 8)),
            KernelCall(2, (7, 8, 9, 10)), KernelCall(2, (10, 11, 9, 12)),
            KernelCall(3, (12, 13, 14)),
            KernelCall(4, (14, 15, 16, 17, 18, 19)), KernelCall(5, (19, 20, 21)),
            Move(21, 11),
        )
        return Method(name, values, (0, 1), (14,), instructions, operators, arena.plan(),
                      state=(StateSlot("memory", 11),))

    return Program(methods=(method("prefill", prefill_seq), method("decode", 1)),
                   segments=(weights, memory))
