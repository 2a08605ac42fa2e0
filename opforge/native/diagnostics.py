"""Turning compiler and linker output into messages about the author's code.

* compile errors: gcc/clang ``file:line:col: error: ...`` lines, the author's own files
  first (then the generated glue, then headers), above the full log;
* undefined symbols from the linker (``undefined reference to `ns::f(...)'``), demangled;
* kernels the manifest names but the sources do not define (in either accepted form):
  the manifest entry (file:line), the expected declarations, and the defined symbols that
  look close, read from the object files with ``nm -C``.
"""

from __future__ import annotations

import difflib
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from opforge.native.codegen import KernelEntry
from opforge.errors import BuildError

__all__ = ["CompilerMessage", "parse_compiler_output", "compile_error", "undefined_kernels_error"]

_MESSAGE = re.compile(r"^(?P<file>[^:\s][^:]*):(?P<line>\d+):(?:(?P<col>\d+):)?\s*"
                      r"(?P<level>fatal error|error|warning|note):\s*(?P<text>.*)$")
_UNDEFINED = re.compile(r"undefined reference to [`'‘](?P<symbol>[^'’]+)['’]")
_LOG_LINES = 60


@dataclass(frozen=True)
class CompilerMessage:
    file: str
    line: int
    column: int | None
    level: str
    text: str

    def __str__(self) -> str:
        col = f":{self.column}" if self.column else ""
        return f"{self.file}:{self.line}{col}: {self.level}: {self.text}"


def parse_compiler_output(log: str) -> list[CompilerMessage]:
    """Every ``file:line[:col]: level: text`` line of a compiler log, in order."""
    found = []
    for raw in log.splitlines():
        m = _MESSAGE.match(raw.strip())
        if m:
            found.append(CompilerMessage(m["file"], int(m["line"]),
                                         int(m["col"]) if m["col"] else None, m["level"], m["text"]))
    return found


def _demangle(symbols: list[str]) -> list[str]:
    mangled = [s for s in symbols if s.startswith("_Z")]
    tool = shutil.which("c++filt")
    if not mangled or tool is None:
        return symbols
    out = subprocess.run([tool], input="\n".join(symbols), capture_output=True, text=True)
    lines = out.stdout.splitlines()
    return lines if len(lines) == len(symbols) else symbols


def _tail(log: str) -> str:
    lines = log.rstrip().splitlines()
    if len(lines) > _LOG_LINES:
        lines = [f"... ({len(lines) - _LOG_LINES} earlier lines)"] + lines[-_LOG_LINES:]
    return "\n".join("    " + line for line in lines)


def compile_error(log: str, sources: list[Path], library: str) -> BuildError:
    """A BuildError for a failed compile or link, the author's file:line errors first."""
    authored = {str(s) for s in sources} | {s.name for s in sources}
    messages = [m for m in parse_compiler_output(log) if m.level in ("error", "fatal error")]

    def rank(m: CompilerMessage) -> int:
        if m.file in authored or Path(m.file).name in authored:
            return 0
        return 1 if "opforge_register" in m.file else 2

    messages.sort(key=rank)
    undefined = list(dict.fromkeys(m["symbol"] for m in _UNDEFINED.finditer(log)))
    parts = [f"`opforge build`: library {library} — "]
    if messages:
        parts[0] += f"compilation failed with {len(messages)} error(s):"
        parts += [f"  {m}" for m in messages]
        fix = "fix the first error above (in your source) and build again"
        if any("opforge_declarations.h" in m.text or "ambiguating new declaration"
               in m.text for m in messages):
            fix = ("a kernel is defined with another return type than its op's out variant "
                   "returns (opforge_declarations.h holds what the manifest expects): "
                   "declare it exactly as `opforge signature MANIFEST` prints it, e.g. "
                   "`opforge::Tensor& ...` for one out, not `void`, and build again")
    elif undefined:
        parts[0] += f"linking failed: {len(undefined)} undefined symbol(s):"
        parts += [f"  {s}" for s in _demangle(undefined)]
        fix = ("define each symbol in one of the sources passed to --sources, or add the "
               "file that defines it")
    else:
        parts[0] += "the build failed:"
        fix = "read the build log above"
    parts.append("  build log:")
    parts.append(_tail(log))
    parts.append(f"— fix: {fix}")
    return BuildError("\n".join(parts))


def defined_functions(objects: list[Path]) -> list[str]:
    """Demangled names of the functions the object files define (``nm -C``)."""
    tool = shutil.which("nm")
    if tool is None or not objects:
        return []
    out = subprocess.run([tool, "-C", "--defined-only", *map(str, objects)],
                         capture_output=True, text=True)
    names = []
    for line in out.stdout.splitlines():
        fields = line.split(maxsplit=2)
        if len(fields) == 3 and fields[1] in "TtWw" and "(" in fields[2]:
            names.append(fields[2])
    return sorted(set(names))


def undefined_kernels_error(missing: list[KernelEntry], objects: list[Path],
                            sources: list[Path]) -> BuildError:
    """The manifest names kernels the sources do not define (in either accepted form)."""
    defined = defined_functions(objects)
    lines = [f"`opforge build`: {len(missing)} kernel(s) named in the manifest are not "
             f"defined by the sources ({', '.join(s.name for s in sources) or 'none'}):"]
    seen = set()
    for e in missing:
        if (e.sig.qualified, e.source) in seen:
            continue
        seen.add((e.sig.qualified, e.source))
        lines.append(f"  {e.source}: kernel_name {e.binding.kernel_name} of {e.key} — expected "
                     f"(either form):")
        lines.append(f"      {e.sig.declaration(True)};")
        lines.append(f"      {e.sig.declaration(False)};")
        close = _close_symbols(e.sig.function, e.sig.declaration(True), defined)
        if close:
            lines.append("    defined functions that look close (nm -C of the objects):")
            lines += [f"      {c}" for c in close]
            if not any(c.startswith(e.sig.namespace + "::") for c in close):
                lines.append(f"    (is the definition outside namespace {e.sig.namespace}? "
                             f"kernel_name {e.binding.kernel_name} means {e.sig.qualified})")
        else:
            lines.append("    no function of that name is defined in the sources")
    lines.append("— fix: 1. define the kernel with exactly one of the expected signatures "
                 "(argument types must match; the `native` namespace is added to the manifest's "
                 "kernel_name); 2. or correct kernel_name in the manifest; 3. or pass the source "
                 "that defines it to --sources")
    return BuildError("\n".join(lines))


def _close_symbols(function: str, expected: str, defined: list[str]) -> list[str]:
    same_name = [d for d in defined if d.split("(")[0].split("::")[-1] == function]
    if same_name:
        return same_name[:5]
    plain = [d.split("(")[0] for d in defined]
    near = difflib.get_close_matches(function, [p.split("::")[-1] for p in plain], n=3, cutoff=0.6)
    return [d for d in defined if d.split("(")[0].split("::")[-1] in near][:5]
