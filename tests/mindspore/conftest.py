"""Fixtures of the MindSpore front-end tests: test kernels compiled once per session
through a shared build cache; tests needing a compiler skip cleanly without one."""

import pytest

from mindspore_support import HAVE_CXX, KERNELS, needs_cxx  # noqa: F401


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.getbasetemp() / "opforge-cache"


@pytest.fixture(scope="module")
def extra_lib(cache):
    """tests/mindspore/kernels/extra_ops.cc compiled (MinMax, Scale, Fail, ProtoAdd...)."""
    if not HAVE_CXX:
        pytest.skip("needs a C++ compiler")
    from opforge.mindspore.compile import compile_library

    return str(compile_library([KERNELS / "extra_ops.cc"], "extra_ops", cache_root=cache))


@pytest.fixture(scope="module")
def add_lib(cache):
    """The AddCustom example (kernel + C++ inference) compiled."""
    if not HAVE_CXX:
        pytest.skip("needs a C++ compiler")
    from opforge.examples.mindspore_add import SOURCE
    from opforge.mindspore.compile import compile_library

    return str(compile_library([SOURCE], "add_custom", cache_root=cache))


@pytest.fixture
def search_path(monkeypatch, tmp_path):
    """An empty search path (both variables cleared, default install location in tmp)."""
    monkeypatch.delenv("OPFORGE_CUSTOM_OPP_PATH", raising=False)
    monkeypatch.delenv("ASCEND_CUSTOM_OPP_PATH", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    return tmp_path
