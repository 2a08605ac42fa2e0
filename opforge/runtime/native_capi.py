"""The native runtime's C API as ctypes sees it: the structs of
``opforge/native_runtime/include/opforge/runtime.h``, each function's signature, the library
loaded once (``$OPFORGE_RUNTIME_LIBRARY`` or ``build_runtime()``), status codes turned into
opforge errors, and the dtype and staging helpers the binding (``native_executor.py``) uses.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading

import numpy as np

from opforge.errors import (
    BuildError, ConcurrentCallError, InternalError, KernelError, MissingKernelError, ProgramError,
)
from opforge.program import ScalarType

__all__ = ["runtime_library", "LIBRARY_ENV", "API_VERSION"]

LIBRARY_ENV = "OPFORGE_RUNTIME_LIBRARY"  # a prebuilt libopforge_runtime.so to use instead
API_VERSION = 1

_OK, _VALUE_TENSOR, _VALUE_INT, _VALUE_DOUBLE, _VALUE_BOOL = 0, 0, 1, 2, 3
_ERRORS = {1: ProgramError, 2: ProgramError, 3: ProgramError, 4: MissingKernelError,
           5: BuildError, 6: ProgramError, 7: KernelError, 8: ProgramError,
           9: ConcurrentCallError, 10: ProgramError, 11: ProgramError, 12: InternalError}
_SCALARS = {_VALUE_INT: int, _VALUE_DOUBLE: float, _VALUE_BOOL: bool}


class _LoadOptions(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("flags", ctypes.c_uint32),
                ("max_memory", ctypes.c_int64)]


class _IOInfo(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int32), ("dtype", ctypes.c_int32), ("rank", ctypes.c_int32),
                ("reserved", ctypes.c_int32), ("sizes", ctypes.POINTER(ctypes.c_int64)),
                ("min_sizes", ctypes.POINTER(ctypes.c_int64)),
                ("max_sizes", ctypes.POINTER(ctypes.c_int64)),
                ("dim_order", ctypes.POINTER(ctypes.c_uint8))]


class _MethodOptions(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("num_threads", ctypes.c_int32),
                ("num_arenas", ctypes.c_int64), ("arenas", ctypes.POINTER(ctypes.c_void_p)),
                ("arena_sizes", ctypes.POINTER(ctypes.c_int64))]


class _TensorView(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int32), ("rank", ctypes.c_int32),
                ("sizes", ctypes.POINTER(ctypes.c_int64)), ("nbytes", ctypes.c_int64)]


_P, _I32, _I64, _STR = ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64, ctypes.c_char_p
_PI64 = ctypes.POINTER(ctypes.c_int64)
_SIGNATURES = {  # name: (restype, argtypes)
    "opf_api_version": (ctypes.c_uint32, []),
    "opf_last_error": (_STR, []),
    "opf_registry_new": (_I32, [ctypes.POINTER(_P)]),
    "opf_registry_free": (None, [_P]),
    "opf_registry_load_library": (_I32, [_P, _STR, _I32]),
    "opf_registry_num_operators": (_I64, [_P]),
    "opf_registry_operator": (_STR, [_P, _I64]),
    "opf_program_load_path": (_I32, [_STR, _P, ctypes.POINTER(_LoadOptions), ctypes.POINTER(_P)]),
    "opf_program_load_buffer": (_I32, [_P, ctypes.c_size_t, _I32, _P,
                                       ctypes.POINTER(_LoadOptions), ctypes.POINTER(_P)]),
    "opf_program_free": (None, [_P]),
    "opf_program_num_methods": (_I64, [_P]),
    "opf_program_method_name": (_STR, [_P, _I64]),
    "opf_program_method_io": (_I32, [_P, _STR, _PI64, _PI64]),
    "opf_program_input_info": (_I32, [_P, _STR, _I64, ctypes.POINTER(_IOInfo)]),
    "opf_program_output_info": (_I32, [_P, _STR, _I64, ctypes.POINTER(_IOInfo)]),
    "opf_program_num_states": (_I64, [_P]),
    "opf_program_state_name": (_STR, [_P, _I64]),
    "opf_program_state_info": (_I32, [_P, _STR, ctypes.POINTER(_I32), ctypes.POINTER(_I32),
                                       ctypes.POINTER(_PI64), _PI64]),
    "opf_program_state_read": (_I32, [_P, _STR, _P, _I64]),
    "opf_program_state_write": (_I32, [_P, _STR, _P, _I64]),
    "opf_program_state_reset": (_I32, [_P, _STR]),
    "opf_method_new": (_I32, [_P, _STR, ctypes.POINTER(_MethodOptions), ctypes.POINTER(_P)]),
    "opf_method_free": (None, [_P]),
    "opf_method_set_input": (_I32, [_P, _I64, _P, _I32, _I32, _P, _I32]),
    "opf_method_set_input_int": (_I32, [_P, _I64, _I64]),
    "opf_method_set_input_double": (_I32, [_P, _I64, ctypes.c_double]),
    "opf_method_set_input_bool": (_I32, [_P, _I64, _I32]),
    "opf_method_execute": (_I32, [_P]),
    "opf_method_output": (_I32, [_P, _I64, ctypes.POINTER(_TensorView)]),
    "opf_method_output_scalar": (_I32, [_P, _I64, ctypes.POINTER(_I32), _PI64,
                                        ctypes.POINTER(ctypes.c_double)]),
    "opf_method_set_profiling": (_I32, [_P, _I32]),
    "opf_method_num_instructions": (_I64, [_P]),
    "opf_method_instruction_profile": (_I32, [_P, _I64, ctypes.POINTER(_STR),
                                              ctypes.POINTER(_STR), _PI64]),
}

_library: ctypes.CDLL | None = None
_library_lock = threading.Lock()


def runtime_library() -> ctypes.CDLL:
    """libopforge_runtime, loaded once: ``$OPFORGE_RUNTIME_LIBRARY`` if set, else the one
    ``opforge.native_runtime.build.build_runtime()`` builds (or finds in the cache)."""
    global _library
    with _library_lock:
        if _library is None:
            _library = _open(_library_path())
        return _library


def _library_path() -> str:
    given = os.environ.get(LIBRARY_ENV)
    if given:
        return given
    from opforge.native_runtime.build import build_runtime

    try:
        return str(build_runtime().runtime_library)
    except BuildError as e:
        raise BuildError(
            "`opforge.runtime.load(..., executor='native')`: libopforge_runtime — cannot be "
            f"built here ({e}) — valid: a C++17 compiler, CMake and Ninja to build it, or a "
            f"prebuilt library in ${LIBRARY_ENV} — fix: 1. install g++, cmake and ninja; "
            f"2. or set {LIBRARY_ENV}=/path/to/libopforge_runtime.so; 3. or use the lean "
            "runtime (executor='lean', the default)") from None


def _open(path: str) -> ctypes.CDLL:
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        raise BuildError(f"`opforge.runtime.native_executor`: {path!r} — cannot be loaded ({e}) — "
                         f"valid: libopforge_runtime.so — fix: check {LIBRARY_ENV} or rebuild "
                         "with build_runtime()") from None
    for name, (restype, argtypes) in _SIGNATURES.items():
        function = getattr(lib, name, None)
        if function is None:
            raise BuildError(f"`opforge.runtime.native_executor`: {path!r} — has no {name} — "
                             "valid: a libopforge_runtime of this opforge — fix: rebuild it")
        function.restype, function.argtypes = restype, argtypes
    version = lib.opf_api_version()
    if version != API_VERSION:
        raise BuildError(f"`opforge.runtime.native_executor`: {path!r} — C API version {version} "
                         f"— valid: {API_VERSION} — fix: rebuild it with build_runtime()")
    return lib


def _check(lib: ctypes.CDLL, status: int, api: str) -> None:
    if status != _OK:
        message = (lib.opf_last_error() or b"").decode("utf-8", "replace")
        raise _ERRORS.get(status, InternalError)(f"`{api}`: {message}")


def _numpy_dtype(code: int) -> np.dtype | None:
    try:
        return ScalarType(code).numpy_dtype()
    except (ValueError, ProgramError):
        return None  # bfloat16, complex32: read as raw bits below


def _raw_dtype(code: int) -> np.dtype:
    """The NumPy dtype an output of ``code`` is returned as: its own, or the raw bits
    (uint16) of bfloat16 / complex32, which NumPy has no dtype for."""
    dtype = _numpy_dtype(code)
    return dtype if dtype is not None else np.dtype(np.uint16 if code == 15 else np.uint32)


def _aligned_stage(shape: tuple[int, ...], dtype: np.dtype,
                   order: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """``(logical view, dense base)``: a 64-byte aligned array dense in ``order`` (the
    input's dim order, outermost first) and its view in the logical dim order."""
    dense = tuple(shape[d] for d in order)
    nbytes = int(np.prod(dense, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + 64, np.uint8)
    offset = -raw.ctypes.data % 64
    base = raw[offset:offset + nbytes].view(dtype).reshape(dense)
    return base.transpose(np.argsort(order)), base


def _raw_function(lib: ctypes.CDLL, name: str):
    """A second handle on ``lib``'s ``name`` with no argtypes (callers pass ctypes
    objects of the exact C types) and an ``int32_t`` status result."""
    function = lib[name]
    function.restype = ctypes.c_int32
    return function


def _address(array: np.ndarray) -> int | None:
    """The address of a C-contiguous array's data: through a ctypes view of its buffer
    (~0.5 µs) when writable, else ``array.ctypes`` (~2 µs, read-only arrays)."""
    if not array.nbytes:
        return None
    if array.flags.writeable:
        return ctypes.addressof(ctypes.c_char.from_buffer(array))
    return array.ctypes.data


_UNSUPPORTED = 10  # OPF_ERR_UNSUPPORTED: here, a cpu delegate without its engine library


def _use_installed_cpu_engine(lib) -> bool:
    """Point the runtime's cpu backend at opforge's own engine library (the one the Python
    cpu backend loads, with oneDNN), unless $OPFORGE_CPU_ENGINE names one. True if set."""
    if os.environ.get("OPFORGE_CPU_ENGINE"):
        return False
    try:
        from opforge.backends.cpu import engine
        path = engine.library()._name  # loads oneDNN into the process first
    except Exception:  # noqa: BLE001 - no engine here: the runtime's own message stands
        return False
    lib.opf_backend_set_library.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    lib.opf_backend_set_library.restype = ctypes.c_int32
    return lib.opf_backend_set_library(b"cpu", os.fsencode(path)) == 0


def _trust_python_packages(lib) -> None:
    """Allow the runtime's cpu backend the op-package libraries this process allowed
    (``oppackage.runtime.trust_packages``, as export does); it reads $OPFORGE_OP_PACKAGES
    itself. A runtime built without the cpu backend has no opf_op_package_trust."""
    packages = sys.modules.get("opforge.backends.oppackage.runtime")
    trust = getattr(lib, "opf_op_package_trust", None)
    if packages is None or trust is None:
        return
    trust.argtypes, trust.restype = [ctypes.c_char_p], ctypes.c_int32
    for path in sorted(packages._trusted):
        trust(os.fsencode(path))
