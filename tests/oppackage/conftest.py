"""Fixtures of the op-package tests: the example package built once per session (through a
session-wide build cache), and a helper that builds small packages from C++ text."""

import textwrap
from pathlib import Path

import pytest

from oppackage_support import EXAMPLE


@pytest.fixture(scope="session")
def pkg_cache(tmp_path_factory):
    return tmp_path_factory.getbasetemp() / "oppackage-cache"


@pytest.fixture(scope="session")
def example_library(pkg_cache, tmp_path_factory):
    from opforge.backends.oppackage import build_package

    from opforge.backends.oppackage.runtime import trust_packages

    out = tmp_path_factory.mktemp("example") / "libQnnExampleOpPackage.so"
    library = build_package(EXAMPLE, target="cpu", output=out, cache_root=pkg_cache)
    trust_packages([library])  # as export does for the packages it is given
    return library


@pytest.fixture
def raw_package(pkg_cache, tmp_path):
    """``build(name, body) -> path``: a package library from hand-written C++ (``body``
    defines whatever it likes; the ABI header is included)."""
    from opforge.backends.oppackage.build import compile_package
    from opforge.backends.oppackage.skeleton import include_dir

    def build(name: str, body: str) -> Path:
        src = tmp_path / f"{name}.cpp"
        src.write_text('#include "opforge/oppackage.hpp"\n' + textwrap.dedent(body))
        return compile_package([src], name, include_dirs=[include_dir()], cache_root=pkg_cache)

    return build
