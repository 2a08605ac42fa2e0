"""torch.export's symbolic sizes → the program's symbols and size expressions.

``SymbolTable`` is built from an ``ExportedProgram``'s ``range_constraints`` (one
``Symbol`` per sympy symbol with its bounds; a symbol without an upper bound is refused,
naming the input and dimension it sizes, unless its Dim is named in ``export(grow=...)``:
then it is a growing symbol, recorded with max ``GROW_MAX`` when it has none, and the
tensors whose sizes read it (``grows``) are left unplanned for the runtime to grow). ``expr_of`` turns a ``SymInt`` (or its sympy
expression) into a ``SizeExpr``: integers, symbols, ``+``, ``*``, small integer powers,
``FloorDiv``, ``Mod``/``PythonMod``, ``Min``, ``Max``; anything else is an ``ExportError``.
An *unbacked* symbol (a data-dependent size: ``nonzero``, ``masked_select``, ``item()``
used as a size) with a finite upper bound in ``range_constraints`` (the graph's value
ranges, or the user's ``torch._check``) is a symbol an instruction produces at run time
(``produced``; its hint is its bound); one without a bound is refused where a size reads
it, with the ``torch._check`` that adds one. ``upper_sizes`` gives a fake tensor's sizes at the upper bound (interval arithmetic, the
same the verifier uses), which is what the memory planner gives each tensor a slot for.

``SymSize`` stands in the graph for a size computed at run time (an ``aten.sym_size.int``
or ``operator.mul`` node, once ``passes/symbolic_sizes.py`` has folded those into
expressions). It prints as its value at the export example, so the graph stays runnable
by torch at those sizes.
"""

from __future__ import annotations

from typing import Any

import sympy
import torch

from opforge.errors import ExportError
from opforge.program import Guard, SizeExpr, Symbol

__all__ = ["SymSize", "SymbolTable", "is_symbolic"]

_MAX_POWER = 8
# the recorded max of a growing symbol without one: sizes stay far inside int64 through the
# products of a few sizes (the verifier bounds every expression within int64)
GROW_MAX = 2**31 - 1


class SymSize:
    """A size argument known at run time: ``expr`` over the symbols, ``hint`` its value at
    the export example."""

    __slots__ = ("expr", "hint")

    def __init__(self, expr: SizeExpr, hint: int) -> None:
        self.expr = expr
        self.hint = hint

    def __repr__(self) -> str:
        return str(self.hint)


def is_symbolic(value: Any) -> bool:
    """Whether a fake tensor has a symbolic size, or a value is a SymInt/SymSize."""
    if isinstance(value, torch.Tensor):
        return any(not isinstance(s, int) for s in value.shape)
    return isinstance(value, (torch.SymInt, SymSize))


class SymbolTable:
    """The symbols of one exported method and how to express sizes over them."""

    def __init__(self, method_name: str, exported: Any, user_inputs: dict[str, Any],
                 dim_names: dict[str, str] | None = None,
                 grow: frozenset[str] = frozenset()) -> None:
        self.method_name = method_name
        raw = {str(k) for k in exported.range_constraints if isinstance(k, sympy.Symbol)}
        # the user's Dim names where they collide with no other symbol
        self.rename = {k: v for k, v in (dim_names or {}).items() if v not in raw - {k}}
        self.symbols: list[Symbol] = []
        self.ranges: dict[str, tuple[int, int]] = {}
        self.guards: list[Guard] = []
        self.hints: dict[str, int] = {}
        self.produced: set[str] = set()  # unbacked symbols: bound by an instruction
        self.unbounded: dict[str, tuple] = {}  # unbacked symbols without an upper bound
        self.made_at: dict[str, str] = {}  # where each unbacked symbol is made (for errors)
        derived = []
        sizing = set()  # the symbols the user inputs' sizes read: the method's symbols
        for fake in user_inputs.values():
            for size in getattr(fake, "shape", ()):
                if isinstance(size, torch.SymInt):
                    sizing |= {str(s) for s in size.node.expr.free_symbols}
        for key, bound in exported.range_constraints.items():
            if not isinstance(key, sympy.Symbol):
                if {str(s) for s in key.free_symbols} <= sizing:
                    derived.append((key, bound))
                continue
            if str(key) not in sizing:
                if _unbacked(key):  # a data-dependent size: planned at its upper bound
                    self._add_unbacked(str(key), bound)
                continue  # else an internal symbol; refused if a size reads it
            name = str(key)
            low, high = bound.lower, bound.upper
            grows = self.rename.get(name) in grow
            if grows and not _finite(high):
                high = GROW_MAX  # sizes are not planned at it: only expressions' int64 range
            if not _finite(high):
                where = _sized_by(name, user_inputs)
                raise ExportError(
                    f"`opforge.export.export(dynamic_shapes=...)`: method {method_name!r} "
                    f"{where} — has no upper bound (symbol {name}, range [{low}, {high}]) — "
                    "valid: bounded dimensions (memory is planned at the upper bound) — fix: "
                    "1. give its Dim a max, e.g. torch.export.Dim('batch', min=1, max=64); "
                    "2. or let its memory grow: export(..., grow=['<Dim name>'])")
            low = int(low) if _finite(low) else 0
            name = self.rename.get(name, name)
            self.symbols.append(Symbol(name, max(low, 0), int(high), grow=grows))
            self.ranges[name] = (max(low, 0), int(high))
        for fake in user_inputs.values():
            for size in getattr(fake, "shape", ()):
                if isinstance(size, torch.SymInt):
                    env = size.node.shape_env
                    known = getattr(env, "backed_var_to_val", None)
                    known = known if known is not None else env.var_to_val
                    self.hints.update({self.rename.get(str(k), str(k)): int(v)
                                       for k, v in known.items()
                                       if str(k) not in self.produced})
                    break
        self.growing = frozenset(s.name for s in self.symbols if s.grow)
        unknown = sorted(set(grow) - self.growing)
        if unknown:
            named = sorted(self.rename.values()) or "none (give each Dim a unique name)"
            raise ExportError(
                f"`opforge.export.export(grow=...)`: method {method_name!r} — {unknown} name no "
                f"dynamic dimension of its inputs — valid: the Dim names of this method: "
                f"{named} — fix: name the Dim, e.g. grow=['seq'] for torch.export.Dim('seq')")
        for key, bound in derived:  # ranges of derived dims (2*s): guards on the symbols
            expr = self.expr_of(key)
            if _finite(bound.lower) and int(bound.lower) > expr.bounds(self.ranges)[0]:
                self.guards.append(Guard(SizeExpr.const(int(bound.lower)), "<=", expr))
            if _finite(bound.upper) and int(bound.upper) < expr.bounds(self.ranges)[1]:
                self.guards.append(Guard(expr, "<=", SizeExpr.const(int(bound.upper))))

    def _add_unbacked(self, name: str, bound: Any) -> None:
        """An unbacked symbol (``nonzero``, ``masked_select``, ``item()`` as a size): a
        symbol an instruction produces at run time (``opforge/program/produced.py``). One
        without a finite upper bound is noted and refused where a size reads it."""
        low, high = bound.lower, bound.upper
        if not _finite(high):
            self.unbounded[name] = (low, high)
            return
        low = max(int(low), 0) if _finite(low) else 0
        if int(high) < low:
            self.unbounded[name] = (low, high)
            return
        self.symbols.append(Symbol(name, low, int(high)))
        self.ranges[name] = (low, int(high))
        self.hints[name] = int(high)  # no example value: sizes at the bound
        self.produced.add(name)

    def __bool__(self) -> bool:
        return bool(self.symbols)

    def expr_of(self, value: Any) -> SizeExpr:
        """The ``SizeExpr`` of an int, a ``SymInt``, a ``SymSize`` or a sympy expression."""
        if isinstance(value, SymSize):
            return value.expr
        if isinstance(value, bool):
            raise self._refuse(value)
        if isinstance(value, int):
            return SizeExpr.const(value)
        if isinstance(value, (torch.SymInt, torch.SymBool)):
            value = value.node.expr
        return self._convert(sympy.sympify(value))

    def hint(self, expr: SizeExpr) -> int:
        return expr.evaluate(self.hints)

    def upper(self, expr: SizeExpr) -> int:
        return expr.bounds(self.ranges)[1]

    def grows(self, fake: Any) -> bool:
        """Whether a tensor's sizes read a growing symbol (``export(grow=...)``): it is
        then not planned but grown by the runtime."""
        if not self.growing or not isinstance(fake, torch.Tensor):
            return False
        return any(isinstance(s, torch.SymInt) and self.growing & self.expr_of(s).symbols()
                   for s in fake.shape)

    def hint_sizes(self, fake: torch.Tensor) -> tuple[int, ...]:
        """A tensor's sizes at the export example (a growing tensor's first allocation)."""
        return tuple(s if isinstance(s, int) else self.hint(self.expr_of(s)) for s in fake.shape)

    def upper_sizes(self, fake: torch.Tensor) -> tuple[int, ...]:
        return tuple(s if isinstance(s, int) else self.upper(self.expr_of(s)) for s in fake.shape)

    def guard_of(self, relation: Any) -> Guard:
        """A sympy relation (``Eq``, ``Ne``, ``Le``, ``Lt``, ``Ge``, ``Gt``) as a Guard."""
        if isinstance(relation, (torch.SymBool,)):
            relation = relation.node.expr
        ops = {sympy.Eq: "==", sympy.Ne: "!=", sympy.Le: "<=", sympy.Lt: "<"}
        for kind, op in ops.items():
            if isinstance(relation, kind):
                return Guard(self._convert(relation.lhs), op, self._convert(relation.rhs))
        flipped = {sympy.Ge: "<=", sympy.Gt: "<"}
        for kind, op in flipped.items():
            if isinstance(relation, kind):
                return Guard(self._convert(relation.rhs), op, self._convert(relation.lhs))
        raise self._refuse(relation)

    def _convert(self, e: Any) -> SizeExpr:
        from torch.utils._sympy import functions as F

        if isinstance(e, sympy.Integer) or (isinstance(e, sympy.Number) and e == int(e)):
            return SizeExpr.const(int(e))
        if isinstance(e, sympy.Symbol):
            name = self.rename.get(str(e), str(e))
            if name in self.unbounded:
                raise self._unbounded(name)
            if name not in self.ranges:
                raise self._refuse(e)
            return SizeExpr.sym(name)
        if isinstance(e, (sympy.Add, sympy.Mul)):
            op = "+" if isinstance(e, sympy.Add) else "*"
            args = sorted(e.args, key=lambda a: (not a.is_Number, str(a)))
            if op == "+":  # constants last: s + 1 rather than 1 + s
                args = [a for a in args if not a.is_Number] + [a for a in args if a.is_Number]
            result = self._convert(args[0])
            for arg in args[1:]:
                result = SizeExpr(op, (result, self._convert(arg)))
            return result
        if isinstance(e, sympy.Pow) and e.exp.is_Integer and 1 <= int(e.exp) <= _MAX_POWER:
            base = self._convert(e.base)
            result = base
            for _ in range(int(e.exp) - 1):
                result = SizeExpr("*", (result, base))
            return result
        calls = {F.FloorDiv: "floordiv", sympy.Mod: "mod", sympy.Max: "max", sympy.Min: "min"}
        for name in ("PythonMod", "Mod"):
            if hasattr(F, name):
                calls[getattr(F, name)] = "mod"
        for kind, op in calls.items():
            if isinstance(e, kind):
                result = self._convert(e.args[0])
                for arg in e.args[1:]:
                    result = SizeExpr(op, (result, self._convert(arg)))
                return result
        raise self._refuse(e)

    def _unbounded(self, name: str) -> ExportError:
        low, high = self.unbounded[name]
        made = self.made_at.get(name, "nonzero, masked_select, .item() or the like")
        return ExportError(
            f"`opforge.export.export()`: method {self.method_name!r} — data-dependent size "
            f"{name} (made by {made}) with range [{low}, "
            f"{high}]: no upper bound — valid: data-dependent sizes with a finite upper bound "
            "(memory is planned at it, and each call checks it) — fix: bound it in the model "
            f"where the size is made, e.g. `n = int(t.item()); torch._check(n >= 0); "
            f"torch._check(n <= 64)` (64: the largest size a call may need)")

    def _refuse(self, e: Any) -> ExportError:
        return ExportError(
            f"`opforge.export.export(dynamic_shapes=...)`: method {self.method_name!r} — size "
            f"expression {e} ({type(e).__name__}) — valid: integers, the method's symbols, "
            "+, -, *, floor division, modulo, min, max — fix: keep size arithmetic to these "
            "(no true division, no data-dependent sizes), or export this method with static "
            "shapes")


def _unbacked(symbol: Any) -> bool:
    from torch.utils._sympy.symbol import SymT, symbol_is_type

    return symbol_is_type(symbol, SymT.UNBACKED_INT)


def _finite(bound: Any) -> bool:
    try:
        return abs(int(bound)) < 2**62
    except Exception:  # noqa: BLE001 - torch's int_oo and sympy's oo refuse int() variously
        return False


def _sized_by(symbol: str, user_inputs: dict[str, Any]) -> str:
    """``input 'x' dimension 0`` for the first user input dimension that reads ``symbol``."""
    for name, fake in user_inputs.items():
        for dim, size in enumerate(getattr(fake, "shape", ())):
            if isinstance(size, torch.SymInt) and symbol in {str(s) for s in size.node.expr.free_symbols}:
                return f"input {name!r} dimension {dim}"
    return f"symbol {symbol}"
