"""Fixtures of the native runtime's tests (they need a C++ compiler, CMake and Ninja)."""

import pytest

from opforge.native_runtime.build import build_runtime


@pytest.fixture(scope="session")
def native_runtime():
    """The built native runtime (``BuiltRuntime``): libraries and tools, cached."""
    return build_runtime()
