"""The ``extra`` argument of a MindSpore AOT kernel: an ``AotExtra`` object, made with ctypes.

    ExtraObject(values, string_abi, where)   one object per bound kernel (or infer call)
      .address        what the kernel, Init and the infer functions get as ``extra``
      .workspace()    the sizes an Init function set with SetWorkSpace
      .raise_errors() a KernelError for what a kernel asked and could not get

# Design
#
# MindSpore's ``AotExtra`` is a C++ class with virtual functions; kernels call them inline
# from its header (``Attr<float>("scale")`` calls ``GetAttrFloat``). So whatever header a
# library was built with (MindSpore's, beside the .cc, or opforge's, which copies the
# layout), the object behind ``extra`` must be laid out as MindSpore's (Itanium C++ ABI):
#
#   +0   vptr → [~AotExtra, ~AotExtra (deleting), HasAttr, GetAttrBool, GetAttrInt,
#                GetAttrFloat, GetAttrStr, GetAttrIntVec, GetAttrFloatVec, GetAttrInt2DVec,
#                GetAttrFloat2DVec]
#   +8   std::vector<size_t> workspace_   (begin, end, capacity)
#   +32  AotKernelData* kernel_data_
#
# The vtable entries are ctypes callbacks into Python: no compiler and no C++ runtime
# library of opforge's own is needed where a program runs. A virtual call passes ``this``
# first; a std::string argument is passed as a pointer to the caller's object, whose first
# word is the character pointer in both of libstdc++'s string ABIs; a returned std::string
# or std::vector is written through a hidden pointer passed before ``this`` (x86-64 System
# V: in rdi, which ctypes sets; on other architectures the hidden pointer has its own
# register and those four entries report an error instead). Vectors are allocated with
# libstdc++'s ``operator new``: the kernel frees them. A returned std::string depends on the
# library's string ABI (``_GLIBCXX_USE_CXX11_ABI``: 0, MindSpore's, a copy-on-write string;
# 1, the default of GCC): opforge's header exports it (``opforge_ms_string_abi``), otherwise
# the library's references to libstdc++'s string symbols tell; when neither does, reading a
# string attribute is refused. A C++ exception cannot cross a ctypes callback, so a failed
# read (missing attribute, wrong type) returns 0 and is raised as a KernelError when the
# kernel returns; its outputs are never handed out.
"""

from __future__ import annotations

import ctypes
import platform
import struct

from opforge.errors import KernelError

__all__ = ["ExtraObject", "string_abi_of"]

_SRET = platform.machine().lower() in ("x86_64", "amd64")

_DTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_BOOL = ctypes.CFUNCTYPE(ctypes.c_bool, ctypes.c_void_p, ctypes.c_void_p)
_INT = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p)
_FLOAT = ctypes.CFUNCTYPE(ctypes.c_float, ctypes.c_void_p, ctypes.c_void_p)
_RETURNED = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)


class _Object(ctypes.Structure):
    # MindSpore's AotExtra, then zeros: a library built against opforge's header of
    # format 1 (a plain struct, 160 bytes) reads no attribute and no workspace from them.
    _fields_ = [("vptr", ctypes.c_void_p), ("ws_begin", ctypes.c_void_p),
                ("ws_end", ctypes.c_void_p), ("ws_cap", ctypes.c_void_p),
                ("kernel_data", ctypes.c_void_p), ("zeros", ctypes.c_uint64 * 20)]


_libstdcxx: list = []


def _cxx_runtime():
    """libstdc++'s operator new and delete (None where there is no libstdc++)."""
    if not _libstdcxx:
        try:
            lib = ctypes.CDLL("libstdc++.so.6")
            new, delete = lib._Znwm, lib._ZdlPv
            new.restype, new.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
            delete.restype, delete.argtypes = None, [ctypes.c_void_p]
            _libstdcxx.append((new, delete))
        except (OSError, AttributeError):
            _libstdcxx.append(None)
    return _libstdcxx[0]


def string_abi_of(dll, path: str) -> int | None:
    """The std::string ABI a library was built with: 0 (copy-on-write), 1 (C++11), None."""
    try:
        return int(ctypes.c_int.in_dll(dll, "opforge_ms_string_abi").value)
    except ValueError:
        pass
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    new = b"St7__cxx1112basic_stringIcSt11char_traitsIcESaIcEE" in data
    old = b"_ZNSs" in data or b"_ZNKSs" in data
    return 1 if new and not old else 0 if old and not new else None


def _name(pointer: int) -> str:
    text = ctypes.cast(pointer, ctypes.POINTER(ctypes.c_char_p))[0]
    return (text or b"").decode("utf-8", "replace")


class ExtraObject:
    """One ``AotExtra`` with the attribute ``values`` (name → (value_type, value))."""

    def __init__(self, values: dict[str, tuple[str, object]], string_abi: int | None,
                 where: str) -> None:
        self.values, self.string_abi, self.where = dict(values), string_abi, where
        self.errors: list[str] = []
        noop = _DTOR(lambda this: None)
        self._callbacks = [
            noop, noop, _BOOL(self._guard(lambda name: name in self.values, False)),
            _BOOL(self._guard(lambda name: self._read(name, "bool", ("bool",)), False)),
            _INT(self._guard(lambda name: self._read(name, "int64_t", ("int",)), 0)),
            _FLOAT(self._guard(lambda name: self._read(name, "float", ("float", "int")), 0.0)),
            _RETURNED(self._returning(self._string, "std::string", ("str",))),
            _RETURNED(self._returning(self._vector("q"), "std::vector<int64_t>", ("listInt",))),
            _RETURNED(self._returning(self._vector("f"), "std::vector<float>",
                                      ("listFloat", "listInt"))),
            _RETURNED(self._returning(self._vector2d("q"), "std::vector<std::vector<int64_t>>",
                                      ("listListInt",))),
            _RETURNED(self._returning(self._vector2d("f"), "std::vector<std::vector<float>>",
                                      ("listListFloat", "listListInt"))),
        ]
        self._vtable = (ctypes.c_void_p * len(self._callbacks))(
            *[ctypes.cast(c, ctypes.c_void_p).value for c in self._callbacks])
        self._object = _Object(vptr=ctypes.addressof(self._vtable))
        self.address = ctypes.addressof(self._object)

    # --- what the kernel asked for -------------------------------------------------------

    def _guard(self, read, zero):
        def call(this, name_pointer):
            try:
                return read(_name(name_pointer))
            except _ReadError as e:
                self.errors.append(str(e))
            except Exception as e:  # noqa: BLE001 - nothing may unwind into C
                self.errors.append(f"internal error reading an attribute: {e!r}")
            return zero

        return call

    def _read(self, name: str, ctype: str, kinds: tuple[str, ...]):
        if name not in self.values:
            known = ", ".join(sorted(self.values)) or "none"
            raise _ReadError(f"Attr<{ctype}>({name!r}): the op has no attribute {name!r} "
                             f"(attributes with a value: {known}) — fix: give it a value in "
                             f"reg_info (.attr({name!r}, \"required\", TYPE, \"VALUE\")) or with "
                             f"add_prim_attr({name!r}, value)")
        declared, value = self.values[name]
        if declared not in kinds:
            raise _ReadError(f"Attr<{ctype}>({name!r}): the attribute is a {declared} "
                             f"({value!r}) — valid for Attr<{ctype}>: {', '.join(kinds)} — fix: "
                             "read it with the C++ type of its value_type")
        if declared in ("float", "int") and ctype == "float":
            return float(value)
        return value

    def _returning(self, write, ctype: str, kinds: tuple[str, ...]):
        def call(result, this, name_pointer):
            try:
                if not _SRET:
                    raise _ReadError(f"Attr<{ctype}>: returned C++ objects are read on x86-64 "
                                     f"only (here {platform.machine()}) — fix: use scalar "
                                     "attributes")
                write(result, self._read(_name(name_pointer), ctype, kinds))
            except _ReadError as e:
                self.errors.append(str(e))
                self._empty(result, ctype)
            except Exception as e:  # noqa: BLE001
                self.errors.append(f"internal error reading {ctype}: {e!r}")
                self._empty(result, ctype)
            return result

        return call

    def _empty(self, result: int, ctype: str) -> None:
        """A valid empty result (the caller destroys it): an empty vector is three null
        pointers; an empty string is written in the library's ABI (MindSpore's when unknown)."""
        if ctype != "std::string":
            ctypes.memset(result, 0, 24)
        elif _cxx_runtime() is not None or self.string_abi == 1:
            self._write_string(result, "", 0 if self.string_abi is None else self.string_abi)

    def _allocate(self, size: int) -> int:
        runtime = _cxx_runtime()
        if runtime is None:
            raise _ReadError("no libstdc++ in this process to allocate the result — fix: use "
                             "scalar attributes")
        return runtime[0](max(size, 1))

    def _vector(self, code: str):
        def write(result: int, values: list) -> None:
            data = struct.pack(f"<{len(values)}{code}", *values)
            begin = self._allocate(len(data)) if data else 0
            if data:
                ctypes.memmove(begin, data, len(data))
            ctypes.memmove(result, struct.pack("<3Q", begin, begin + len(data),
                                               begin + len(data)), 24)

        return write

    def _vector2d(self, code: str):
        inner = self._vector(code)

        def write(result: int, rows: list) -> None:
            begin = self._allocate(24 * len(rows)) if rows else 0
            for i, row in enumerate(rows):
                inner(begin + 24 * i, row)
            end = begin + 24 * len(rows)
            ctypes.memmove(result, struct.pack("<3Q", begin, end, end), 24)

        return write

    def _string(self, result: int, text: str) -> None:
        if self.string_abi is None:
            raise _ReadError("Attr<std::string>: cannot tell which std::string ABI the library "
                             "was built with (_GLIBCXX_USE_CXX11_ABI) — fix: build it with "
                             "opforge (Custom(\"file.cc:Name\") or opforge msop build), or "
                             "include opforge's custom_aot_extra.h")
        self._write_string(result, text, self.string_abi)

    def _write_string(self, result: int, text: str, abi: int) -> None:
        data = text.encode()
        if abi == 0:  # copy-on-write: a pointer to chars after a _Rep header
            rep = self._allocate(24 + len(data) + 1)
            ctypes.memmove(rep, struct.pack("<QQi4x", len(data), len(data), 0) + data + b"\0",
                           24 + len(data) + 1)
            ctypes.memmove(result, struct.pack("<Q", rep + 24), 8)
        elif len(data) < 16:  # C++11 string, short: the characters inside the object
            ctypes.memmove(result, struct.pack("<QQ", result + 16, len(data)), 16)
            ctypes.memmove(result + 16, data + b"\0", len(data) + 1)
        else:
            chars = self._allocate(len(data) + 1)
            ctypes.memmove(chars, data + b"\0", len(data) + 1)
            ctypes.memmove(result, struct.pack("<QQQ", chars, len(data), len(data)), 24)

    # --- what the runtime reads back ---------------------------------------------------------

    def workspace(self) -> list[int]:
        """The sizes SetWorkSpace stored (bytes)."""
        begin, end = self._object.ws_begin, self._object.ws_end
        if not begin or not end or end < begin or (end - begin) % 8 or end - begin > 8 * 1024:
            return []
        return list((ctypes.c_uint64 * ((end - begin) // 8)).from_address(begin))

    def raise_errors(self, where: str) -> None:
        """A KernelError for every failed read since the last call (then forgets them)."""
        if self.errors:
            errors, self.errors = self.errors, []
            raise KernelError(f"{where}: " + "; ".join(dict.fromkeys(errors)) +
                              " (the call's results were discarded)")

    def __del__(self) -> None:
        try:
            runtime = _cxx_runtime()
            if runtime is not None and self._object.ws_begin:
                runtime[1](self._object.ws_begin)
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


class _ReadError(Exception):
    pass
