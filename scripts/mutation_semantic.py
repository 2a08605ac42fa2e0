"""Semantic mutation operators for the Python code of scripts/mutation_test.py (the
engine's C++ ones are in scripts/mutation_cpp.py; docs/testing.md lists both)."""

from __future__ import annotations

import ast
import copy

# Semantic operators (issue 45; scripts/mutation_cpp.py has the engine's): the mistakes this
# code base's authors could plausibly make, beyond a flipped operator.
#   swap operands    `max(a, b)` -> `max(b, a)` (min, np.maximum, np.fmax ... alike: which
#                    operand a NaN or a tie returns); `np.clip(x, lo, hi)` -> `(x, hi, lo)`
#   drop term        `a + b` -> `b` and -> `a`: a term of a sum or a bound forgotten
#   drop zeroing     `np.zeros` -> `np.empty`, `zeros_like` -> `empty_like`, a `.fill(...)`,
#                    `memset(...)` or `zero(...)` statement -> `pass`
#   drop check       `a or b` -> `a` and -> `b` (`and` alike); an `if ...: raise` -> `pass`
#   shrink bound     `range(n)` -> `range(n - 1)`, `while i < n` -> `while i < n - 1`
#   first byte only  `(x_address, size)` -> `(x_address, 1)`: a span compared, zeroed or
#                    copied by its first byte
SEMANTIC = ("swap operands", "drop term", "drop zeroing", "drop check", "shrink bound",
            "first byte only", "drop update")
_SWAP_ARGS = {"max": (0, 1), "min": (0, 1), "maximum": (0, 1), "minimum": (0, 1),
              "fmax": (0, 1), "fmin": (0, 1), "clip": (1, 2)}
_EMPTY = {"zeros": "empty", "zeros_like": "empty_like"}
_ZEROING_CALLS = {"fill", "memset", "zero"}


def semantic(node: ast.AST):
    """``(operator, new node or source)`` of each semantic mutant of ``node``."""
    if isinstance(node, ast.Call) and not any(isinstance(a, ast.Starred) for a in node.args):
        name = called_name(node)
        pair = _SWAP_ARGS.get(name)
        if pair and len(node.args) > pair[1] and all(
                any(isinstance(n, (ast.Name, ast.Attribute, ast.Call)) for n in ast.walk(a))
                for a in node.args[pair[0]:pair[1] + 1]):  # (`max(256, n)`: an int, no NaN)
            new = copy.deepcopy(node)
            i, j = pair
            new.args[i], new.args[j] = new.args[j], new.args[i]
            yield "swap operands", new
        if name in _EMPTY:
            new = copy.deepcopy(node)
            if isinstance(new.func, ast.Attribute):
                new.func.attr = _EMPTY[name]
            else:
                new.func.id = _EMPTY[name]
            yield "drop zeroing", new
        if name == "range" and 1 <= len(node.args) <= 2:
            new = copy.deepcopy(node)
            stop = len(node.args) - 1
            new.args[stop] = ast.BinOp(new.args[stop], ast.Sub(), ast.Constant(1))
            yield "shrink bound", new
    elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and \
            called_name(node.value) in _ZEROING_CALLS:
        yield "drop zeroing", "pass"
    elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        yield "drop term", copy.deepcopy(node.right)
        yield "drop term", copy.deepcopy(node.left)
    elif isinstance(node, ast.BoolOp):
        for i in range(len(node.values)):
            rest = [copy.deepcopy(v) for k, v in enumerate(node.values) if k != i]
            yield "drop check", rest[0] if len(rest) == 1 else ast.BoolOp(node.op, rest)
    elif isinstance(node, ast.If) and not node.orelse and len(node.body) == 1 and \
            isinstance(node.body[0], ast.Raise):
        yield "drop check", "pass"
    elif isinstance(node, ast.While) and isinstance(node.test, ast.Compare) and \
            len(node.test.ops) == 1 and isinstance(node.test.ops[0], (ast.Lt, ast.LtE)):
        new = copy.deepcopy(node.test)
        new.comparators[0] = ast.BinOp(new.comparators[0], ast.Sub(), ast.Constant(1))
        yield "shrink bound", ("test", new)
    elif isinstance(node, ast.Tuple) and isinstance(node.ctx, ast.Load) and len(node.elts) == 2 and \
            isinstance(node.elts[0], (ast.Name, ast.Attribute)) and \
            (getattr(node.elts[0], "id", None) or node.elts[0].attr).endswith("address") and \
            not (isinstance(node.elts[1], ast.Constant) and node.elts[1].value == 1):
        new = copy.deepcopy(node)
        new.elts[1] = ast.Constant(1)
        yield "first byte only", new



def called_name(call: ast.Call) -> str:
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
