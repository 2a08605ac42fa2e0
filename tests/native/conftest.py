"""Fixtures of the native tests: one build of the bundled example library per module,
through a cache that every module of the session (per xdist worker) shares."""

import pytest

from opforge.native import build_library
from opforge.examples.my_ops import manifest_path


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    # The base temp dir is shared by every module of this session (and xdist worker), so
    # libraries built by one test module are cache hits in the others.
    return tmp_path_factory.getbasetemp() / "opforge-cache"


@pytest.fixture(scope="module")
def full(cache, tmp_path_factory):
    """The example manifest's library with every kernel, built from the bundled sources."""
    sources = sorted((manifest_path().parent / "kernels").glob("*.cpp"))
    out = tmp_path_factory.mktemp("full") / "libmy_ops.so"
    return build_library(manifest_path(), sources, out, cache_root=cache)
