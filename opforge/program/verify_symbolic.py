"""Verifier checks for the version-3 parts of a method: symbolic sizes and state.

* symbols have unique names; every expression (symbolic values, guards) reads only declared
  symbols, and its bounds over the symbols' ranges are computable (no divisor that can be
  zero) and within int64;
* each symbolic value is a ``TensorValue`` (one expression per dimension), an ``IntValue``
  (one) or an ``IntListValue`` (one per element), named once; a tensor's expressions are
  never negative and never exceed the tensor's stored size, which is its size at the upper
  bound and what its slot was checked against, so every size a call can produce fits its
  slot;
* symbolic tensors are planned into an arena (a constant cannot change its size), except a
  growing tensor (format version 4): a symbolic tensor without storage whose sizes read a
  growing symbol; its stored sizes are its first allocation (the export example), any size
  in int64 is valid for it (the runtime checks each allocation against the memory limit);
* every symbol is bound by some input dimension (``binding_plan``);
* each state slot names a constant tensor (its initial value) that is no input, each name
  once per method; methods sharing a state name agree on its dtype and sizes.
"""

from __future__ import annotations

from opforge.program._errors import program_error
from opforge.program.model import Method, Program
from opforge.program.symbolic import SizeExpr, binding_plan, growing_values
from opforge.program.values import ArenaStorage, ConstantStorage, IntListValue, IntValue, TensorValue

__all__ = ["verify_symbolic", "verify_shared_state", "state_values"]

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_CORRUPT = "the file is corrupt or hostile; re-export the model"


def state_values(method: Method) -> set[int]:
    return {slot.value for slot in method.state}


def _bounds(expr: SizeExpr, ranges: dict, subject: str) -> tuple[int, int]:
    missing = expr.symbols() - ranges.keys()
    if missing:
        raise program_error(subject, f"{expr} reads undeclared symbol(s) {sorted(missing)}",
                            "expressions over the method's symbols", _CORRUPT)
    try:
        low, high = expr.bounds(ranges)
    except ZeroDivisionError:
        raise program_error(subject, f"{expr} divides by a value that can be zero",
                            "divisors bounded away from zero", _CORRUPT) from None
    if not (_INT64_MIN <= low and high <= _INT64_MAX):
        raise program_error(subject, f"{expr} in [{low}, {high}]", "values within int64",
                            _CORRUPT)
    return low, high


def verify_symbolic(method: Method, where: str) -> None:
    values = method.values
    n = len(values)
    ranges: dict[str, tuple[int, int]] = {}
    for i, symbol in enumerate(method.symbols):
        if symbol.name in ranges:
            raise program_error(f"{where} symbols[{i}]", f"{symbol.name!r} a second time",
                                "unique symbol names", _CORRUPT)
        ranges[symbol.name] = (symbol.min, symbol.max)
    seen: set[int] = set()
    growing = growing_values(method)
    for i, sv in enumerate(method.symbolic_values):
        at = f"{where} symbolic_values[{i}]"
        if not sv.value < n:
            raise program_error(f"{at}.value", str(sv.value), f"a value index below {n}", _CORRUPT)
        if sv.value in seen:
            raise program_error(f"{at}.value", f"value {sv.value} a second time",
                                "each value once", _CORRUPT)
        seen.add(sv.value)
        value = values[sv.value]
        kind = type(value)
        expected = (len(value.sizes) if kind is TensorValue else 1 if kind is IntValue
                    else len(value.values) if kind is IntListValue else None)
        if expected is None:
            raise program_error(f"{at}.value", f"value {sv.value}, a {kind.__name__}",
                                "a TensorValue, IntValue or IntListValue", _CORRUPT)
        if len(sv.exprs) != expected:
            raise program_error(f"{at}.exprs", f"{len(sv.exprs)} expression(s)",
                                f"{expected}, one per size or element", _CORRUPT)
        for d, expr in enumerate(sv.exprs):
            low, high = _bounds(expr, ranges, f"{at}.exprs[{d}]")
            if kind is TensorValue and (low < 0 or high > value.sizes[d]
                                        and sv.value not in growing):
                raise program_error(
                    f"{at}.exprs[{d}]", f"{expr} in [{low}, {high}]",
                    f"sizes in [0, {value.sizes[d]}] (the tensor's size at the upper bound, "
                    "which its slot holds)", _CORRUPT)
        if kind is TensorValue and type(value.storage) is not ArenaStorage and any(
                not e.is_const for e in sv.exprs) and sv.value not in growing:
            raise program_error(f"{at}.value", f"value {sv.value} with symbolic sizes and "
                                f"{type(value.storage).__name__ or 'no storage'}",
                                "symbolic tensors planned into an arena", _CORRUPT)
    for i, guard in enumerate(method.guards):
        _bounds(guard.lhs, ranges, f"{where} guards[{i}].lhs")
        _bounds(guard.rhs, ranges, f"{where} guards[{i}].rhs")
    if method.symbols:
        binding_plan(method)
    names: set[str] = set()
    inputs = set(method.inputs)
    for i, slot in enumerate(method.state):
        at = f"{where} state[{i}]"
        if slot.name in names:
            raise program_error(f"{at}.name", f"{slot.name!r} a second time",
                                "each state name once per method", _CORRUPT)
        names.add(slot.name)
        if not slot.value < n or type(values[slot.value]) is not TensorValue or type(
                values[slot.value].storage) is not ConstantStorage:
            raise program_error(f"{at}.value", f"value {slot.value}",
                                "a constant TensorValue (the state's initial value)", _CORRUPT)
        if slot.value in inputs or slot.value in seen:
            raise program_error(f"{at}.value", f"value {slot.value}, an input or symbolic",
                                "a static tensor that is no method input", _CORRUPT)


def verify_shared_state(program: Program) -> None:
    first: dict[str, tuple[str, TensorValue]] = {}
    for method in program.methods:
        for slot in method.state:
            value = method.values[slot.value]
            if slot.name not in first:
                first[slot.name] = (method.name, value)
                continue
            other_method, other = first[slot.name]
            if (other.dtype, other.sizes) != (value.dtype, value.sizes):
                raise program_error(
                    f"method {method.name!r} state {slot.name!r}",
                    f"{value.dtype.name.lower()}{list(value.sizes)}, but method "
                    f"{other_method!r} has {other.dtype.name.lower()}{list(other.sizes)}",
                    "one dtype and size per state name across methods", _CORRUPT)
