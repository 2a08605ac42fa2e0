"""From ``Custom(func, out_shape, out_dtype, func_type, reg_info)`` to a checked ``AotOp``
(no torch): every mismatch MindSpore reports at launch is refused here, at definition.

    func form            where the kernel comes from
    "dir/lib.so:Name"    the library; Name, NameInferShape/InferType/Init/OpProto by symbol
    "dir/file.cc:Name"   compiled through opforge's build cache, then as above (.cpp too)
    "Name"               a vendor package on the search path (``opforge msop build``)
    a Python callable    ``func_type="pyfunc"``: NumPy in, NumPy out

Checks (each a ``ManifestError``/``BuildError`` saying what was found, what is valid and
how to fix it): ``func_type``; the ``:Name`` part; the file; the symbol (with the library's
close names); reg_info's op name against ``Name`` (a warning for a plain library, as
MindSpore's own CPU examples differ; an error for an op with a prototype: a vendor package
or a library exporting ``NameOpProto``); input/output counts and names and dtype/format rows
against the prototype; inference present for ``out_shape``/``out_dtype`` left ``None``.
"""

from __future__ import annotations

import difflib
import inspect
import json
import os
import subprocess
import warnings
from pathlib import Path

from opforge.errors import BuildError, ManifestError, shown
from opforge.mindspore.aot import AotLibrary, cpp_infer_supported
from opforge.mindspore.op import AotOp
from opforge.mindspore.reg_info import RegInfo, parse_reg_info

__all__ = ["define", "FUNC_TYPES", "check_prototype", "NameMismatchWarning", "UnknownArity"]

FUNC_TYPES = ("aot", "pyfunc")
_SOURCES = (".cc", ".cpp", ".cxx")


class NameMismatchWarning(UserWarning):
    """reg_info's op name differs from the kernel's name in ``func`` (accepted, as MindSpore
    does, for a plain library kernel)."""


class UnknownArity(ManifestError):
    """Nothing tells the number of inputs (no reg_info, no prototype, a fixed out_shape):
    ``Custom`` then defines the op at its first call, with that call's inputs."""


def define(func, out_shape=None, out_dtype=None, func_type="aot", reg_info=None, *,
           api: str = "opforge.mindspore.Custom(...)", cache_root: Path | None = None,
           n_inputs: int | None = None) -> AotOp:
    """Check a ``Custom`` definition and return its ``AotOp`` (``n_inputs``: the number of
    inputs when nothing else says it; inputs are then x0, x1, ...)."""
    if func_type not in FUNC_TYPES:
        raise ManifestError(f"`{api}`: func_type {shown(func_type)} — valid: "
                            f"{', '.join(map(repr, FUNC_TYPES))} (opforge runs CPU kernels: AOT "
                            "libraries and Python functions) — fix: func_type=\"aot\" with "
                            "\"lib.so:Name\", or func_type=\"pyfunc\" with a function")
    info = parse_reg_info(reg_info, api) if reg_info is not None else None
    if func_type == "pyfunc":
        return _pyfunc(func, out_shape, out_dtype, info, api)
    if not isinstance(func, str):
        raise ManifestError(f"`{api}`: func — found {type(func).__name__} — valid: "
                            "\"dir/lib.so:Name\", \"dir/file.cc:Name\" or a vendor op's name "
                            "— fix: pass the path and the kernel's name, or "
                            "func_type=\"pyfunc\" for a Python function")
    if ":" not in func:
        if func.isidentifier():
            return _vendor(func, out_shape, out_dtype, info, api)
        raise ManifestError(f"`{api}`: func {shown(func)} — has no ':Name' — valid: "
                            "'dir_path/file_name:func_name' (\"./add.so:CustomAdd\"), or the "
                            "name of an op in a vendor package — fix: append ':' and the "
                            "kernel's exported function name")
    path, _, name = func.rpartition(":")
    if not name.isidentifier():
        raise ManifestError(f"`{api}`: func {shown(func)} — the part after ':' ({shown(name)}) "
                            "is not a C function name — valid: 'dir_path/file_name:func_name' "
                            "— fix: name the extern \"C\" kernel after ':'")
    library = _library(path, api, cache_root)
    functions = AotLibrary.open(library, api=api).functions(name)
    if not functions.kernel:
        raise _missing_symbol(api, library, name, func)
    proto = _prototype(functions, api, library)
    reference = info or proto
    if info is not None and info.op_name and info.op_name != name:
        if proto is not None:
            raise ManifestError(
                f"`{api}`: reg_info op name {info.op_name!r} — the library's prototype "
                f"({name}OpProto in {library}) names the op {name!r} — valid: {name!r} — fix: "
                f"CustomRegOp({name!r})")
        warnings.warn(f"`{api}`: reg_info names the op {info.op_name!r} and func's kernel is "
                      f"{name!r}; accepted (MindSpore's CPU AOT examples do this); the op is "
                      f"registered as {name!r}", NameMismatchWarning, stacklevel=3)
    if proto is not None and info is not None:
        check_prototype(info, proto, api, f"{name}OpProto in {library}")
    inputs, outputs = _signature(reference, out_shape, api, func, n_inputs)
    # reg_info's rows narrow what the kernel runs; without any, the prototype's rows hold
    rows = (info.dtype_rows() if info is not None and info.dtype_formats else
            proto.dtype_rows() if proto is not None else ())
    shape_spec = _inference(out_shape, functions.infer_shape_fn, "out_shape", "InferShape",
                            name, library, api)
    dtype_spec = _inference(out_dtype, functions.infer_type_fn, "out_dtype", "InferType",
                            name, library, api)
    return AotOp(name, inputs, outputs, "aot", library, name, None, rows, shape_spec, dtype_spec,
                 reference.attrs if reference else (), source=f"{func} ({api})")


def _library(path: str, api: str, cache_root: Path | None) -> str:
    p = Path(path)
    if not p.is_file():
        where = os.path.abspath(path)
        raise ManifestError(f"`{api}`: AOT file {path!r} — does not exist ({where}) — valid: an "
                            "existing .so, or a .cc/.cpp source opforge compiles — fix: check "
                            "the path (relative paths start at the current directory "
                            f"{os.getcwd()})")
    if p.suffix in _SOURCES:
        from opforge.mindspore.compile import compile_library

        return str(compile_library([p], p.stem, cache_root=cache_root, api=api))
    if p.suffix == ".cu":
        raise ManifestError(f"`{api}`: AOT file {path!r} — a CUDA source — valid: .so, .cc, "
                            ".cpp (opforge runs AOT kernels on the CPU) — fix: compile a CPU "
                            "kernel")
    return str(p.resolve())


def _missing_symbol(api: str, library: str, name: str, func: str) -> ManifestError:
    exported = _exported(library)
    close = difflib.get_close_matches(name, exported, n=3, cutoff=0.5)
    hint = f"close names it exports: {', '.join(close)}" if close else \
        f"it exports: {', '.join(exported[:10]) or '(nothing found by nm)'}"
    return ManifestError(f"`{api}`: func {shown(func)} — {library} exports no function {name!r} "
                         f"— {hint} — fix: 1. spell the kernel's name after ':'; 2. declare "
                         f"it extern \"C\" (a C++ name is mangled); 3. give it default "
                         "visibility")


def _exported(library: str) -> list[str]:
    try:
        out = subprocess.run(["nm", "-D", "--defined-only", library], capture_output=True,
                             text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    names = [line.split()[-1] for line in out.splitlines() if len(line.split()) == 3
             and line.split()[1] in "TtWi"]
    return [n for n in names if not n.startswith("_")]


def _prototype(functions, api: str, library: str) -> RegInfo | None:
    text = functions.proto()
    if text is None:
        return None
    try:
        return parse_reg_info(json.loads(text), f"{api} ({functions.name}OpProto in {library})")
    except ValueError as e:
        raise BuildError(f"`{api}`: {functions.name}OpProto in {library} — not JSON ({e}) — "
                         "fix: OPFORGE_MS_OP_PROTO(Name, \"{...}\") with RegInfo JSON") from None


def check_prototype(info: RegInfo, proto: RegInfo, api: str, where: str) -> None:
    """reg_info against an op's prototype: op name, input/output names and counts, and
    each dtype_format row among the prototype's."""
    if info.op_name and proto.op_name and info.op_name != proto.op_name:
        raise ManifestError(f"`{api}`: reg_info op name {info.op_name!r} — the prototype ({where}) "
                            f"is {proto.op_name!r} — valid: {proto.op_name!r} — fix: "
                            f"CustomRegOp({proto.op_name!r})")
    for kind in ("inputs", "outputs"):
        mine, theirs = getattr(info, kind), getattr(proto, kind)
        if mine != theirs:
            raise ManifestError(
                f"`{api}`: reg_info {kind} ({', '.join(mine) or 'none'}) — the prototype "
                f"({where}) has {len(theirs)} {kind}: {', '.join(theirs) or 'none'} — valid: the "
                f"same names in the same order — fix: "
                + "".join(f".{kind[:-1]}({i}, {n!r})" for i, n in enumerate(theirs)))
    allowed = [tuple(_normal(p) for p in row) for row in proto.dtype_formats]
    for r, row in enumerate(info.dtype_formats):
        if proto.dtype_formats and not any(_fits(row, a) for a in allowed):
            valid = "; ".join("(" + ", ".join(f"{d}/{f or 'any'}" for d, f in a) + ")"
                              for a in allowed)
            found = ", ".join(f"{d}/{f or 'any'}" for d, f in row)
            raise ManifestError(
                f"`{api}`: reg_info dtype_format row {r} ({found}) — not supported by the "
                f"kernel's prototype ({where}) — valid: {valid} — fix: remove the row, or add "
                "the combination to the kernel and its prototype")


def _normal(pair: tuple[str, str]) -> tuple[str, str]:
    dtype, fmt = pair
    return dtype, "ND" if fmt in ("DefaultFormat", "ND") else fmt


def _fits(row, allowed) -> bool:
    return len(row) == len(allowed) and all(
        d == ad and (f == af or "" in (f, af)) for (d, f), (ad, af) in
        zip((_normal(p) for p in row), allowed))


def _signature(reference: RegInfo | None, out_shape, api: str, func,
               n_inputs: int | None = None) -> tuple[tuple, tuple]:
    if reference is not None and reference.inputs:
        return reference.inputs, reference.outputs or ("y",)
    if n_inputs is not None:
        return tuple(f"x{i}" for i in range(n_inputs)), ("y",)
    if callable(out_shape):
        try:
            params = list(inspect.signature(out_shape).parameters.values())
        except (TypeError, ValueError):
            params = []
        if params and all(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params):
            return tuple(f"x{i}" for i in range(len(params))), ("y",)
    raise UnknownArity(f"`{api}`: {shown(func)} — the number of inputs is unknown (no reg_info, "
                        "no prototype, and out_shape is not a function of the inputs) — valid: "
                        "a reg_info naming the inputs and outputs — fix: pass "
                        "reg_info=CustomRegOp(Name).input(0, \"x\")....get_op_info()")


def _inference(given, symbol_address, what: str, suffix: str, name: str, library: str, api: str):
    if given is not None:
        if isinstance(given, (list, tuple)):
            return tuple(tuple(s) if isinstance(s, list) else s for s in given)
        return given
    if not symbol_address:
        raise ManifestError(
            f"`{api}`: {what}=None — and {library} exports no {name}{suffix} — valid: a Python "
            f"{what} (a function of the inputs' {'shapes' if suffix == 'InferShape' else 'dtypes'}"
            f", or a fixed value), or extern \"C\" {name}{suffix} in the library — fix: pass "
            f"{what}=..., or define {name}{suffix} beside the kernel")
    if not cpp_infer_supported():
        raise ManifestError(f"`{api}`: {name}{suffix} — C++ inference is called through ctypes "
                            "on x86-64 only — fix: pass a Python " + what)
    return "cpp"


def _pyfunc(func, out_shape, out_dtype, info: RegInfo | None, api: str) -> AotOp:
    if not (callable(func) or (isinstance(func, str) and ":" in func)):
        raise ManifestError(f"`{api}`: func_type=\"pyfunc\" — func is {type(func).__name__} — "
                            "valid: a Python function of NumPy arrays — fix: pass the function")
    for what, value in (("out_shape", out_shape), ("out_dtype", out_dtype)):
        if value is None:
            raise ManifestError(f"`{api}`: func_type=\"pyfunc\" with {what}=None — a Python "
                                f"function has no C++ inference — valid: {what} as a function "
                                f"or a fixed value — fix: pass {what}=...")
    name = (info.op_name if info and info.op_name else
            getattr(func, "__name__", str(func).rpartition(":")[2]))
    if not name.isidentifier():
        raise ManifestError(f"`{api}`: op name {shown(name)} — valid: an identifier — fix: "
                            "CustomRegOp(\"Name\") in reg_info")
    if info is not None and info.inputs:
        inputs, outputs = info.inputs, info.outputs or ("y",)
    else:
        inputs, outputs = _signature(None, func if callable(func) else out_shape, api, func)
    return AotOp(name, inputs, outputs, "pyfunc", None, None, func,
                 info.dtype_rows() if info else (),
                 _inference(out_shape, None, "out_shape", "", name, "", api),
                 _inference(out_dtype, None, "out_dtype", "", name, "", api),
                 info.attrs if info else (), source=f"{getattr(func, '__qualname__', func)} ({api})")


def _vendor(name: str, out_shape, out_dtype, info: RegInfo | None, api: str) -> AotOp:
    from opforge.mindspore.package import SEARCH_PATH_ENV, find_op, packages, read_package

    found = find_op(name)
    if found is None:
        known = sorted({op.name for folder in packages() for op in read_package(folder)})
        raise ManifestError(
            f"`{api}`: func {name!r} — no vendor package on the search path has an op {name!r} "
            f"(packages: {', '.join(map(str, packages())) or 'none'}; their ops: "
            f"{', '.join(known) or 'none'}) — valid: 'dir/lib.so:Name', 'dir/file.cc:Name', or "
            f"an installed op — fix: 1. build and install it: opforge msop build -o op_host -k "
            f"op_kernel -i; 2. add its install path to {SEARCH_PATH_ENV} (colon-separated, "
            "earlier wins)")
    op, folder = found
    proto = _prototype(op.functions(), api, op.library) if op.func_type == "aot" else None
    if info is not None:
        if info.op_name and info.op_name != name:
            raise ManifestError(f"`{api}`: reg_info op name {info.op_name!r} — the vendor op "
                                f"found is {name!r} ({folder}) — valid: {name!r} — fix: "
                                f"CustomRegOp({name!r})")
        if proto is not None:
            check_prototype(info, proto, api, f"vendor package {folder}")
    fields = {k: getattr(op, k) for k in ("name", "inputs", "outputs", "func_type", "library",
                                          "symbol", "pyfunc", "dtype_rows", "out_shape",
                                          "out_dtype", "attrs")}
    if info is not None and info.dtype_formats:
        fields["dtype_rows"] = info.dtype_rows()
    if out_shape is not None:
        fields["out_shape"] = _inference(out_shape, None, "out_shape", "", name, "", api)
    if out_dtype is not None:
        fields["out_dtype"] = _inference(out_dtype, None, "out_dtype", "", name, "", api)
    return AotOp(**fields, source=f"{name} from {folder} ({api})")
