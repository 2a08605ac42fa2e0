"""Symbolic sizes: symbols with bounds, size expressions over them, guards, and state slots.

# Design
#
# A method with dynamic shapes declares its symbols (``Symbol``: a name and an inclusive
# range ``[min, max]``) and gives, for each value whose sizes depend on them, one
# ``SizeExpr`` per size (``SymbolicValue``). The value table itself keeps plain integers:
# a tensor's ``sizes`` are its sizes at the upper bound, which is what the memory plan gave
# it a slot for, and an ``int``/``int[]`` argument keeps its value at the export example.
# A runtime that ignores the symbolic part runs the program at the upper bound; one that
# honours it binds the symbols from the inputs' sizes per call and evaluates each
# expression.
#
# Expressions are plain data: a tree of ``SizeExpr(op, args)`` nodes with the operators
# ``int``, ``sym``, ``+``, ``-``, ``*``, ``floordiv``, ``mod``, ``min``, ``max``. The file
# stores an expression as its printed text, which ``SizeExpr.parse`` reads back exactly
# (``str(SizeExpr.parse(s)) == s``, asserted): integers in decimal, symbols by name,
# ``(a + b)``, ``(a - b)``, ``(a * b)`` always parenthesised, and ``floordiv(a, b)``,
# ``mod(a, b)``, ``min(a, b)``, ``max(a, b)``. Size and depth are capped
# (``MAX_EXPR_NODES``, ``MAX_EXPR_DEPTH``, ``MAX_EXPR_TEXT``) so a hostile file cannot make
# the parser or the evaluator recurse or loop without bound. ``floordiv`` and ``mod`` round
# toward negative infinity (Python's and sympy's ``FloorDiv``/``Mod``); a zero divisor is an
# evaluation error, never a crash.
#
# ``bounds(ranges)`` is interval arithmetic: the exporter sizes each tensor's slot with it and
# the verifier checks the same numbers, so the two agree by construction.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from opforge.program._errors import program_error

__all__ = [
    "SizeExpr", "Symbol", "Guard", "SymbolicValue", "StateSlot", "GUARD_RELATIONS",
    "BindStep", "binding_plan", "linear_form", "growing_values",
    "MAX_EXPR_NODES", "MAX_EXPR_DEPTH", "MAX_EXPR_TEXT", "MAX_SYMBOLS",
]

MAX_EXPR_NODES = 64
MAX_EXPR_DEPTH = 16
MAX_EXPR_TEXT = 1024
MAX_SYMBOLS = 64
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_BINARY = {"+": "+", "-": "-", "*": "*"}
_CALLS = ("floordiv", "mod", "min", "max")
OPS = ("int", "sym", "+", "-", "*", *_CALLS)
_TOKEN = re.compile(r"\s*(?:(-?\d+)|([A-Za-z_][A-Za-z0-9_]*)|(\S))")


def _floordiv(a: int, b: int) -> int:
    if b == 0:
        raise ZeroDivisionError("floordiv by zero")
    return a // b


def _mod(a: int, b: int) -> int:
    if b == 0:
        raise ZeroDivisionError("mod by zero")
    return a % b


_EVAL = {
    "+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
    "floordiv": _floordiv, "mod": _mod, "min": min, "max": max,
}


@dataclass(frozen=True, slots=True)
class SizeExpr:
    """A size expression: ``SizeExpr("int", (7,))``, ``SizeExpr("sym", ("s0",))`` or an
    operator (``+ - * floordiv mod min max``) applied to two ``SizeExpr`` arguments.

    >>> e = SizeExpr.parse("((2 * s0) + 1)")
    >>> e.evaluate({"s0": 5}), e.bounds({"s0": (1, 8)}), str(e)
    (11, (3, 17), '((2 * s0) + 1)')
    """

    op: str
    args: tuple

    def __post_init__(self) -> None:
        op, args = self.op, self.args
        if type(args) is not tuple:
            raise program_error("`SizeExpr`: args", type(args).__name__, "a tuple")
        if op == "int":
            if len(args) != 1 or type(args[0]) is not int or not _INT64_MIN <= args[0] <= _INT64_MAX:
                raise program_error("`SizeExpr`: int", repr(args), "one int64")
            depth, nodes = 1, 1
        elif op == "sym":
            if len(args) != 1 or type(args[0]) is not str or not _NAME.match(args[0]):
                raise program_error("`SizeExpr`: sym", repr(args), "one identifier")
            depth, nodes = 1, 1
        elif op in _EVAL:
            if len(args) != 2 or not all(type(a) is SizeExpr for a in args):
                raise program_error(f"`SizeExpr`: {op}", repr(args), "two SizeExpr arguments")
            depth = 1 + max(a.depth for a in args)
            nodes = 1 + sum(a.nodes for a in args)
        else:
            raise program_error("`SizeExpr`: op", repr(op), ", ".join(OPS))
        if depth > MAX_EXPR_DEPTH or nodes > MAX_EXPR_NODES:
            raise program_error("`SizeExpr`", f"depth {depth}, {nodes} nodes",
                                f"depth at most {MAX_EXPR_DEPTH}, at most {MAX_EXPR_NODES} nodes",
                                "the file is corrupt or hostile; re-export it")
        object.__setattr__(self, "_depth", depth)
        object.__setattr__(self, "_nodes", nodes)

    _depth: int = field(default=0, init=False, repr=False, compare=False)
    _nodes: int = field(default=0, init=False, repr=False, compare=False)

    # constructors ---------------------------------------------------------------------
    @staticmethod
    def const(value: int) -> "SizeExpr":
        return SizeExpr("int", (value,))

    @staticmethod
    def sym(name: str) -> "SizeExpr":
        return SizeExpr("sym", (name,))

    @property
    def depth(self) -> int:
        return self._depth

    @property
    def nodes(self) -> int:
        return self._nodes

    @property
    def is_const(self) -> bool:
        return self.op == "int"

    def symbols(self) -> set[str]:
        """Names of the symbols the expression reads."""
        if self.op == "sym":
            return {self.args[0]}
        if self.op == "int":
            return set()
        return self.args[0].symbols() | self.args[1].symbols()

    # evaluation -----------------------------------------------------------------------
    def evaluate(self, env: dict[str, int]) -> int:
        """The value with symbols bound by ``env``; KeyError for an unbound symbol,
        ZeroDivisionError for a zero divisor."""
        op = self.op
        if op == "int":
            return self.args[0]
        if op == "sym":
            return env[self.args[0]]
        return _EVAL[op](self.args[0].evaluate(env), self.args[1].evaluate(env))

    def bounds(self, ranges: dict[str, tuple[int, int]]) -> tuple[int, int]:
        """Inclusive ``(low, high)`` over all symbol values in ``ranges`` (interval
        arithmetic: exact for one occurrence of each symbol, an enclosure otherwise)."""
        op = self.op
        if op == "int":
            return self.args[0], self.args[0]
        if op == "sym":
            return ranges[self.args[0]]
        (al, ah), (bl, bh) = self.args[0].bounds(ranges), self.args[1].bounds(ranges)
        if op == "+":
            return al + bl, ah + bh
        if op == "-":
            return al - bh, ah - bl
        if op == "*" or (op == "floordiv" and (bl > 0 or bh < 0)):
            fn = (lambda x, y: x * y) if op == "*" else (lambda x, y: x // y)
            corners = [fn(al, bl), fn(al, bh), fn(ah, bl), fn(ah, bh)]
            return min(corners), max(corners)
        if op == "mod" and bl > 0:
            return (0, bh - 1) if al < 0 or ah >= bl else (al, ah)
        if op == "min":
            return min(al, bl), min(ah, bh)
        if op == "max":
            return max(al, bl), max(ah, bh)
        raise ZeroDivisionError(f"{op} whose divisor may be zero or change sign: {self}")

    # text -----------------------------------------------------------------------------
    def __str__(self) -> str:
        op = self.op
        if op == "int":
            return str(self.args[0])
        if op == "sym":
            return self.args[0]
        a, b = self.args
        if op in _BINARY:
            return f"({a} {op} {b})"
        return f"{op}({a}, {b})"

    @staticmethod
    def parse(text: str) -> "SizeExpr":
        """Read the printed form back; ``str(SizeExpr.parse(s)) == s`` (asserted)."""
        if type(text) is not str or not text or len(text) > MAX_EXPR_TEXT:
            raise program_error("`SizeExpr.parse`", repr(text)[:80],
                                f"a non-empty expression of at most {MAX_EXPR_TEXT} characters")
        tokens = _tokens(text)
        expr, pos = _parse(tokens, 0, 0, text)
        if pos != len(tokens):
            raise _syntax(text, f"trailing {tokens[pos][1]!r}")
        if str(expr) != text:
            raise program_error("`SizeExpr.parse`", repr(text), f"the canonical form {str(expr)!r}",
                                "write expressions as SizeExpr prints them")
        return expr


def _syntax(text: str, what: str):
    return program_error("`SizeExpr.parse`", f"{text[:80]!r}: {what}",
                         "ints, symbols, (a + b), (a - b), (a * b), floordiv/mod/min/max(a, b)")


def _tokens(text: str) -> list[tuple[str, object]]:
    tokens, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:  # only trailing whitespace is left
            break
        pos = m.end()
        if m.group(1) is not None:
            tokens.append(("int", int(m.group(1))))
        elif m.group(2) is not None:
            tokens.append(("name", m.group(2)))
        else:
            tokens.append(("punct", m.group(3)))
    return tokens


def _parse(tokens: list, pos: int, depth: int, text: str) -> tuple[SizeExpr, int]:
    if depth >= MAX_EXPR_DEPTH:
        raise _syntax(text, f"nested deeper than {MAX_EXPR_DEPTH}")
    if pos >= len(tokens):
        raise _syntax(text, "ends too early")
    kind, tok = tokens[pos]
    if kind == "int":
        if not _INT64_MIN <= tok <= _INT64_MAX:
            raise _syntax(text, f"{tok} is not an int64")
        return SizeExpr.const(tok), pos + 1
    if kind == "name":
        if tok in _CALLS and pos + 1 < len(tokens) and tokens[pos + 1] == ("punct", "("):
            a, pos = _parse(tokens, pos + 2, depth + 1, text)
            pos = _expect(tokens, pos, ",", text)
            b, pos = _parse(tokens, pos, depth + 1, text)
            pos = _expect(tokens, pos, ")", text)
            return SizeExpr(tok, (a, b)), pos
        return SizeExpr.sym(tok), pos + 1
    if tok == "(":
        a, pos = _parse(tokens, pos + 1, depth + 1, text)
        if pos >= len(tokens) or tokens[pos][0] != "punct" or tokens[pos][1] not in _BINARY:
            raise _syntax(text, "expected + - or * inside parentheses")
        op = tokens[pos][1]
        b, pos = _parse(tokens, pos + 1, depth + 1, text)
        pos = _expect(tokens, pos, ")", text)
        return SizeExpr(op, (a, b)), pos
    raise _syntax(text, f"unexpected {tok!r}")


def _expect(tokens: list, pos: int, punct: str, text: str) -> int:
    if pos >= len(tokens) or tokens[pos] != ("punct", punct):
        raise _syntax(text, f"expected {punct!r}")
    return pos + 1


@dataclass(frozen=True, slots=True)
class Symbol:
    """A dynamic dimension: ``name`` and its inclusive range ``[min, max]``.

    ``grow`` (format version 4) opts the dimension into growing memory: the tensors whose
    sizes read it are not planned at ``max`` but live outside the arenas, allocated at their
    sizes at the export example and grown geometrically by the runtime when a call needs
    more (``growing_values``; bounded by the memory limit).

    >>> Symbol("s0", 1, 16)
    Symbol(name='s0', min=1, max=16, grow=False)
    """

    name: str
    min: int
    max: int
    grow: bool = False

    def __post_init__(self) -> None:
        if type(self.name) is not str or not _NAME.match(self.name):
            raise program_error("`Symbol`: name", repr(self.name), "an identifier")
        if type(self.grow) is not bool:
            raise program_error("`Symbol`: grow", repr(self.grow), "a bool")
        for name in ("min", "max"):
            v = getattr(self, name)
            if type(v) is not int or not 0 <= v <= _INT64_MAX:
                raise program_error(f"`Symbol`: {name}", repr(v), "an int in [0, 2**63 - 1]")
        if self.min > self.max:
            raise program_error("`Symbol`", f"{self.name} in [{self.min}, {self.max}]",
                                "min <= max")


GUARD_RELATIONS = ("==", "!=", "<=", "<")


@dataclass(frozen=True, slots=True)
class Guard:
    """A condition on the symbols every call must meet: ``lhs relation rhs``, with
    ``relation`` one of ``==``, ``!=``, ``<=``, ``<`` (torch.export's recorded guards)."""

    lhs: SizeExpr
    relation: str
    rhs: SizeExpr

    def __post_init__(self) -> None:
        if type(self.lhs) is not SizeExpr or type(self.rhs) is not SizeExpr:
            raise program_error("`Guard`", f"{self.lhs!r}, {self.rhs!r}", "two SizeExprs")
        if self.relation not in GUARD_RELATIONS:
            raise program_error("`Guard`: relation", repr(self.relation),
                                ", ".join(GUARD_RELATIONS))

    def holds(self, env: dict[str, int]) -> bool:
        a, b = self.lhs.evaluate(env), self.rhs.evaluate(env)
        rel = self.relation
        return a == b if rel == "==" else a != b if rel == "!=" else a <= b if rel == "<=" else a < b

    def __str__(self) -> str:
        return f"{self.lhs} {self.relation} {self.rhs}"


@dataclass(frozen=True, slots=True)
class SymbolicValue:
    """The sizes of ``Method.values[value]`` as expressions: one per dimension of a
    ``TensorValue``, one for an ``IntValue``, one per element of an ``IntListValue``."""

    value: int
    exprs: tuple[SizeExpr, ...]

    def __post_init__(self) -> None:
        if type(self.value) is not int or not 0 <= self.value < 2**32:
            raise program_error("`SymbolicValue`: value", repr(self.value), "a value index")
        exprs = tuple(self.exprs) if isinstance(self.exprs, list) else self.exprs
        if type(exprs) is not tuple or not all(type(e) is SizeExpr for e in exprs):
            raise program_error("`SymbolicValue`: exprs", repr(self.exprs), "a tuple of SizeExpr")
        object.__setattr__(self, "exprs", exprs)


@dataclass(frozen=True, slots=True)
class StateSlot:
    """A state tensor of a method: the tensor ``values[value]`` (a constant: its initial
    value) is program state called ``name``. At run time every method of a loaded program
    that names the same state reads and writes one live copy of it."""

    name: str
    value: int

    def __post_init__(self) -> None:
        if type(self.name) is not str or not self.name or len(self.name) > 256:
            raise program_error("`StateSlot`: name", repr(self.name), "a non-empty str")
        if type(self.value) is not int or not 0 <= self.value < 2**32:
            raise program_error("`StateSlot`: value", repr(self.value), "a value index")


def linear_form(expr: SizeExpr) -> tuple[str, int, int] | None:
    """``(symbol, a, b)`` when ``expr`` is ``a * symbol + b`` with ``a != 0`` (built from
    one symbol, integers, ``+``, ``-`` and ``*`` by an integer), else None."""
    op = expr.op
    if op == "sym":
        return expr.args[0], 1, 0
    if op not in ("+", "-", "*"):
        return None
    left, right = expr.args
    if op == "*":
        if left.is_const or right.is_const:
            k, other = (left.args[0], right) if left.is_const else (right.args[0], left)
            inner = linear_form(other)
            if inner is None or k == 0:
                return None
            return inner[0], inner[1] * k, inner[2] * k
        return None
    sign = 1 if op == "+" else -1
    if right.is_const:
        inner = linear_form(left)
        return None if inner is None else (inner[0], inner[1], inner[2] + sign * right.args[0])
    if left.is_const and op == "+":
        inner = linear_form(right)
        return None if inner is None else (inner[0], inner[1], inner[2] + left.args[0])
    return None


@dataclass(frozen=True, slots=True)
class BindStep:
    """One step of binding symbols from input sizes: dimension ``dim`` of input number
    ``position`` is ``expr``; when ``symbol`` is set, it is bound there from
    ``(size - b) / a`` (and must divide evenly); otherwise the size is checked against
    ``expr``."""

    position: int
    dim: int
    expr: SizeExpr
    symbol: str | None = None
    a: int = 1
    b: int = 0


def binding_plan(method) -> tuple[BindStep, ...]:
    """How a call binds ``method``'s symbols from its inputs' sizes: every input dimension
    with an expression, the first that determines each symbol binding it. A symbol no input
    dimension determines must be produced by an instruction (``produced.producers``: a
    data-dependent size); ProgramError otherwise."""
    symbolic = {sv.value: sv.exprs for sv in method.symbolic_values}
    steps: list[BindStep] = []
    bound: set[str] = set()
    pending: list[tuple[int, int, SizeExpr]] = []
    for position, index in enumerate(method.inputs):
        for dim, expr in enumerate(symbolic.get(index, ())):
            if expr.is_const:
                continue
            pending.append((position, dim, expr))
    # bind from linear dimensions first (torch's derived dims: 2*s, s+1), then check the rest
    for position, dim, expr in pending:
        form = linear_form(expr)
        if form is not None and form[0] not in bound:
            bound.add(form[0])
            steps.append(BindStep(position, dim, expr, form[0], form[1], form[2]))
    done = {(s.position, s.dim) for s in steps}
    steps.extend(BindStep(p, d, e) for p, d, e in pending if (p, d) not in done)
    missing = [s.name for s in method.symbols if s.name not in bound]
    if missing:  # data-dependent sizes: each must be produced by an instruction
        from opforge.program.produced import producers

        producers(method, missing)
    return tuple(steps)


def growing_values(method) -> frozenset[int]:
    """Indices of ``method``'s growing tensors: symbolic tensors without storage whose sizes
    read a growing symbol (``Symbol.grow``). The runtime allocates them outside the arenas."""
    grow = {s.name for s in method.symbols if s.grow}
    if not grow:
        return frozenset()
    values = method.values
    return frozenset(
        sv.value for sv in method.symbolic_values
        if sv.value < len(values) and type(values[sv.value]).__name__ == "TensorValue"
        and values[sv.value].storage is None
        and any(grow.intersection(e.symbols()) for e in sv.exprs))
