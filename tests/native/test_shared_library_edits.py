"""compile_shared (the cpu engine's build on first use, MindSpore AOT sources) publishes a
library only under the key of the sources it was compiled from: a source saved while the
compiler runs (an engineer editing the engine in a checkout whose tests are compiling it)
must not leave a library of the new sources under the old sources' key, which a later
process with the old sources would load as theirs.

Needs a C++ compiler (skipped without one); no torch.
"""

from __future__ import annotations

import ctypes
import shutil
import stat

import pytest

from opforge.errors import BuildError
from opforge.native.shared_library import compile_shared

CXX = shutil.which("g++") or shutil.which("c++")
pytestmark = pytest.mark.skipif(CXX is None, reason="needs a C++ compiler")

SOURCE = 'extern "C" int value() { return %d; }\n'


def _editing_compiler(tmp_path, source, edits: int):
    """A compiler that, on each of its first ``edits`` library compiles, saves the source
    with the next value before compiling it (an edit landing mid-compile)."""
    wrapper = tmp_path / "cxx-editing"
    count = tmp_path / "compiles"
    count.write_text("0")
    wrapper.write_text(f"""#!/bin/sh
case " $* " in *" -shared "*" -o "*)
  n=$(cat {count}); echo $((n + 1)) > {count}
  if [ "$n" -lt {edits} ]; then
    v=$(sed -n 's/.*return \\([0-9]*\\);.*/\\1/p' {source})
    printf 'extern "C" int value() {{ return %d; }}\\n' $((v + 1)) > {source}
  fi;;
esac
exec {CXX} "$@"
""")
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    return wrapper, count


def _build(source, cache):
    return compile_shared([source], "edited", flags=["-shared", "-fPIC", "-O0"], kind="test-edits",
                          api="test", cache_root=cache)


def _value(library) -> int:
    return ctypes.CDLL(str(library)).value()


def test_a_source_saved_during_the_compile_does_not_poison_the_old_key(tmp_path, monkeypatch):
    source, cache = tmp_path / "edited.cpp", tmp_path / "cache"
    source.write_text(SOURCE % 1)
    wrapper, compiles = _editing_compiler(tmp_path, source, edits=1)
    monkeypatch.setenv("CXX", str(wrapper))
    built = _build(source, cache)
    assert source.read_text() == SOURCE % 2
    assert _value(built) == 2  # the library is of the sources as they are now
    source.write_text(SOURCE % 1)  # the edit undone: these sources were never compiled
    again = _build(source, cache)
    assert _value(again) == 1, "the build cache served the edited sources' library for the originals"
    assert int(compiles.read_text()) == 3  # the compile the edit spoiled was made again


def test_sources_that_keep_changing_are_a_build_error(tmp_path, monkeypatch):
    source, cache = tmp_path / "edited.cpp", tmp_path / "cache"
    source.write_text(SOURCE % 1)
    wrapper, _ = _editing_compiler(tmp_path, source, edits=100)
    monkeypatch.setenv("CXX", str(wrapper))
    with pytest.raises(BuildError, match="changed during each of 3 compiles"):
        _build(source, cache)
    assert not list((cache / "build" / "libs").glob("*"))  # nothing published
