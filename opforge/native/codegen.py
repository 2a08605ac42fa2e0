"""Codegen: selected kernel bindings → the glue translation unit and the CMake project.

For a library the build generates, from Jinja2 templates in ``templates/``:

* ``opforge_register.cpp`` — per kernel binding, the typed declaration of the author's
  function (both accepted forms), a boxed wrapper that checks the argument count and kinds
  and unboxes ``opforge_arg`` values into typed views, and the one exported
  ``opforge_register_kernels()`` that returns the kernel table;
* ``CMakeLists.txt`` — a standalone CMake project (see the template's header);
* ``include/opforge/*.h``, ``include/executorch/**.h`` — copies of the ABI headers and the
  ExecuTorch compatibility headers, so the project is self-contained.

Nothing here runs a compiler; :mod:`opforge.native.driver` does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import jinja2

from opforge.native.abi import include_dir
from opforge.native.cpp_signature import CppSignature, cpp_signature
from opforge.manifest import KernelBinding, OpDef

__all__ = ["KernelEntry", "GeneratedProject", "kernel_entries", "generate_project"]

_TEMPLATES = Path(__file__).with_name("templates")


@dataclass(frozen=True)
class KernelEntry:
    """One row of the kernel table: an op's out overload, one binding, its C++ signature."""

    index: int
    opdef: OpDef
    binding: KernelBinding
    sig: CppSignature

    @property
    def key(self) -> str:
        return self.opdef.out_key

    @property
    def op(self) -> str:
        return self.key.rpartition(".")[0]

    @property
    def overload(self) -> str:
        return self.key.rpartition(".")[2]

    @property
    def schema(self) -> str:
        return str(self.opdef.out)

    @property
    def source(self) -> str:
        return self.opdef.source

    @property
    def dtype_key(self) -> str:
        return self.binding.dtype_key

    @property
    def kinds(self) -> list[int]:
        return [int(a.kind) for a in self.sig.args]

    @property
    def shaped_like(self) -> tuple[str, tuple[str, ...]] | None:
        """``(input, outs)`` when the op has no ``fake:`` and its default fake applies: each
        out then has the first tensor input's sizes and dtype, which the glue checks before
        the author's function runs (a program is untrusted; a kernel trusts its outs)."""
        if self.opdef.fake is not None:
            return None
        functional = self.opdef.functional
        if not functional.returns or any(str(r.type) != "Tensor" for r in functional.returns):
            return None
        args = self.opdef.out.arguments.flat
        names = [a.name for a in self.sig.args]
        first = next((i for i, a in enumerate(args)
                      if str(a.type) == "Tensor" and not a.is_write), None)
        outs = [i for i, a in enumerate(args) if a.is_write and str(a.type) == "Tensor"]
        if first is None or len(outs) != len(functional.returns):
            return None
        return names[first], tuple(names[i] for i in outs)

    @property
    def meta_args(self) -> list[int]:
        if self.binding.arg_meta is None:
            return []
        names = [a.name for a in self.opdef.out.arguments.flat]
        return [names.index(arg) for arg, _ in self.binding.arg_meta]


@dataclass(frozen=True)
class GeneratedProject:
    """The generated files, by relative path, ready to be written (or hashed)."""

    library: str
    files: dict[str, str]
    entries: tuple[KernelEntry, ...]


def kernel_entries(opdefs: list[OpDef]) -> list[KernelEntry]:
    """One entry per (op, kernel binding), in manifest order."""
    entries = []
    for opdef in opdefs:
        for binding in opdef.kernels:
            entries.append(KernelEntry(len(entries), opdef, binding,
                                       cpp_signature(opdef, binding.cpp_name)))
    return entries


def _cstr(value: str) -> str:
    """A C string literal."""
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(_TEMPLATES)),
                             undefined=jinja2.StrictUndefined, trim_blocks=True,
                             lstrip_blocks=True, keep_trailing_newline=True)
    env.filters["cstr"] = _cstr
    return env


def target_name(library: str) -> str:
    """A CMake target name from a library name ("libmy_ops.so" → "my_ops")."""
    stem = library.removeprefix("lib").split(".")[0]
    return re.sub(r"\W", "_", stem) or "kernels"


def generate_project(library: str, opdefs: list[OpDef], sources: list[Path], *,
                     output_name: str, extra_flags: tuple[str, ...] = ()) -> GeneratedProject:
    """Render the glue, the CMake project and the header copies for ``opdefs``."""
    from opforge import __version__ as version

    entries = kernel_entries(opdefs)
    declarations, seen = [], set()
    for e in entries:
        marker = (e.sig.qualified, e.sig.params(False, False))
        if marker not in seen:
            seen.add(marker)
            declarations.append(e.sig)
    env = _environment()
    ops = sorted({e.key for e in entries})
    files = {
        "opforge_register.cpp": env.get_template("register.cpp.j2").render(
            version=version, library=library, entries=entries, ops=ops, declarations=declarations),
        "opforge_declarations.h": env.get_template("declarations.h.j2").render(
            version=version, library=library, declarations=declarations),
        "CMakeLists.txt": env.get_template("CMakeLists.txt.j2").render(
            version=version, library=library, target=target_name(library),
            output_name=output_name, output_stem=Path(output_name).stem,
            sources=[s.as_posix() for s in sources], extra_flags=list(extra_flags)),
    }
    # opforge's headers and the ExecuTorch compatibility headers (include/executorch/...)
    for header in sorted(include_dir().rglob("*.h")):
        rel = header.relative_to(include_dir()).as_posix()
        files[f"include/{rel}"] = header.read_text(encoding="utf-8")
    return GeneratedProject(library, files, tuple(entries))
