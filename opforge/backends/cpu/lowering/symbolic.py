"""Symbolic sizes inside the lowering: a delegate of a dynamic method is lowered once, with
each symbolic size a ``SymDim``, and the plan records expressions where sizes vary.

# Design
#
# A ``SymDim`` is a polynomial with integer coefficients over the method's symbols (each
# with its inclusive range from the program's symbol table). It supports what the lowering
# does with sizes: ``+ - *`` with ints and other ``SymDim``s, exact division by an int, and
# comparisons. A comparison is answered only when it has the same answer for every value
# of the symbols in their ranges: two polynomials that are equal term by term are equal,
# and a difference whose interval bounds exclude zero (or the sign asked for) decides the
# rest. Anything else, ``int(d)`` included, raises ``Unsupported`` naming the size: a
# lowering decision that depends on the concrete size refuses the node instead of
# specialising it at the export example. ``expr`` writes the polynomial in the program's
# size-expression form (``opforge.program.symbolic.SizeExpr``), which the blob stores as
# text; at run time the backend evaluates those texts per shape (``cpu/dynamic.py``).
"""

from __future__ import annotations

from typing import Any

from opforge.backends.cpu.lowering.unsupported import Unsupported
from opforge.program.symbolic import SizeExpr

__all__ = ["SymDim", "to_dim", "is_symbolic_dim", "expr_text", "same", "known",
           "reads_symbolic_sizes"]

_Mono = tuple  # ((symbol, exponent), ...) sorted by symbol


def _mono_mul(a: _Mono, b: _Mono) -> _Mono:
    exps = dict(a)
    for name, e in b:
        exps[name] = exps.get(name, 0) + e
    return tuple(sorted(exps.items()))


class SymDim:
    """A size that depends on the method's symbols: ``terms`` maps each monomial to its
    coefficient (no zeros, never only a constant: that is a plain ``int``)."""

    __slots__ = ("terms", "ranges")

    def __init__(self, terms: dict, ranges: dict[str, tuple[int, int]]) -> None:
        self.terms = terms
        self.ranges = ranges

    # --- construction ------------------------------------------------------------------
    @staticmethod
    def make(terms: dict, ranges) -> "int | SymDim":
        terms = {m: c for m, c in terms.items() if c}
        if not any(m for m in terms):
            return terms.get((), 0)
        return SymDim(terms, ranges)

    @staticmethod
    def symbol(name: str, ranges) -> "SymDim":
        return SymDim({((name, 1),): 1}, ranges)

    @staticmethod
    def from_expr(expr: SizeExpr, ranges) -> "int | SymDim":
        op, args = expr.op, expr.args
        if op == "int":
            return args[0]
        if op == "sym":
            return SymDim.symbol(args[0], ranges)
        a, b = (SymDim.from_expr(x, ranges) for x in args)
        if op == "+":
            return a + b
        if op == "-":
            return a - b
        if op == "*":
            return a * b
        if op == "floordiv" and type(b) is int:
            return a // b
        raise Unsupported("shape", f"the size {expr} ({op} of a symbolic size): the cpu "
                          "backend takes sums and products of the symbols; stays on the kernels")

    # --- arithmetic ---------------------------------------------------------------------
    def _terms_of(self, other) -> dict | None:
        if isinstance(other, SymDim):
            return other.terms
        if type(other) is int:
            return {(): other} if other else {}
        return None

    def __add__(self, other):
        terms = self._terms_of(other)
        if terms is None:
            return NotImplemented
        out = dict(self.terms)
        for m, c in terms.items():
            out[m] = out.get(m, 0) + c
        return SymDim.make(out, self.ranges)

    __radd__ = __add__

    def __neg__(self):
        return SymDim.make({m: -c for m, c in self.terms.items()}, self.ranges)

    def __sub__(self, other):
        terms = self._terms_of(other)
        return NotImplemented if terms is None else self + (-SymDim.make(terms, self.ranges)
                                                            if terms else 0)

    def __rsub__(self, other):
        return (-self) + other

    def __mul__(self, other):
        terms = self._terms_of(other)
        if terms is None:
            return NotImplemented
        out: dict = {}
        for m1, c1 in self.terms.items():
            for m2, c2 in terms.items():
                m = _mono_mul(m1, m2)
                out[m] = out.get(m, 0) + c1 * c2
        return SymDim.make(out, self.ranges)

    __rmul__ = __mul__

    def __floordiv__(self, other):
        if type(other) is int and other > 0 and all(c % other == 0 for c in self.terms.values()):
            return SymDim.make({m: c // other for m, c in self.terms.items()}, self.ranges)
        if isinstance(other, SymDim) and self == other:
            return 1
        raise self._refuse(f"divided by {other}")

    def __mod__(self, other):
        if type(other) is int and other > 0 and all(c % other == 0 for c in self.terms.values()):
            return 0
        raise self._refuse(f"modulo {other}")

    # --- decisions ----------------------------------------------------------------------
    def bounds(self) -> tuple[int, int]:
        """Interval bounds over the symbols' ranges (all symbols are >= 0)."""
        lo = hi = 0
        for mono, coef in self.terms.items():
            m_lo = m_hi = 1
            for name, e in mono:
                s_lo, s_hi = self.ranges[name]
                m_lo, m_hi = m_lo * s_lo ** e, m_hi * s_hi ** e
            lo += coef * (m_lo if coef > 0 else m_hi)
            hi += coef * (m_hi if coef > 0 else m_lo)
        return lo, hi

    def _sign(self, other, why: str) -> tuple[int, int]:
        diff = self - other
        return (diff, diff) if type(diff) is int else diff.bounds()

    def __eq__(self, other):
        if self._terms_of(other) is None:
            return NotImplemented
        lo, hi = self._sign(other, "==")
        if lo == hi == 0:
            return True
        if lo > 0 or hi < 0:
            return False
        raise self._refuse(f"compared with {other}")

    def __ne__(self, other):
        result = self.__eq__(other)
        return result if result is NotImplemented else not result

    def __lt__(self, other):
        lo, hi = self._sign(other, "<")
        if hi < 0 or lo >= 0:
            return hi < 0
        raise self._refuse(f"compared with {other}")

    def __le__(self, other):
        lo, hi = self._sign(other, "<=")
        if hi <= 0 or lo > 0:
            return hi <= 0
        raise self._refuse(f"compared with {other}")

    def __gt__(self, other):
        lo, hi = self._sign(other, ">")
        if lo > 0 or hi <= 0:
            return lo > 0
        raise self._refuse(f"compared with {other}")

    def __ge__(self, other):
        lo, hi = self._sign(other, ">=")
        if lo >= 0 or hi < 0:
            return lo >= 0
        raise self._refuse(f"compared with {other}")

    def __bool__(self):
        return self != 0

    def __hash__(self):
        return hash(tuple(sorted(self.terms.items())))

    def __int__(self):
        raise self._refuse("needed as one number")

    __index__ = __int__

    def __float__(self):
        raise self._refuse("used as a number in arithmetic")

    def _refuse(self, what: str) -> Unsupported:
        lo, hi = self.bounds()
        return Unsupported("shape", f"the dynamic size {self.expr()} (in [{lo}, {hi}]) {what}: "
                           "the lowering would have to specialise it; stays on the kernels")

    # --- output -------------------------------------------------------------------------
    def expr(self) -> SizeExpr:
        """The polynomial as a ``SizeExpr``: its terms summed, each ``coef * s * t ...``."""
        result = None
        for mono, coef in sorted(self.terms.items(), key=lambda t: (len(t[0]) == 0, t[0])):
            term = None
            for name, e in mono:
                for _ in range(e):
                    s = SizeExpr.sym(name)
                    term = s if term is None else SizeExpr("*", (term, s))
            if term is None:
                term = SizeExpr.const(abs(coef))
            elif abs(coef) != 1:
                term = SizeExpr("*", (SizeExpr.const(abs(coef)), term))
            if result is None:
                result = term if coef > 0 else SizeExpr("-", (SizeExpr.const(0), term))
            else:
                result = SizeExpr("+" if coef > 0 else "-", (result, term))
        return result

    def __repr__(self) -> str:
        return str(self.expr())


def is_symbolic_dim(value: Any) -> bool:
    return isinstance(value, SymDim)


def to_dim(value: Any, table: Any):
    """An int, or a ``SymDim`` for a torch ``SymInt`` / the exporter's ``SymSize``."""
    if isinstance(value, SymDim) or type(value) is int:
        return value
    if isinstance(value, bool):
        return int(value)
    if table is None:
        return int(value)
    if hasattr(value, "expr") and hasattr(value, "hint"):  # export.symbolic.SymSize
        return SymDim.from_expr(value.expr, table.ranges)
    import torch

    if isinstance(value, torch.SymInt):
        return SymDim.from_expr(table.expr_of(value), table.ranges)
    return int(value)


def in_range(values, lo: int, hi: int) -> None:
    """Refuse (``Unsupported``) a symbolic size whose bounds over the symbols' ranges leave
    [lo, hi]: the blob's load would refuse it (``cpu/dynamic.py`` checks the same bounds of
    the same expression text), so the node stays on the kernels instead."""
    for v in values:
        if isinstance(v, SymDim):
            low, high = v.bounds()
            if low < lo or high > hi:
                raise Unsupported("shape", f"the dynamic size {v.expr()} spans [{low}, {high}] "
                                  f"over the symbols' ranges, outside [{lo}, {hi}]; stays on "
                                  "the kernels")


def symbols_of(values) -> set[str]:
    """The symbols the ``SymDim``s among ``values`` read."""
    return {name for v in values if isinstance(v, SymDim) for mono in v.terms for name, _ in mono}


def expr_text(value: Any) -> Any:
    """A plan number for the blob: an int as is, a ``SymDim`` as its expression text."""
    return str(value.expr()) if isinstance(value, SymDim) else value


# --- what the lowering asks of sizes that may be symbolic -----------------------------------

def _is_one(d) -> bool:
    """``d == 1`` for a plain size; a symbolic size counts as not 1 (what holds for its
    general value: a layout dense for it is dense at 1 too)."""
    return type(d) is int and d == 1


def same(a, b) -> bool:
    """``a == b`` for every value of the symbols: equal ints, or sizes (tuples of them)
    whose difference is identically zero; never raises (unknown counts as different)."""
    if isinstance(a, (tuple, list)) or isinstance(b, (tuple, list)):
        return (isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)) and len(a) == len(b)
                and all(same(x, y) for x, y in zip(a, b)))
    if type(a) is int and type(b) is int:
        return a == b
    diff = a - b
    return type(diff) is int and diff == 0


def known(test) -> bool:
    """``test()``, or False when it depends on a symbolic size (the lowering then takes the
    general path, e.g. a copy it might have skipped)."""
    try:
        return bool(test())
    except Unsupported:
        return False


def _at_least_one(d):
    if type(d) is not int and not isinstance(d, SymDim):  # a torch SymInt: never probe it
        raise Unsupported("shape", f"the size {d} reached the lowering unconverted")
    return max(d, 1) if type(d) is int else d if d >= 1 else 1


def reads_symbolic_sizes(lowering, node, args, kwargs) -> bool:
    """Whether ``node`` reads or makes a symbolic size (its result's shape, an argument, or
    an operand's dims, strides or offset in the plan)."""
    import torch

    def walk(v) -> bool:
        if isinstance(v, (list, tuple)):
            if len(v) == 2 and v[0] == "t" and type(v[1]) is int:
                t = lowering.spec(v[1])
                return any(is_symbolic_dim(d) for d in (*t.dims, *t.strides, t.offset))
            return any(walk(x) for x in v)
        return is_symbolic_dim(v) or isinstance(v, torch.SymInt)
    vals = node.meta.get("val")
    vals = vals if isinstance(vals, (tuple, list)) else [vals]
    return (any(isinstance(v, torch.Tensor) and any(isinstance(d, torch.SymInt) for d in v.shape)
                for v in vals) or walk(args) or walk(list(kwargs.values())))
