"""The execution fuzzer's dynamic-shape and state part (used by ``exec_fuzz.py``).

Seeds: the bundled decoder (symbolic sequence, KV caches written in place, zero-splat
state), a derived-dimension model, and the hand-built version-3/4/5 sample programs
(guards, a counter state, a growing symbol, a splat state). Mutations reach every field
format versions 3 to 5 added: a symbol's range (empty, negative, past int64), a value's
size expressions (other symbols, huge constants, a division by a symbol that may be
zero, deeper nesting), guards, state slots (another value, a name twice, an input), the
growing flag, and a splat packing moved onto a non-state constant. Inputs for a dynamic
method are drawn at random sizes up to one past each upper bound, so binding, range
and guard checks run too, and each method is called twice, then again after a state
reset (state carries between calls).
"""

from __future__ import annotations

import dataclasses
import random

import numpy as np

import opforge.program as P
from opforge.program.symbolic import GUARD_RELATIONS
from opforge.program._sample import (
    growing_program, splat_state_program, symbolic_program, unverified_bytes,
)

BIG = [0, 1, 2, -1, 2**31 - 1, 2**31, 2**40, 2**62, 2**63 - 1, -(2**63)]


def dynamic_seeds() -> list[bytes]:
    """Version-3/4/5 programs: hand-built ones always, exported ones with torch."""
    seeds = [P.to_bytes(symbolic_program()), P.to_bytes(growing_program()),
             P.to_bytes(splat_state_program())]
    try:
        import torch
    except ImportError:
        return seeds
    from opforge.examples.decoder import TinyDecoder, export_decoder
    from opforge.export import export

    seeds.append(P.to_bytes(export_decoder(TinyDecoder(layers=1, max_len=16).eval())))

    class Derived(torch.nn.Module):
        def forward(self, x, y):
            return torch.cat([x, x], 0) * y, x.sum(0)

    s = torch.export.Dim("s", min=1, max=12)
    seeds.append(P.to_bytes(export(Derived(), (torch.randn(3, 4), torch.randn(6, 4)),
                                   dynamic_shapes=({0: s}, {0: 2 * s}))))
    return seeds


def _expr(rng: random.Random, names: list[str], depth: int = 0) -> P.SizeExpr:
    if depth > 3 or rng.random() < 0.4:
        if names and rng.random() < 0.6:
            return P.SizeExpr.sym(rng.choice(names + ["nowhere"]))
        return P.SizeExpr.const(rng.choice(BIG))
    op = rng.choice(["+", "-", "*", "floordiv", "mod", "min", "max"])
    return P.SizeExpr(op, (_expr(rng, names, depth + 1), _expr(rng, names, depth + 1)))


def mutate_dynamic(rng: random.Random, program: P.Program) -> bytes:
    """One version-3+ field of one method changed; written without the verifier."""
    at = rng.randrange(len(program.methods))
    m = program.methods[at]
    names = [s.name for s in m.symbols]
    symbols, symbolic = list(m.symbols), list(m.symbolic_values)
    guards, state = list(m.guards), list(m.state)
    values = list(m.values)
    choice = rng.randrange(7)
    if choice == 0 and symbols:  # a range
        i = rng.randrange(len(symbols))
        low, high = sorted((rng.choice(BIG + [symbols[i].min]), rng.choice(BIG + [symbols[i].max])))
        if rng.random() < 0.2:
            low, high = high, low
        symbols[i] = P.Symbol(symbols[i].name, low, high, grow=symbols[i].grow)
    elif choice == 1 and symbolic:  # a size expression
        i = rng.randrange(len(symbolic))
        exprs = list(symbolic[i].exprs)
        exprs[rng.randrange(len(exprs))] = _expr(rng, names)
        symbolic[i] = P.SymbolicValue(symbolic[i].value, tuple(exprs))
    elif choice == 2:  # a guard
        guard = P.Guard(_expr(rng, names), rng.choice(list(GUARD_RELATIONS) + [">"]),
                        _expr(rng, names))
        guards = guards[:-1] + [guard] if guards and rng.random() < 0.5 else guards + [guard]
    elif choice == 3 and state:  # a state slot
        i = rng.randrange(len(state))
        if rng.random() < 0.5:
            state[i] = P.StateSlot(state[i].name, rng.randrange(len(values) + 1))
        else:
            state.append(P.StateSlot(state[i].name if rng.random() < 0.5 else "other",
                                     rng.choice(list(m.inputs) or [0])))
    elif choice == 4 and symbols:  # the growing flag
        i = rng.randrange(len(symbols))
        symbols[i] = dataclasses.replace(symbols[i], grow=not symbols[i].grow)
    elif choice == 5:  # a splat packing onto a constant (state or not), or off a state
        constants = [i for i, v in enumerate(values) if type(v) is P.TensorValue
                     and type(v.storage) is P.ConstantStorage]
        if constants:
            i = rng.choice(constants)
            packing = P.PACKING_NONE if values[i].storage.packing else P.PACKING_SPLAT
            values[i] = dataclasses.replace(
                values[i], storage=dataclasses.replace(values[i].storage, packing=packing))
    elif symbolic:  # a symbolic value moved to another value
        i = rng.randrange(len(symbolic))
        symbolic[i] = P.SymbolicValue(rng.randrange(len(values) + 1), symbolic[i].exprs)
    methods = list(program.methods)
    methods[at] = dataclasses.replace(m, symbols=tuple(symbols), symbolic_values=tuple(symbolic),
                                      guards=tuple(guards), state=tuple(state),
                                      values=tuple(values))
    return unverified_bytes(dataclasses.replace(program, methods=tuple(methods)))


def dynamic_shapes(rng: np.random.Generator, method) -> list[tuple[int, ...]] | None:
    """Input shapes of one call of a dynamic ``method`` (a runtime ``Method``): each symbol
    drawn in its range (sometimes one past it, or 0), every input dimension evaluated from
    its expression so that shared and derived dimensions agree, and now and then one
    dimension knocked off (an inconsistent call the binder must refuse). None for scalars."""
    definition = method._def
    env = {}
    for symbol in definition.symbols:
        high = min(symbol.max, symbol.min + 64)  # a growing symbol's max is 2**31 - 1
        env[symbol.name] = int(rng.choice([symbol.min, high, high + 1, 0,
                                           rng.integers(symbol.min, high + 1)]))
    exprs = {sv.value: sv.exprs for sv in definition.symbolic_values}
    shapes = []
    for spec in method.inputs:
        if not spec.is_tensor:
            shapes.append(None)
            continue
        shape = list(spec.shape)
        for d, e in enumerate(exprs.get(spec.index, ())):
            try:
                shape[d] = max(0, min(e.evaluate(env), 1 << 16))
            except (KeyError, ZeroDivisionError, OverflowError):
                pass
        if shape and rng.random() < 0.1:
            shape[int(rng.integers(len(shape)))] += 1
        shapes.append(tuple(shape))
    return shapes


def run_dynamic(loaded, method, make_inputs) -> None:
    """Two calls (state carries), a state reset, a third call."""
    method(*make_inputs())
    method(*make_inputs())
    if loaded.state_names:
        loaded.reset_state()
        loaded.state_memory()
    method(*make_inputs())
