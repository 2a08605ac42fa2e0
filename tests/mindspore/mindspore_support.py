"""Names the MindSpore tests share (imported by name: a module called ``conftest`` is
ambiguous when several test folders have one, as under pytest-xdist)."""

import shutil
from pathlib import Path

import pytest

KERNELS = Path(__file__).parent / "kernels"
HAVE_CXX = shutil.which("c++") is not None or shutil.which("g++") is not None
needs_cxx = pytest.mark.skipif(not HAVE_CXX, reason="needs a C++ compiler")
