"""``opforge oppackage new``: an OpDef → a package project that compiles as generated.

The project (``DIR``)::

    config/<Package>.xml          the OpDef (the source of truth; the build reads it)
    include/opforge/oppackage.h   the package C ABI (and oppackage.hpp, its C++ helpers)
    src/<Package>Ops.h            generated: one typed function per op, parameter defaults
    src/<Package>Interface.cpp    generated: create/execute/destroy glue per op and the
                                  <Package>InterfaceProvider the backend calls
    src/ops/<Op>.cpp              yours: one per op, "not implemented yet" until written
    CMakeLists.txt                a standalone build (opforge oppackage build uses its own)

The two generated files are written again by every ``opforge oppackage build`` from
``config/<Package>.xml``; the op sources are never overwritten.

>>> from opforge.backends.oppackage import parse_opdef_xml
>>> ops = skeleton_ops(parse_opdef_xml(EXAMPLE_XML))
>>> ops[0].signature
'opforge::pkg::Status Mul3(const opforge::pkg::Tensor& input, opforge::pkg::Tensor& output)'
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import jinja2

from opforge.backends.oppackage.model import OpDefinition, OpPackage, TensorDef
from opforge.errors import ManifestError, shown

__all__ = ["SkeletonOp", "skeleton_ops", "generate_skeleton", "render_glue", "include_dir",
           "EXAMPLE_XML"]

_TEMPLATES = Path(__file__).with_name("templates")

EXAMPLE_XML = """<OpDefCollection PackageName="P" Domain="d" Version="1.0"><OpDefList><OpDef>
<Name>Mul3</Name>
<Input><Name>input</Name><Datatype>QNN_DATATYPE_FLOAT_32</Datatype></Input>
<Output><Name>output</Name><Datatype>QNN_DATATYPE_FLOAT_32</Datatype></Output>
</OpDef></OpDefList></OpDefCollection>"""

_CTYPES = {
    "QNN_DATATYPE_INT_8": "int8_t", "QNN_DATATYPE_INT_16": "int16_t",
    "QNN_DATATYPE_INT_32": "int32_t", "QNN_DATATYPE_INT_64": "int64_t",
    "QNN_DATATYPE_UINT_8": "uint8_t", "QNN_DATATYPE_UINT_16": "uint16_t",
    "QNN_DATATYPE_UINT_32": "uint32_t", "QNN_DATATYPE_UINT_64": "uint64_t",
    "QNN_DATATYPE_FLOAT_16": "float", "QNN_DATATYPE_FLOAT_32": "float",
    "QNN_DATATYPE_FLOAT_64": "double", "QNN_DATATYPE_BOOL_8": "bool",
    "QNN_DATATYPE_SFIXED_POINT_8": "int32_t", "QNN_DATATYPE_SFIXED_POINT_16": "int32_t",
    "QNN_DATATYPE_SFIXED_POINT_32": "int32_t", "QNN_DATATYPE_SFIXED_POINT_4": "int32_t",
    "QNN_DATATYPE_UFIXED_POINT_8": "uint32_t", "QNN_DATATYPE_UFIXED_POINT_16": "uint32_t",
    "QNN_DATATYPE_UFIXED_POINT_32": "uint32_t", "QNN_DATATYPE_UFIXED_POINT_4": "uint32_t",
    "BACKEND_SPECIFIC": "double",
}
_PKG = "opforge::pkg::"


def include_dir() -> Path:
    """The folder holding ``opforge/oppackage.h`` and ``opforge/oppackage.hpp``."""
    return Path(__file__).with_name("include")


_CXX_KEYWORDS = frozenset("""alignas alignof and and_eq asm auto bitand bitor bool break case
catch char char16_t char32_t class compl const constexpr const_cast continue decltype default
delete do double dynamic_cast else enum explicit export extern false float for friend goto if
inline int long mutable namespace new noexcept not not_eq nullptr operator or or_eq private
protected public register reinterpret_cast return short signed sizeof static static_assert
static_cast struct switch template this thread_local throw true try typedef typeid typename
union unsigned using virtual void volatile wchar_t while xor xor_eq opforge""".split())


def _ident(name: str, taken: set[str]) -> str:
    """A C++ identifier for an OpDef name ("in[0]" → "in_0_"), unique within ``taken``."""
    ident = re.sub(r"\W", "_", name) or "arg"
    if ident[0].isdigit():
        ident = "_" + ident
    if ident in _CXX_KEYWORDS:
        ident += "_"
    base, i = ident, 1
    while ident in taken:
        ident, i = f"{base}_{i}", i + 1
    taken.add(ident)
    return ident


@dataclass(frozen=True)
class SkeletonArg:
    """One argument of an op's typed function: ``decl`` is its C++ parameter text."""

    tensor: TensorDef
    ident: str
    decl: str
    ctype: str = ""        # parameters: the value type (``float``)
    storage: str = ""      # parameters: the member type (``float``, ``std::vector<int32_t>``)
    default: str = ""      # parameters: the C++ initialiser ("3.0f"), "" when none
    reader: str = ""       # parameters: "scalar" or "list"
    slot: int = 0          # inputs/outputs: their position in the OpDef


@dataclass(frozen=True)
class SkeletonOp:
    op: OpDefinition
    inputs: tuple[SkeletonArg, ...]
    parameters: tuple[SkeletonArg, ...]
    outputs: tuple[SkeletonArg, ...]

    @property
    def name(self) -> str:
        return self.op.name

    @property
    def signature(self) -> str:
        args = ", ".join(a.decl for a in (*self.inputs, *self.parameters, *self.outputs))
        return f"{_PKG}Status {self.op.name}({args})"


def _default(where: str, t: TensorDef, ctype: str, is_list: bool) -> str:
    text = (t.default or "").strip()
    if not text:
        return ""
    if t.enumeration:
        if text in t.enumeration:
            return str(t.enumeration.index(text))
    items = [s.strip() for s in text.strip("[]{}()").split(",")] if is_list else [text]
    out = []
    for item in items:
        if ctype == "bool":
            if item.lower() not in ("true", "false", "0", "1"):
                break
            out.append("true" if item.lower() in ("true", "1") else "false")
            continue
        try:
            number = float(item) if ctype in ("float", "double") else int(item, 0)
        except ValueError:
            break
        out.append(repr(float(number)) + ("f" if ctype == "float" else "")
                   if ctype in ("float", "double") else str(number))
    else:
        return ("{" + ", ".join(out) + "}") if is_list else out[0]
    raise ManifestError(
        f"`opforge oppackage new`: {where}:{t.line}: <Default> of parameter {t.name!r} — "
        f"{shown(t.default)} is not a {ctype}{' list' if is_list else ''} — valid: e.g. "
        f"{'[1, 2]' if is_list else '1'}{', or one of its <Enum> names' if t.enumeration else ''} "
        "— fix: write the default as a number (true/false for a bool)")


def skeleton_ops(package: OpPackage) -> list[SkeletonOp]:
    """The typed C++ view of each op of ``package`` (what the templates render)."""
    result = []
    for op in package.ops:
        taken: set[str] = set()
        inputs = []
        for slot, t in enumerate(op.inputs):
            ident = _ident(t.name, taken)
            kind = (f"const {_PKG}TensorList&" if t.repeated else
                    f"const {_PKG}Tensor&" if t.mandatory else f"const {_PKG}Tensor*")
            inputs.append(SkeletonArg(t, ident, f"{kind} {ident}", slot=slot))
        params = []
        for t in op.parameters:
            if "QNN_DATATYPE_STRING" in t.datatypes:
                raise ManifestError(
                    f"`opforge oppackage new`: {package.source}:{t.line}: <Parameter> {t.name!r} "
                    "— QNN_DATATYPE_STRING — valid: numbers and bools (torch str arguments "
                    "are not mapped to package parameters) — fix: use an <Enumeration>")
            ident = _ident(t.name, taken)
            ctype = "uint32_t" if t.enumeration else _CTYPES[t.datatypes[0]]
            is_list = t.rank not in ("SCALAR",) and not t.enumeration
            default = _default(package.source, t, ctype, is_list)
            if is_list:
                storage = f"std::vector<{ctype}>"
                decl = f"const {storage}& {ident}"
            elif t.mandatory or default:
                storage, decl = ctype, f"{ctype} {ident}"
            else:
                storage = f"std::optional<{ctype}>"
                decl = f"{storage} {ident}"
            params.append(SkeletonArg(t, ident, decl, ctype, storage, default,
                                      "list" if is_list else "scalar"))
        outputs = []
        for slot, t in enumerate(op.outputs):
            if t.repeated and slot != len(op.outputs) - 1:
                raise ManifestError(
                    f"`opforge oppackage new`: {package.source}:{t.line}: <Output> {t.name!r} is "
                    "Repeated but not the last output — valid: only the last output repeats — "
                    "fix: move it last")
            ident = _ident(t.name, taken)
            kind = f"{_PKG}TensorList&" if t.repeated else f"{_PKG}Tensor&"
            outputs.append(SkeletonArg(t, ident, f"{kind} {ident}", slot=slot))
        result.append(SkeletonOp(op, tuple(inputs), tuple(params), tuple(outputs)))
    return result


def _cstr(value: str) -> str:
    """A C string literal: printable ASCII as is, everything else as octal escapes of its
    UTF-8 bytes (no UCNs, which C++ refuses for control characters)."""
    out = []
    for byte in str(value).encode("utf-8"):
        ch = chr(byte)
        if ch in '"\\?':
            out.append("\\" + ch)
        elif 32 <= byte < 127:
            out.append(ch)
        else:
            out.append(f"\\{byte:03o}")
    return '"' + "".join(out) + '"'


def _cxx_comment(value: str) -> str:
    return " ".join(value.replace("*/", "* /").split())


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(_TEMPLATES)),
                             undefined=jinja2.StrictUndefined, trim_blocks=True,
                             lstrip_blocks=True, keep_trailing_newline=True)
    env.filters["cstr"] = _cstr
    env.filters["comment"] = _cxx_comment
    return env


def _raw_literal(text: str) -> str:
    """``text`` as C++ raw string literal pieces (a delimiter the text does not contain)."""
    delim = "opdef"
    while f"){delim}\"" in text:
        delim += "_"
    # raw literals are limited in length by some compilers: 4 kB pieces, concatenated
    pieces = [text[i:i + 4000] for i in range(0, len(text), 4000)] or [""]
    return "\n".join(f'R"{delim}({p}){delim}"' for p in pieces)


def render_glue(package: OpPackage, xml_text: str) -> dict[str, str]:
    """The generated files (``src/<Package>Ops.h``, ``src/<Package>Interface.cpp``)."""
    from opforge import __version__

    ops = skeleton_ops(package)
    env = _environment()
    ctx = dict(package=package, ops=ops, version=__version__, opdef_literal=_raw_literal(xml_text))
    return {f"src/{package.name}Ops.h": env.get_template("ops.h.j2").render(**ctx),
            f"src/{package.name}Interface.cpp": env.get_template("interface.cpp.j2").render(**ctx)}


def generate_skeleton(package: OpPackage, xml_text: str, out_dir: str | Path, *,
                      force: bool = False) -> list[Path]:
    """Write the project for ``package`` into ``out_dir``; the files written.

    ``out_dir`` must be empty or absent unless ``force`` (then op sources that exist are
    kept, everything generated is written again).
    """
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ManifestError(f"`opforge oppackage new`: -o {out} — is a file — valid: a new or "
                            "empty folder — fix: choose another path")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise ManifestError(f"`opforge oppackage new`: -o {out} — the folder is not empty — valid: "
                            "a new or empty folder — fix: choose another, or pass --force (op "
                            "sources already there are kept)")
    env = _environment()
    files = dict(render_glue(package, xml_text))
    files[f"config/{package.name}.xml"] = xml_text
    files["CMakeLists.txt"] = env.get_template("CMakeLists.txt.j2").render(
        package=package, ops=skeleton_ops(package))
    for sk in skeleton_ops(package):
        path = f"src/ops/{sk.name}.cpp"
        if not (out / path).exists():
            files[path] = env.get_template("op.cpp.j2").render(package=package, op=sk)
    written = []
    for rel, text in files.items():
        path = out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        written.append(path)
    for header in ("oppackage.h", "oppackage.hpp"):
        dst = out / "include" / "opforge" / header
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(include_dir() / "opforge" / header, dst)
        written.append(dst)
    return written
