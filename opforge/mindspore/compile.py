"""Compiling MindSpore AOT sources (``func="file.cc:Name"``, vendor packages) into a
shared library, through opforge's content-addressed build cache.

MindSpore compiles such a file with one compiler call (``g++ -std=c++17 --shared -fPIC``
and its include directory); so does opforge, with ``opforge/mindspore/include`` (the
``custom_aot_extra.h`` authors include) on the include path. No CMake project: there is no
generated glue to build, and one call is the whole build. The cache key hashes the
sources' bytes, the header, the flags and the compiler's identity, so a warm call copies
nothing and compiles nothing.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Sequence

from opforge.native.shared_library import compile_shared
from opforge.errors import BuildError

__all__ = ["include_dir", "compile_library"]

FLAGS = ("-std=c++17", "-shared", "-fPIC", "-O2", "-Wl,--no-undefined")


def include_dir() -> Path:
    """The folder holding ``custom_aot_extra.h`` (add it with ``-I`` to build by hand)."""
    return Path(__file__).resolve().parent / "include"


def compile_library(sources: Sequence[str | os.PathLike], name: str, *,
                    flags: Sequence[str] = (), cache_root: Path | None = None,
                    api: str = "opforge.mindspore") -> Path:
    """Compile ``sources`` into ``lib<name>.so`` in the build cache; its path.

    >>> compile_library(["add_custom.cc"], "add_custom")      # doctest: +SKIP
    PosixPath('~/.cache/opforge/native/libs/3f.../libadd_custom.so')
    """
    header = (include_dir() / "custom_aot_extra.h").read_bytes()
    return compile_shared(sources, name, flags=[*FLAGS, *flags], include_dirs=[include_dir()],
                          kind="mindspore-aot", api=api, cache_root=cache_root,
                          extra={"header": hashlib.sha256(header).hexdigest()})
