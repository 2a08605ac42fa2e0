"""Fixtures of the native runtime's tests (they need a C++ compiler, CMake and Ninja)."""

import ctypes

import pytest

from opforge.native_runtime.build import build_runtime


@pytest.fixture(scope="session")
def native_runtime():
    """The built native runtime (``BuiltRuntime``): libraries and tools, cached."""
    return build_runtime()


@pytest.fixture(scope="module")
def verify(native_runtime):
    """``verify(data) -> (status, message)``: the native verifier (``opf_program_verify``) on
    a program file's bytes, and its last error ("" when it accepts)."""
    lib = ctypes.CDLL(str(native_runtime.runtime_library))
    lib.opf_program_verify.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    lib.opf_program_verify.restype = ctypes.c_int
    lib.opf_last_error.restype = ctypes.c_char_p

    def run(data: bytes) -> tuple[int, str]:
        rc = lib.opf_program_verify(data, len(data))
        return rc, lib.opf_last_error().decode("utf-8", "replace")
    return run
