"""Per-call sizes of a method with dynamic shapes: bind symbols, check, make concrete values.

# Design
#
# A dynamic method's value table holds every tensor at its upper bound (its planned slot).
# A call at some input shape needs the same instructions bound to views of the *actual*
# sizes: that is a different value table over the same arenas. ``ShapeBinder.concrete``
# makes it: it binds the symbols from the inputs' sizes (``binding_plan``: each symbol from
# the first input dimension that determines it, ``a * s + b`` solved for ``s``), checks each
# symbol's range, every other symbolic input dimension, every static dimension and every
# guard, then evaluates each symbolic value and returns a copy of the method definition whose
# values have those sizes (tensors keep their storage: the planner gave each its worst-case
# slot, so every smaller size fits). ``sizes`` gives the same numbers without building
# dataclasses: the ``Method`` makes a value table in which the symbolic values are views (or
# ints) of those sizes and everything else is shared with its load-time table, binds its
# instructions against it exactly as it binds a static method, and caches the result per
# shape (``runtime/method.py``): a repeated shape costs one dict lookup more than a static
# call.
"""

from __future__ import annotations

import dataclasses

from opforge.errors import ProgramError
from opforge.program import (
    IntListValue, IntValue, Method as MethodDef, OptionalTensorListValue, TensorListValue,
    TensorValue,
)
from opforge.program.symbolic import binding_plan

__all__ = ["ShapeBinder"]


class ShapeBinder:
    """Binds one dynamic method's symbols from input shapes and evaluates its sizes."""

    def __init__(self, api: str, method: MethodDef) -> None:
        self.api = api
        self.method = method
        self.plan = binding_plan(method)
        self.ranges = {s.name: (s.min, s.max) for s in method.symbols}
        # guards over symbols the inputs bind; the rest read data-dependent sizes, checked
        # when an instruction produces them (runtime/produced.py)
        inputs_bind = {step.symbol for step in self.plan if step.symbol is not None}
        self.guards = tuple(g for g in method.guards
                            if g.lhs.symbols() | g.rhs.symbols() <= inputs_bind)
        self.produced = frozenset(self.ranges) - inputs_bind
        symbolic = {sv.value: sv.exprs for sv in method.symbolic_values}
        # static dimensions of the tensor inputs: (position, dim, size)
        self.static_dims = []
        for position, index in enumerate(method.inputs):
            value = method.values[index]
            if type(value) is TensorValue:
                exprs = symbolic.get(index)
                for dim, size in enumerate(value.sizes):
                    if exprs is None or exprs[dim].is_const:
                        self.static_dims.append((position, dim, size))
                    # a constant below the slot's size (a hostile file; the verifier allows
                    # it): both sizes are checked, so every call is refused clearly, as the
                    # native runtime refuses it, where the copy into the slot raised
                    if exprs is not None and exprs[dim].is_const and exprs[dim].evaluate({}) != size:
                        self.static_dims.append((position, dim, exprs[dim].evaluate({})))
        self.ranks = {p: len(method.values[i].sizes) for p, i in enumerate(method.inputs)
                      if type(method.values[i]) is TensorValue}
        # values whose run-time object depends on the symbols: symbolic values and the
        # tensor lists holding one; every other object is made once and shared by shapes
        symbolic_indices = set(symbolic)
        lists = {i for i, v in enumerate(method.values)
                 if type(v) in (TensorListValue, OptionalTensorListValue)
                 and symbolic_indices.intersection(x for x in v.items if x is not None)}
        self.dependent = frozenset(symbolic_indices | lists)
        # each distinct expression once (a transformer layer's 337 expressions are 11
        # distinct ones): ``sizes`` evaluates those, then gathers each value's sizes
        distinct: dict = {}
        self._gather = tuple((sv.value, tuple(distinct.setdefault(e, len(distinct))
                                              for e in sv.exprs))
                             for sv in method.symbolic_values)
        self._distinct = tuple(distinct)

    def describe_input(self, position: int) -> str:
        """``(s0, 4)`` with the symbols' ranges, for error messages and IOSpec."""
        index = self.method.inputs[position]
        exprs = next((sv.exprs for sv in self.method.symbolic_values if sv.value == index), None)
        sizes = self.method.values[index].sizes
        if exprs is None:
            return str(tuple(sizes))
        text = "(" + ", ".join(str(e) for e in exprs) + ("," if len(exprs) == 1 else "") + ")"
        names = sorted(set().union(*(e.symbols() for e in exprs)))
        ranges = ", ".join(f"{n} in [{self.ranges[n][0]}, {self.ranges[n][1]}]" for n in names)
        return f"{text} with {ranges}" if ranges else text

    def bind(self, shapes: dict[int, tuple[int, ...]]) -> dict[str, int]:
        """Symbol values for the tensor inputs' ``shapes`` (position → shape); ProgramError
        naming the input, dimension, symbol and bounds when a size is out of range."""
        api = self.api
        for position, rank in self.ranks.items():
            if len(shapes[position]) != rank:
                raise ProgramError(
                    f"`{api}`: input {position} — found rank {len(shapes[position])} (shape "
                    f"{tuple(shapes[position])}) — valid: shape {self.describe_input(position)}"
                    " — fix: pass a tensor of that rank")
        for position, dim, size in self.static_dims:
            if shapes[position][dim] != size:
                raise ProgramError(
                    f"`{api}`: input {position} dimension {dim} — found size "
                    f"{shapes[position][dim]} — valid: {size} (a static dimension; input "
                    f"shape {self.describe_input(position)}) — fix: pass size {size}, or "
                    "re-export with this dimension dynamic")
        env: dict[str, int] = {}
        for step in self.plan:
            size = shapes[step.position][step.dim]
            if step.symbol is not None:
                low, high = self.ranges[step.symbol]
                value, rest = divmod(size - step.b, step.a)
                if rest or not low <= value <= high:
                    lo_size = sorted((step.a * low + step.b, step.a * high + step.b))
                    raise ProgramError(
                        f"`{api}`: input {step.position} dimension {step.dim} — found size "
                        f"{size} — valid: {step.expr} with symbol {step.symbol} in [{low}, "
                        f"{high}] (sizes {lo_size[0]}..{lo_size[1]}"
                        + (f" in steps of {abs(step.a)}" if abs(step.a) != 1 else "") +
                        f"; input shape {self.describe_input(step.position)}) — fix: pass a "
                        "size in range, or re-export with a larger max for this dimension")
                env[step.symbol] = value
                continue
            expected = _evaluate(api, step.expr, env)
            if size != expected:
                bound = ", ".join(f"{k}={v}" for k, v in sorted(env.items()))
                raise ProgramError(
                    f"`{api}`: input {step.position} dimension {step.dim} — found size {size} "
                    f"— valid: {step.expr} = {expected} with {bound} (bound from the other "
                    f"input dimensions; input shape {self.describe_input(step.position)}) — "
                    "fix: pass inputs whose sizes agree as exported")
        for guard in self.guards:
            try:
                holds = guard.holds(env)
            except ZeroDivisionError:
                holds = False
            if not holds:
                bound = ", ".join(f"{k}={v}" for k, v in sorted(env.items()))
                raise ProgramError(
                    f"`{api}`: inputs — sizes {bound} break the guard {guard} that "
                    "torch.export recorded — valid: sizes for which the guard holds — fix: "
                    "pass such sizes, or re-export with example inputs of these sizes")
        return env

    def sizes(self, env: dict[str, int]) -> dict[int, tuple[int, ...]]:
        """Each symbolic value's sizes (or ints) under ``env``, by value index."""
        api = self.api
        found = [_evaluate(api, e, env) for e in self._distinct]
        return {value: tuple([found[j] for j in where]) for value, where in self._gather}

    def concrete(self, env: dict[str, int]) -> MethodDef:
        """The method definition with every symbolic value at its size under ``env``
        (checked dataclasses: for tools and the fuzzer; calls use ``sizes``)."""
        values = list(self.method.values)
        for index, sizes in self.sizes(env).items():
            value = values[index]
            kind = type(value)
            if kind is TensorValue:
                values[index] = TensorValue(value.dtype, sizes, value.dim_order, value.storage)
            elif kind is IntValue:
                values[index] = IntValue(sizes[0])
            else:
                values[index] = IntListValue(sizes)
        return dataclasses.replace(self.method, values=tuple(values))


def _evaluate(api: str, expr, env: dict[str, int]) -> int:
    try:
        return expr.evaluate(env)
    except ZeroDivisionError:
        bound = ", ".join(f"{k}={v}" for k, v in sorted(env.items()))
        raise ProgramError(f"`{api}`: size expression {expr} — divides by zero at {bound} — "
                           "valid: sizes the exported guards admit — fix: pass other sizes, "
                           "or re-export") from None
