"""C++ mutants for scripts/mutation_test.py: the cpu backend's engine sources (the
design is in the comment below; docs/testing.md describes the run)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

# --- C++ (the cpu backend's engine) ------------------------------------------------------------
#
# The engine's sources are mutated as text, inside the named functions only (found by their
# name and brace matching; comments and string literals are skipped): a comparison flipped at
# its boundary (`a < b` -> `a <= b`, ...), `==` / `!=`, `&&` / `||`, `+` / `-` between spaced
# operands, an integer literal off by one, a `!` dropped, `true` / `false` flipped. Operators
# are matched with spaces around them, as the engine is written, so template brackets and
# shifts are never touched. Each mutant is first compiled alone (`-fsyntax-only` against
# oneDNN's headers); one that does not compile is "stillborn", not counted as killed. The
# tests then rebuild the engine through the build cache (the copy has no installed engine:
# `library()` compiles the mutated sources on first use).

_CPP_TOKEN = re.compile(r"""//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'"""
                        r"| (<=|>=|<|>|==|!=|&&|\|\||\+|-) |\b(true|false)\b|(?<![\w.])(\d+)(?![\w.])"
                        r"|(?<=[(\s])!(?=[\w(])", re.S)
_CPP_SWAP = {"<": "<=", "<=": "<", ">": ">=", ">=": ">", "==": "!=", "!=": "==", "&&": "||",
             "||": "&&", "+": "-", "-": "+", "true": "false", "false": "true"}


def _cpp_functions(text: str) -> dict[str, tuple[int, int]]:
    """name -> (start, end) byte span of each function body defined at namespace level."""
    found = {}
    for m in re.finditer(r"^[A-Za-z_][\w:<>,*& ]*?\b(\w+)\(([^;{}]*)\)[^;{}]*\{", text, re.M):
        depth, i = 1, m.end()
        while depth and i < len(text):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        found.setdefault(m.group(1), (m.end(), i))
    return found


def make_cpp_mutants(target, only: set[str] | None, root: Path, mutant) -> list:
    """The mutants of ``target`` (a .cpp path and function names); ``mutant`` is
    mutation_test.Mutant (passed in: that script runs as __main__)."""
    Mutant = mutant
    text = (root / target.path).read_text()
    functions = _cpp_functions(text)
    missing = set(target.functions or ()) - set(functions)
    if missing:
        raise SystemExit(f"mutation_test.py: {target.path} has no function(s) "
                         f"{sorted(missing)}: update TARGETS")
    mutants: list = []
    for name, (start, end) in functions.items():
        if (target.functions is not None and name not in target.functions) or (only and name not in only):
            continue
        for m in _CPP_TOKEN.finditer(text, start, end):
            if m.group(0).startswith(("//", "/*", '"', "'")):
                continue
            line = text.count("\n", 0, m.start()) + 1
            line_text = text[text.rfind("\n", 0, m.start()) + 1:text.find("\n", m.end())]
            if m.group(1) in ("+", "-") and ('"' in line_text or "to_string" in line_text):
                continue  # building an error message, not a value (messages are never mutated)
            if m.group(1):
                op = m.group(1)
                a, b = m.start(1), m.end(1)
                mutants.append(Mutant(target.path, name, line, "operator",
                                      f"operator: `{op}` -> `{_CPP_SWAP[op]}`", a, b, _CPP_SWAP[op]))
            elif m.group(2):
                word = m.group(2)
                mutants.append(Mutant(target.path, name, line, "bool",
                                      f"flip bool: `{word}` -> `{_CPP_SWAP[word]}`", m.start(), m.end(),
                                      _CPP_SWAP[word]))
            elif m.group(3):
                value = int(m.group(3))
                for new in ([value + 1, value - 1] if value else [1]):
                    mutants.append(Mutant(target.path, name, line, "off by one",
                                          f"off by one: `{value}` -> `{new}`", m.start(), m.end(), str(new)))
            else:
                mutants.append(Mutant(target.path, name, line, "not", "drop `!`",
                                      m.start(), m.end(), ""))
    seen: dict[str, int] = {}
    for mutant in mutants:
        base = mutant.key
        mutant.twin = seen.get(base, 0)
        seen[base] = mutant.twin + 1
    for mutant in mutants:  # character offsets → the byte offsets the runner replaces
        mutant.start = len(text[:mutant.start].encode())
        mutant.end = len(text[:mutant.end].encode())
    return mutants


def compiles(path: Path) -> bool:
    """Whether a mutated engine source still compiles (syntax and types only)."""
    from opforge.backends.cpu import engine_build

    prefix = engine_build.find_onednn(headers=True)
    cxx = shutil.which("c++") or shutil.which("g++")
    if prefix is None or cxx is None:
        return True  # cannot tell: the tests decide
    includes = [f"-I{d}" for d in engine_build.include_dirs(path.parent.parent)]
    proc = subprocess.run([cxx, "-std=c++17", "-fsyntax-only", "-fopenmp", f"-I{prefix / 'include'}",
                           *includes, str(path)], capture_output=True)
    return proc.returncode == 0
