"""MindSpore's AOT C signature, called from NumPy through ctypes (no torch, no compiler).

    AotLibrary(path)             dlopen a MindSpore AOT kernel library
      .functions("Name")         → AotFunctions: Name, NameInferShape, NameInferType,
                                   NameInit and NameOpProto, each found by symbol
    AotFunctions.infer_shape / infer_type / init / bind_launch

# Design
#
# The kernel and Init are plain C and are called as such. NameInferShape and NameInferType
# are ``extern "C"`` functions that take or return C++ objects (``std::vector``): on x86-64
# (System V) a returned vector comes back through a hidden pointer passed first, and a
# vector passed by value goes as a pointer to a caller-owned object; a vector is three
# pointers (begin, end, capacity) in libstdc++ and libc++. We call them that way and free
# returned buffers with the library's own ``operator delete``. Other architectures pass
# the hidden pointer in a register ctypes cannot set: there the C++ infer functions are
# refused with a fix (Python inference), and kernels still run.
#
# ``extra`` points to an ``AotExtra`` object laid out as MindSpore's (``extra.py``).
"""

from __future__ import annotations

import ctypes
import os
import platform
from dataclasses import dataclass

import numpy as np

from opforge.errors import BuildError, KernelError
from opforge.mindspore.dtypes import TYPE_IDS, type_id_name
from opforge.mindspore.extra import ExtraObject, string_abi_of
from opforge.runtime.threads import note_library_loaded

__all__ = ["AotLibrary", "AotFunctions", "cpp_infer_supported"]


class _Vector(ctypes.Structure):  # std::vector<T>: begin, end, capacity
    _fields_ = [("begin", ctypes.c_void_p), ("end", ctypes.c_void_p), ("cap", ctypes.c_void_p)]


_KERNEL = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_void_p),
                           ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.POINTER(ctypes.c_int64)),
                           ctypes.POINTER(ctypes.c_char_p), ctypes.c_void_p, ctypes.c_void_p)
_INIT = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_int),
                         ctypes.POINTER(ctypes.POINTER(ctypes.c_int64)),
                         ctypes.POINTER(ctypes.c_char_p), ctypes.c_void_p)
_INFER_SHAPE = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int),
                                ctypes.POINTER(ctypes.POINTER(ctypes.c_int64)), ctypes.c_void_p)
_INFER_TYPE_ONE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
_INFER_TYPE_MANY = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
_PROTO = ctypes.CFUNCTYPE(ctypes.c_char_p)


def cpp_infer_supported() -> bool:
    """Can C++ infer functions be called here (x86-64, see the design note)?"""
    return platform.machine().lower() in ("x86_64", "amd64")


def shape_arrays(shapes: list[tuple[int, ...]]) -> tuple[ctypes.Array, ctypes.Array, list]:
    """``ndims`` (int[]) and ``shapes`` (int64_t*[]) as MindSpore passes them."""
    ndims = (ctypes.c_int * max(len(shapes), 1))(*[len(s) for s in shapes])
    rows = [(ctypes.c_int64 * max(len(s), 1))(*s) for s in shapes]
    table = (ctypes.POINTER(ctypes.c_int64) * max(len(shapes), 1))(
        *[ctypes.cast(r, ctypes.POINTER(ctypes.c_int64)) for r in rows])
    return ndims, table, rows


def dtype_array(names: list[str]) -> ctypes.Array:
    return (ctypes.c_char_p * max(len(names), 1))(*[n.encode() for n in names])


class AotLibrary:
    """A MindSpore AOT kernel library, opened once per path and process."""

    _opened: dict[str, "AotLibrary"] = {}

    def __init__(self, path: str | os.PathLike, *, api: str = "opforge.mindspore") -> None:
        self.path = os.path.abspath(os.fspath(path))
        try:
            with open(self.path, "rb") as f:
                magic = f.read(4)
        except OSError as e:
            raise BuildError(f"`{api}`: AOT library {self.path!r} — cannot be read "
                             f"({e.strerror or e}) — valid: an existing shared library — fix: "
                             "check the path before ':' in func") from None
        if magic != b"\x7fELF":
            raise BuildError(f"`{api}`: AOT library {self.path!r} — not a shared object (no ELF "
                             "header) — valid: a .so built with -shared -fPIC — fix: compile the "
                             "kernel into a shared library, or pass the .cc/.cpp source")
        try:
            self._dll = ctypes.CDLL(self.path, mode=getattr(os, "RTLD_LOCAL", 0) | os.RTLD_NOW)
            note_library_loaded(self.path)  # it may bring an OpenMP or BLAS pool (runtime/threads.py)
        except OSError as e:
            raise BuildError(f"`{api}`: AOT library {self.path!r} — the dynamic loader refused "
                             f"it ({e}) — fix: link every symbol it needs (-Wl,--no-undefined), "
                             "or rebuild it for this machine") from None
        delete = getattr(self._dll, "_ZdlPv", None)  # operator delete(void*)
        if delete is not None:
            delete.restype, delete.argtypes = None, [ctypes.c_void_p]
        self._delete = delete
        self._string_abi: list = []

    @property
    def string_abi(self) -> int | None:
        """The library's std::string ABI (``extra.string_abi_of``)."""
        if not self._string_abi:
            self._string_abi.append(string_abi_of(self._dll, self.path))
        return self._string_abi[0]

    @classmethod
    def open(cls, path: str | os.PathLike, *, api: str = "opforge.mindspore") -> "AotLibrary":
        key = os.path.abspath(os.fspath(path))
        if key not in cls._opened:
            cls._opened[key] = cls(key, api=api)
        return cls._opened[key]

    def address(self, symbol: str) -> int | None:
        try:
            return ctypes.cast(getattr(self._dll, symbol), ctypes.c_void_p).value
        except AttributeError:
            return None

    def functions(self, name: str) -> "AotFunctions":
        """The kernel ``name`` and its companions (None where the library lacks one)."""
        return AotFunctions(self, name, self.address(name), self.address(name + "InferShape"),
                            self.address(name + "InferType"), self.address(name + "Init"),
                            self.address(name + "OpProto"))

    def free(self, pointer: int | None) -> None:
        if pointer and self._delete is not None:
            self._delete(pointer)


@dataclass
class AotFunctions:
    """The functions of one AOT operator in a library (addresses; None when absent)."""

    library: AotLibrary
    name: str
    kernel: int | None
    infer_shape_fn: int | None
    infer_type_fn: int | None
    init_fn: int | None
    proto_fn: int | None

    def __post_init__(self) -> None:
        self._kernel = _KERNEL(self.kernel) if self.kernel else None

    def proto(self) -> str | None:
        """The JSON prototype a library exports with OPFORGE_MS_OP_PROTO, or None."""
        if not self.proto_fn:
            return None
        text = _PROTO(self.proto_fn)()
        return None if text is None else text.decode("utf-8", "replace")

    def infer_shape(self, input_shapes: list[tuple[int, ...]], n_outputs: int,
                    extra: ExtraObject) -> list[tuple[int, ...]]:
        """Call ``NameInferShape``; one shape per output."""
        ndims, shapes, keep = shape_arrays(input_shapes)
        result = _Vector()
        _INFER_SHAPE(self.infer_shape_fn)(ctypes.addressof(result), ndims, shapes, extra.address)
        extra.raise_errors(f"`{self.name}InferShape` ({self.library.path})")
        if n_outputs == 1:
            return [self._take(result, ctypes.c_int64)]
        outer = self._elements(result, _Vector)
        shapes_out = [self._take(v, ctypes.c_int64) for v in outer]
        self.library.free(result.begin)
        return shapes_out

    def infer_type(self, input_dtypes: list[str], n_outputs: int,
                   extra: ExtraObject) -> list[str | None]:
        """Call ``NameInferType``; one dtype name per output (None: not a number type)."""
        ids = (ctypes.c_int * max(len(input_dtypes), 1))(*[TYPE_IDS.get(d, 0) for d in input_dtypes])
        argument = _Vector(ctypes.addressof(ids), ctypes.addressof(ids) + 4 * len(input_dtypes),
                           ctypes.addressof(ids) + 4 * len(input_dtypes))
        if n_outputs == 1:
            number = _INFER_TYPE_ONE(self.infer_type_fn)(ctypes.addressof(argument),
                                                         extra.address)
            extra.raise_errors(f"`{self.name}InferType` ({self.library.path})")
            return [type_id_name(number)]
        result = _Vector()
        _INFER_TYPE_MANY(self.infer_type_fn)(ctypes.addressof(result), ctypes.addressof(argument),
                                             extra.address)
        extra.raise_errors(f"`{self.name}InferType` ({self.library.path})")
        return [type_id_name(int(n)) for n in self._take(result, ctypes.c_int)]

    def init(self, shapes: list[tuple[int, ...]], dtypes: list[str], extra: ExtraObject) -> int:
        ndims, table, keep = shape_arrays(shapes)
        status = _INIT(self.init_fn)(ndims, table, dtype_array(dtypes), extra.address)
        extra.raise_errors(f"`{self.name}Init` ({self.library.path})")
        return status

    def bind_launch(self, arrays: list[np.ndarray], shapes: list[tuple[int, ...]],
                    dtypes: list[str], extra: ExtraObject):
        """Marshal once; return a zero-argument call returning the kernel's status."""
        params = (ctypes.c_void_p * max(len(arrays), 1))(
            *[a.__array_interface__["data"][0] for a in arrays])
        ndims, table, rows = shape_arrays(shapes)
        names = dtype_array(dtypes)
        kernel, n, extra_address = self._kernel, len(arrays), extra.address

        def call() -> int:
            return kernel(n, params, ndims, table, names, None, extra_address)

        call.keep = (params, ndims, table, rows, names, arrays, extra)
        return call

    def _elements(self, vector: _Vector, ctype) -> list:
        size = ctypes.sizeof(ctype)
        if not vector.begin or not vector.end or vector.end < vector.begin:
            return []
        count = (vector.end - vector.begin) // size
        if count > 64:  # a rank (or output count) beyond any tensor's: not a vector we made
            raise KernelError(f"`{self.name}InferShape`/`{self.name}InferType` "
                              f"({self.library.path}): returned {count} elements — valid: at most "
                              "64 — fix: return std::vector<int64_t> (one output) or "
                              "std::vector<std::vector<int64_t>> (several)")
        return list((ctype * count).from_address(vector.begin))

    def _take(self, vector: _Vector, ctype) -> tuple:
        values = tuple(int(v) for v in self._elements(vector, ctype))
        self.library.free(vector.begin)
        return values
