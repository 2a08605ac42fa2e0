"""Crash reports for the native code a cpu delegate calls: custom kernels (the kernel ABI)
and op-package ops, which the engine runs through function pointers.

The lean runtime names a crashing native kernel through the Python frame that calls it
(``opforge.runtime.native``); inside a delegate the engine makes those calls, so one
Python frame covers them all. Here the Python side, which knows what each engine op is,
registers a label for every entry function once per engine (``register``, at ``init``):
the op, the kernel symbol, the library, the engine op index and the FX node. The engine's
``crash_report.cpp`` installs a signal handler beside faulthandler's that finds the
crashing entry (from the faulting thread's stack, or exactly through the engine's
``ofc_crash_enter`` hook) and writes its label to stderr before faulthandler prints the
Python stack, where ``frame_label`` names the delegate's own frame. Nothing is done per
call. ``OPFORGE_FAULTHANDLER=0`` turns both off, as for the lean runtime.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

__all__ = ["register", "forget", "frame_label"]


def _declare(lib) -> bool:
    if getattr(lib, "_opforge_crash_declared", None) is not None:
        return lib._opforge_crash_declared
    try:
        lib.ofc_crash_reports_install.restype = ctypes.c_int32
        lib.ofc_crash_label.argtypes = [ctypes.c_void_p, ctypes.c_void_p,
                                        ctypes.POINTER(ctypes.c_uint64), ctypes.c_int32,
                                        ctypes.c_char_p]
        lib.ofc_crash_label.restype = ctypes.c_int32
        lib.ofc_crash_forget.argtypes = [ctypes.c_void_p]
        lib.ofc_crash_forget.restype = None
        ok = True
    except AttributeError:  # an engine built without crash_report.cpp
        ok = False
    lib._opforge_crash_declared = ok
    return ok


def _node_names(plan: dict) -> list[str | None]:
    """The FX node of each kernel/package op, in plan order (the lowering records one
    ``impls`` row per node it lowers, in the same order as the ops it emits)."""
    rows = [r for r in plan.get("impls", []) if isinstance(r, dict)]
    kernel_rows = [r.get("node") for r in rows if r.get("impl") == "native kernel (kernel ABI)"]
    package_rows = {}
    for r in rows:
        package_rows.setdefault(r.get("impl"), []).append(r.get("node"))
    names: list[str | None] = []
    kernels = iter(kernel_rows)
    for op in plan["ops"]:
        if op["kind"] == "kernel":
            names.append(next(kernels, None))
        elif op["kind"] == "package":
            queue = package_rows.get(op["name"]) or []
            names.append(queue.pop(0) if queue else None)
        else:
            names.append(None)
    return names


def _kernel_entry(op: dict, plan: dict, registry: Any):
    """``(fn, "native kernel <symbol> for <key> [<manifest entry>]", library, symbol
    prefix)`` for a kernel op, or None when it has no native kernel here."""
    from opforge.backends.cpu import engine

    if registry is None:
        return None
    kernel = registry.lookup(op["name"], engine._dtype_key(op, plan_tensors=plan["tensors"]))
    fn = engine._native_entry(kernel, op, plan["tensors"])
    native = getattr(kernel, "fn", None)
    if not fn or native is None:
        return None
    entries = [*getattr(native, "specific", ()), getattr(native, "fallback", None)]
    entry = next((e for e in entries if e is not None and e.fn == fn), None)
    symbol = f"{entry.kernel_name} " if entry is not None else ""
    source = f" [{entry.source}]" if entry is not None else ""
    prefix = mangled_prefix(entry.kernel_name) if entry is not None else ""
    return fn, f"native kernel {symbol}for {op['name']}{source}", native.library.path, prefix


def mangled_prefix(name: str) -> str:
    """How the Itanium-mangled name of the C++ function ``ns::...::fn`` starts
    (``_ZN2ns2fnE``; a function at global scope: ``_Z2fn``); "" for anything else."""
    parts = name.split("::")
    if not all(p.isidentifier() for p in parts):
        return ""
    encoded = "".join(f"{len(p)}{p}" for p in parts)
    return f"_ZN{encoded}E" if len(parts) > 1 else f"_Z{encoded}"


def register(handle: Any, plan: dict, registry: Any) -> None:
    """Label every kernel and package entry ``handle``'s engine calls (see the module
    docstring); ``handle.crash_names`` keeps the labels for ``frame_label``. Best effort:
    naming a crash never stops a program from loading."""
    handle.crash_names = []
    if os.environ.get("OPFORGE_FAULTHANDLER", "1") == "0" or not _declare(handle.lib):
        return
    try:
        _register(handle, plan, registry)
    except Exception:  # noqa: BLE001 - a label we cannot make is a report we do without
        handle.crash_names = []


def _register(handle: Any, plan: dict, registry: Any) -> None:
    from opforge.runtime.native import enable_crash_reports

    labels: dict[int, list[str]] = {}
    heads: dict[int, tuple[str, str]] = {}
    packages = iter(k for k in handle.keep if hasattr(k, "node") and hasattr(k, "package"))
    for index, (op, node) in enumerate(zip(plan["ops"], _node_names(plan))):
        where = f"engine op {index}" + (f" (node {node!r})" if node else "")
        if op["kind"] == "kernel":
            found = _kernel_entry(op, plan, registry)
            if found is None:
                continue
            fn, what, library, prefix = found
        elif op["kind"] == "package":
            prepared = next(packages, None)
            if prepared is None:
                continue
            fn, library = prepared.fn, prepared.package.path
            what = (f"package op {prepared.node.package}::{prepared.op.type_name} (execute) "
                    f"for {prepared.node.custom_op}")
            prefix = mangled_prefix(f"{prepared.node.package}::{prepared.op.type_name}")
        else:
            continue
        heads[fn] = (f"{what}, library {library}", prefix)
        labels.setdefault(fn, []).append(where)
    if not labels:
        return
    enable_crash_reports()  # faulthandler first: the engine's handler then runs before it
    if handle.lib.ofc_crash_reports_install() != 0:
        return
    for fn, places in labels.items():
        head, prefix = heads[fn]
        label = f"{head}, {' / '.join(places)}"
        ranges = _ranges(fn, prefix)
        flat = (ctypes.c_uint64 * max(2 * len(ranges), 1))(*[a for r in ranges for a in r])
        handle.lib.ofc_crash_label(handle.ptr, fn, flat, len(ranges),
                                   label.encode("utf-8", "replace")[:767])
        handle.crash_names.append(label)


# --- where an entry's code lies ----------------------------------------------------------
#
# The entry functions and the authors' functions they call are local symbols of their
# library (in .symtab, not in the dynamic table dladdr reads), so their extents are read
# here, from the library file, once per library, and handed to the handler as addresses.

class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


_functions_cache: dict[tuple[str, int, int], list[tuple[int, int, bytes]]] = {}


def _ranges(fn: int, prefix: str) -> list[tuple[int, int]]:
    """[start, end) addresses of the function containing ``fn`` and of the functions whose
    mangled names start with ``prefix``, in the library ``fn`` is in; [] if unknown."""
    try:
        dladdr = ctypes.CDLL(None).dladdr
        dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
        info = _DlInfo()
        if not dladdr(fn, ctypes.byref(info)) or not info.dli_fname or not info.dli_fbase:
            return []
        path = os.fsdecode(info.dli_fname)
        st = os.stat(path)
        key = (path, st.st_mtime_ns, st.st_size)
        if key not in _functions_cache:
            _functions_cache[key] = _elf_functions(path)
        functions = _functions_cache[key]
    except (OSError, ValueError, AttributeError):
        return []
    base = info.dli_fbase
    found = []
    wanted = prefix.encode()
    for value, size, name in functions:
        start = base + value
        if (start <= fn < start + size) or (wanted and name.startswith(wanted)):
            found.append((start, start + size))
    return found[:8]


def _elf_functions(path: str) -> list[tuple[int, int, bytes]]:
    """(value, size, name) of every sized function symbol of a 64-bit little-endian ELF
    file's .symtab (else .dynsym)."""
    import struct

    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return []
    shoff, = struct.unpack_from("<Q", data, 40)
    shentsize, shnum = struct.unpack_from("<HH", data, 58)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    tables = [s for s in sections if s[1] == 2] or [s for s in sections if s[1] == 11]
    out = []
    for _, _, _, _, offset, size, link, _, _, entsize in tables:
        strtab = sections[link]
        str_off = strtab[4]
        for at in range(offset, offset + size, entsize or 24):
            st_name, st_info, _, _, st_value, st_size = struct.unpack_from("<IBBHQQ", data, at)
            if st_info & 0xF != 2 or not st_size or not st_value:
                continue
            end = data.index(b"\0", str_off + st_name)
            out.append((st_value, st_size, data[str_off + st_name:end]))
    return out


def forget(handle: Any) -> None:
    """Drop ``handle``'s labels (before its engine is destroyed)."""
    if getattr(handle, "crash_names", None) and _declare(handle.lib) and handle.ptr:
        handle.lib.ofc_crash_forget(handle.ptr)
        handle.crash_names = []


def frame_label(handle: Any) -> str | None:
    """The name for the Python frame that calls ``handle``'s engine (faulthandler prints
    it, cut at 500 characters): the libraries and ops of the native code inside, or None
    when there is none. The native report names the one that crashed."""
    names = getattr(handle, "crash_names", None)
    if not names:
        return None
    libraries = sorted({n.split(", library ", 1)[1].split(", engine op", 1)[0] for n in names})
    ops = [n.split(", library ", 1)[0] for n in names]
    return (f"native code in {', '.join(libraries)}: {'; '.join(ops)}")
