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


# --- building a mutant's engine ---------------------------------------------------------------
#
# Each mutant's engine is built the way the package build installs one: into the copy's
# ``_engine/libopforge_cpu.<source hash>.so``, where ``library()`` (in the tests and in the
# child processes they start) finds it and loads it without compiling. Only the mutated
# translation unit is recompiled: the others are compiled to objects once per target, with
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
