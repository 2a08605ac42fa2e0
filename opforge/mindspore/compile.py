"""Compiling MindSpore AOT sources (``func="file.cc:Name"``, vendor packages) into a
shared library, through opforge's content-addressed build cache.

MindSpore compiles such a file with one compiler call (``g++ -std=c++17 --shared -fPIC
-D_GLIBCXX_USE_CXX11_ABI=0``, its source folder and its include directory on the include
path); so does opforge, with the same flags, ``-I<each source's folder>`` first and then
``opforge/mindspore/include`` (the ``custom_aot_extra.h`` authors include). A
``custom_aot_extra.h`` beside the source (MindSpore's own, as MindSpore projects keep it)
wins, as it does in MindSpore: the object behind ``extra`` has MindSpore's layout either
way (``extra.py``). No CMake project: there is no generated glue to build, and one call is
the whole build. The cache key hashes the sources' bytes, the headers beside them, opforge's
header, the flags and the compiler's identity, so a warm call copies nothing and compiles
nothing.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Sequence

from opforge.native.shared_library import compile_shared
from opforge.errors import BuildError

__all__ = ["include_dir", "compile_library"]

FLAGS = ("-std=c++17", "-shared", "-fPIC", "-O2", "-D_GLIBCXX_USE_CXX11_ABI=0",
         "-Wl,--no-undefined")
_HEADERS = (".h", ".hh", ".hpp", ".hxx", ".inc")


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
    folders = list(dict.fromkeys(Path(s).resolve().parent for s in sources))
    local = {}
    for folder in folders:
        for path in sorted(folder.iterdir()) if folder.is_dir() else ():
            if path.suffix in _HEADERS and path.is_file():
                local[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return compile_shared(sources, name, flags=[*FLAGS, *flags],
                          include_dirs=[*folders, include_dir()], kind="mindspore-aot", api=api,
                          cache_root=cache_root,
                          extra={"header": hashlib.sha256(header).hexdigest(),
                                 "local_headers": local})
