"""C++ mutants for scripts/mutation_test.py: the cpu backend's engine sources (the
design is in the comment below; docs/testing.md describes the run)."""

from __future__ import annotations

import importlib.util
import os
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
# shifts are never touched. How each mutant's engine is built: EngineBuilder, below.

_CPP_TOKEN = re.compile(r"""//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'"""
                        r"| (<=|>=|<|>|==|!=|&&|\|\||\+|-) |\b(true|false)\b|(?<![\w.])(\d+)(?![\w.])"
                        r"|(?<=[(\s])!(?=[\w(])", re.S)
_CPP_SWAP = {"<": "<=", "<=": "<", ">": ">=", ">=": ">", "==": "!=", "!=": "==", "&&": "||",
             "||": "&&", "+": "-", "-": "+", "true": "false", "false": "true"}


def _cpp_functions(text: str) -> dict[str, tuple[int, int]]:
    """name -> (start, end) byte span of each function body defined at namespace level, then
    of each method defined inside its class (indented; the first of a name wins)."""
    found = {}
    heads = list(re.finditer(r"^[A-Za-z_][\w:<>,*& ]*?\b(\w+)\(([^;{}]*)\)[^;{}]*\{", text, re.M))
    heads += [m for m in re.finditer(r"^[ \t]+(?!return\b|else\b)[A-Za-z_][\w:<>,*& ]*?[\w>*&] \b(\w+)"
                                     r"\(([^;{}]*)\)[^;{}=]*\{", text, re.M)]
    for m in heads:
        depth, i = 1, m.end()
        while depth and i < len(text):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        found.setdefault(m.group(1), (m.end(), i))
    return found


def make_cpp_mutants(target, only: set[str] | None, root: Path, mutant,
                     operators: str = "all") -> list:
    """The mutants of ``target`` (a .cpp path and function names); ``mutant`` is
    mutation_test.Mutant (passed in: that script runs as __main__); ``operators``:
    "mechanical", "semantic" or "all"."""
    Mutant = mutant
    text = (root / target.path).read_text()
    functions = _cpp_functions(text)
    code = _code_only(text)
    missing = set(target.functions or ()) - set(functions)
    if missing:
        raise SystemExit(f"mutation_test.py: {target.path} has no function(s) "
                         f"{sorted(missing)}: update TARGETS")
    mutants: list = []
    for name, (start, end) in functions.items():
        if (target.functions is not None and name not in target.functions) or (only and name not in only):
            continue
        for m in _CPP_TOKEN.finditer(text, start, end) if operators != "semantic" else ():
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
        if operators == "mechanical":
            continue
        seen_text = {text[:m.start] + m.replacement + text[m.end:] for m in mutants}
        for op, what, a, b, new in semantic_mutants(text, code, start, end):
            mutated = text[:a] + new + text[b:]
            if mutated in seen_text:
                continue  # the same source as an earlier mutant
            seen_text.add(mutated)
            mutants.append(Mutant(target.path, name, text.count("\n", 0, a) + 1, op, what, a, b, new))
    seen: dict[str, int] = {}
    for mutant in mutants:
        base = mutant.key
        mutant.twin = seen.get(base, 0)
        seen[base] = mutant.twin + 1
    for mutant in mutants:  # character offsets → the byte offsets the runner replaces
        mutant.start = len(text[:mutant.start].encode())
        mutant.end = len(text[:mutant.end].encode())
    return mutants


# --- semantic operators ------------------------------------------------------------------------
#
# The mistakes this engine's authors could plausibly make, beyond a flipped operator (issue
# 45: five hand-planted mistakes of these kinds survived every mechanical mutant's tests):
#   swap operands   `_mm512_max_ps(lo, v)` -> `_mm512_max_ps(v, lo)`, std::max / std::min /
#                   fmaxf / fminf alike: equal on numbers, but the instructions return their
#                   second operand when either is NaN, std::max its first (NaN becomes the bound)
#   drop term       `b * gain + offset` -> `b * gain`: a term of a bound or an offset forgotten
#   drop zeroing    `std::memset(...)` / `std::fill(...)` / `acc = _mm512_setzero_ps()` /
#                   `y[j] = 0.f` -> `(void)0`: scratch or an output not cleared
#   drop check      `a && b` -> `a` and -> `b`: one condition of a pair forgotten
#   shrink bound    `for (...; j < n; ...)` -> `j < n - 1`: a loop one short (the tail)
#   drop update     `m = _mm512_max_ps(m, v)`, `s += e` -> `(void)0`: one step of a reduction
# std::max / std::min are swapped only where an operand looks floating-point (a float literal,
# a float / double / __m512 name, an intrinsic): integers have no NaN, the swap changes nothing.
SEMANTIC = ("swap operands", "drop term", "drop zeroing", "drop check", "shrink bound",
            "drop update")
_SWAP_CALL = re.compile(r"\b(std::max|std::min|std::fmax|std::fmin|fmaxf|fminf|fmax|fmin|"
                        r"_mm(?:512|256)?_max_ps|_mm(?:512|256)?_min_ps)\s*(<[^<>()]*>)?\(")
_INT_TYPE = re.compile(r"\b(u?int\d*_t|int|long|size_t|ptrdiff_t|unsigned|char|bool)\b")
_INT_LITERAL = re.compile(r"^-?\d+[uUlL]*$")
_ZERO_CALL = re.compile(r"\b(std::memset|memset|std::fill_n|std::fill|bzero)\s*\(")
_ZERO_STORE = re.compile(r"(?<![=!<>+\-*/|&^])= (0|0\.f|0\.0f|0\.0|_mm512_setzero_ps\(\)|"
                         r"_mm_setzero_ps\(\)|_mm256_setzero_ps\(\));")
_UPDATE = re.compile(r"(?<![\w.\]])(\w+(?:\[[^\]\n]*\])*) (\+|-|\*|\||&)?= ")
_OPEN, _CLOSE = "([{", ")]}"


def _code_only(text: str) -> str:
    """``text`` with comments and string / character literals blanked (same offsets)."""
    out = list(text)
    for m in re.finditer(r"""//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'""", text, re.S):
        for i in range(m.start(), m.end()):
            if out[i] != "\n":
                out[i] = " "
    return "".join(out)


def _ternary(code: str, i: int) -> bool:
    """Whether ``code[i]`` is the ``:`` of a conditional (not of ``::``)."""
    return code[i] == ":" and code[i - 1] != ":" and code[i + 1:i + 2] != ":"


def _floating(text: str, expr: str) -> bool:
    """Whether ``expr`` looks floating-point: a float literal, INFINITY / NAN, a ``_ps``
    intrinsic or fabs, or its first name declared float, double or __m128/256/512 in the file."""
    if re.search(r"\d\.\d*f?\b|\d\.?f\b|\d[eE][-+]?\d|\bINFINITY\b|\bNAN\b|_ps\(|fabs", expr):
        return True
    name = re.match(r"\W*(\w+)", expr)
    return bool(name) and re.search(
        rf"\b(?:float|double|__m512|__m256|__m128)\b[ \t*&]*(?:const\s+)?{name.group(1)}\b",
        text) is not None


def _forward(code: str, i: int, stops: tuple[str, ...]) -> int:
    """From ``i``: the end of the operand there (a closing bracket of an enclosing group, or
    at depth 0 one of ``stops`` or ``,;?:``)."""
    depth = 0
    while i < len(code):
        ch = code[i]
        if ch in _OPEN:
            depth += 1
        elif ch in _CLOSE:
            if depth == 0:
                break
            depth -= 1
        elif depth == 0 and (ch in ",;?" or _ternary(code, i) or code.startswith(stops, i)):
            break
        i += 1
    while i > 0 and code[i - 1].isspace():
        i -= 1
    return i


def _backward(code: str, i: int, stops: tuple[str, ...]) -> int:
    """To the left of ``i``: the start of the operand ending there."""
    depth = 0
    j = i
    while j > 0:
        ch = code[j - 1]
        if ch in _CLOSE:
            depth += 1
        elif ch in _OPEN:
            if depth == 0:
                break
            depth -= 1
        elif depth == 0 and (ch in ",;?{}" or _ternary(code, j - 1) or
                             any(code.endswith(s, 0, j) for s in stops) or
                             (ch == "=" and code[j - 2] not in "=!<>" and code[j] != "=") or
                             re.search(r"\breturn\s$", code[max(0, j - 8):j])):
            break
        j -= 1
    while j < i and code[j].isspace():
        j += 1
    return j


def _target(code: str, at: int) -> tuple[int, bool]:
    """The start of the assignment target ending before ``at`` (a name, members, indices),
    and whether it starts a statement (False: a declaration, or part of an expression)."""
    j = at
    while j > 0 and code[j - 1] == " ":
        j -= 1
    depth = 0
    while j > 0:
        ch = code[j - 1]
        if ch == "]":
            depth += 1
        elif ch == "[":
            depth -= 1
        elif depth == 0 and not (ch.isalnum() or ch in "_.>" or (ch == "-" and code[j] == ">")):
            break
        j -= 1
    k = j
    while k > 0 and code[k - 1].isspace():
        k -= 1
    return j, k == 0 or code[k - 1] in ";{})"


def _arguments(code: str, open_at: int) -> tuple[list[tuple[int, int]], int]:
    """The top-level argument spans of the call whose ``(`` is at ``open_at``, and the index
    just past its ``)``."""
    spans, start, depth, i = [], open_at + 1, 0, open_at + 1
    while i < len(code):
        ch = code[i]
        if ch in _OPEN:
            depth += 1
        elif ch in _CLOSE:
            if depth == 0:
                spans.append((start, i))
                break
            depth -= 1
        elif ch == "," and depth == 0:
            spans.append((start, i))
            start = i + 1
        i += 1
    spans = [(a + len(code[a:b]) - len(code[a:b].lstrip()), b - len(code[a:b]) + len(code[a:b].rstrip()))
             for a, b in spans]
    return spans, i + 1


def _short_text(s: str) -> str:
    s = " ".join(s.split())
    return s if len(s) <= 70 else s[:67] + "..."


def semantic_mutants(text: str, code: str, start: int, end: int):
    """``(operator, what, start, end, replacement)`` of every semantic mutant in
    ``text[start:end]`` (``code``: ``text`` with comments and literals blanked)."""
    def message(at: int) -> bool:
        line = text[text.rfind("\n", 0, at) + 1:text.find("\n", at)]
        return '"' in line or "to_string" in line

    for m in _SWAP_CALL.finditer(code, start, end):
        if m.group(2) and _INT_TYPE.search(m.group(2)):
            continue
        args, _ = _arguments(code, m.end() - 1)
        if len(args) != 2 or any(_INT_LITERAL.match(text[a:b]) for a, b in args):
            continue
        if m.group(1).startswith("std::m") and not any(_floating(text, text[a:b]) for a, b in args):
            continue  # integers: no NaN, the swap changes nothing
        (a0, a1), (b0, b1) = args
        new = text[b0:b1] + text[a1:b0] + text[a0:a1]
        yield ("swap operands", f"swap operands: `{_short_text(text[m.start():args[1][1] + 1])}`",
               a0, b1, new)
    for m in re.finditer(r" \+ ", code[start:end]):
        at = start + m.start()
        if message(at) or code[at - 1] in "+":
            continue
        stop = _forward(code, at + 3, (" + ", " - ", " < ", " > ", " <= ", " >= ", " == ", " != ",
                                       " && ", " || ", " = ", " << ", " >> ", " & ", " | "))
        yield ("drop term", f"drop term: `+ {_short_text(text[at + 3:stop])}`", at, stop, "")
    for m in _ZERO_CALL.finditer(code, start, end):
        _, close = _arguments(code, m.end() - 1)
        yield ("drop zeroing", f"drop zeroing: `{_short_text(text[m.start():close])}`",
               m.start(), close, "(void)0")
    for m in _ZERO_STORE.finditer(code, start, end):
        lhs, statement = _target(code, m.start())
        if lhs == m.start() or not statement:
            continue  # a declaration (`float s = 0.f;`), not a store
        yield ("drop zeroing", f"drop zeroing: `{_short_text(text[lhs:m.end() - 1])}`",
               lhs, m.end() - 1, "(void)0")
    for m in re.finditer(r" (&&|\|\|) ", code[start:end]):
        at = start + m.start()
        stops = (" || ",) if m.group(1) == "||" else (" && ", " || ")
        left = _backward(code, at, stops)
        right = _forward(code, at + 4, stops)
        both = _short_text(text[left:right])
        yield ("drop check", f"drop check: `{_short_text(text[left:at])}` of `{both}`",
               left, at + 4, "")
        yield ("drop check", f"drop check: `{_short_text(text[at + 4:right])}` of `{both}`",
               at, right, "")
    for m in re.finditer(r"\bfor \(", code[start:end]):
        open_at = start + m.end() - 1
        header, _ = _arguments(code, open_at)
        parts = code[open_at + 1:header[0][1]].split(";") if header else []
        if len(parts) != 3:
            continue  # a range-based for
        cond_at = open_at + 1 + len(parts[0]) + 1
        cond = code[cond_at:cond_at + len(parts[1])]
        c = re.fullmatch(r"(\s*)(.*?) (<|<=) (.*?)(\s*)", cond)
        if not c or "&&" in cond or "||" in cond:
            continue
        bound_at = cond_at + c.start(4)
        bound = text[bound_at:bound_at + len(c.group(4))]
        shrunk = f"({bound}) - 1" if re.search(r"[?<>=&|]", bound) else f"{bound} - 1"
        yield ("shrink bound", f"shrink bound: `{_short_text(c.group(2))} {c.group(3)} "
               f"{_short_text(bound)}` -> `... {shrunk}`", bound_at, bound_at + len(bound), shrunk)
    for m in _UPDATE.finditer(code, start, end):
        name, op = m.group(1), m.group(2)
        stop = _forward(code, m.end(), ())
        if stop >= len(code) or code[stop] != ";":
            continue  # a for loop's step, or a declaration list
        value = code[m.end():stop]
        if op is None:
            call = re.match(r"[\w:]+\s*\(", value)
            if not call:
                continue
            args, _ = _arguments(code, m.end() + call.end() - 1)
            if not any(code[a:b].strip() == name for a, b in args):
                continue  # not `x = f(x, ...)`: a reduction step updates its own value
        if not _target(code, m.end(1))[1]:
            continue  # a declaration (`float s = ...`)
        yield ("drop update", f"drop update: `{_short_text(text[m.start():stop])}`",
               m.start(), stop, "(void)0")


# --- building a mutant's engine ---------------------------------------------------------------
#
# Each mutant's engine is built the way the package build installs one: into the copy's
# ``_engine/libopforge_cpu.<source hash>.so``, where ``library()`` (in the tests and in the
# child processes they start) finds it and loads it without compiling. Only the mutated
# translation unit is recompiled: the others are compiled to objects once per run, with
# the engine's own flags, and each mutant is that one object plus a link (~3 s instead of a
# whole engine build, ~20 s of compiling plus the build cache's header scan). A mutant whose
# source does not compile is stillborn.


def _engine_build(work: Path):
    """The copy's opforge/backends/cpu/engine_build.py, loaded by path (as setup.py does):
    importing it as ``opforge....`` would import opforge into this process, and the forked
    children would then not import the copy's Python afresh."""
    path = work / "opforge" / "backends" / "cpu" / "engine_build.py"
    spec = importlib.util.spec_from_file_location("_mutation_engine_build", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class EngineBuilder:
    """Builds the engine of the copy in ``work`` for each mutant of the source ``mutated``."""

    def __init__(self, work: Path, mutated: Path):
        self.eb = eb = _engine_build(work)
        self.cpu_dir = work / "opforge" / "backends" / "cpu"
        self.mutated = mutated.resolve()
        prefix = eb.find_onednn(headers=True)
        self.cxx = shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++")
        if prefix is None or self.cxx is None:
            raise SystemExit("mutation_test.py: C++ targets need a C++ compiler and oneDNN's "
                             "headers (pip install onednn-devel-cpu-gomp==2023.2.0)")
        flags = eb.compile_flags(prefix)
        self.link = [f for f in flags if f.startswith(("-l", "-L", "-Wl,"))]
        self.compile = [f for f in flags if f not in self.link and f != "-shared"] + \
            [f"-I{d}" for d in eb.include_dirs(self.cpu_dir)]
        self.objects = work / ".engine-objects"
        self.objects.mkdir(exist_ok=True)
        for source in eb.source_files(self.cpu_dir):
            if source.suffix == ".cpp" and source.resolve() != self.mutated:
                done = self.objects / f"{source.stem}.o"  # an earlier target's, unmutated
                if done.exists() and done.stat().st_mtime >= source.stat().st_mtime:
                    continue
                if not self._object(source):
                    raise SystemExit(f"mutation_test.py: the unmutated {source.name} does not "
                                     "compile")

    def _object(self, source: Path) -> bool:
        out = self.objects / f"{source.stem}.o"
        out.unlink(missing_ok=True)
        proc = subprocess.run([self.cxx, *self.compile, "-c", str(source), "-o", str(out)],
                              capture_output=True)
        return proc.returncode == 0

    def build(self) -> bool:
        """Install the engine of the sources as they are now; False: the mutant does not
        compile (stillborn)."""
        install = self.cpu_dir / self.eb.INSTALL_FOLDER
        install.mkdir(exist_ok=True)
        for old in install.glob(f"{self.eb.ENGINE_NAME}.*.so"):
            old.unlink()
        if not self._object(self.mutated):
            return False
        self.eb._hash_cache.clear()  # the sources changed since the last mutant
        target = install / self.eb.installed_name(self.cpu_dir)
        proc = subprocess.run([self.cxx, "-shared", "-fopenmp", "-o", str(target),
                               *map(str, sorted(self.objects.glob("*.o"))), *self.link],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"mutation_test.py: linking the engine failed:\n{proc.stderr[-2000:]}")
        return True
