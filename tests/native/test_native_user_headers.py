"""User headers a kernel source includes (``#include "scale.h"`` beside the .cpp) are part of
what a cached library is valid for: build.json records each one's path and SHA-256 (from
Ninja's deps log), every cache hit re-hashes them, and a changed or deleted header is a
miss. Needs a C++ compiler; no torch.
"""

import hashlib
import json
import logging
import os
import shutil

import numpy as np
import pytest

from opforge.errors import BuildError
from opforge.examples.my_ops import manifest_path
from opforge.native import build_library
from opforge.runtime.native import NativeLibrary

pytestmark = pytest.mark.skipif(shutil.which("c++") is None and shutil.which("g++") is None,
                                reason="needs a C++ compiler")

KERNELS = manifest_path().parent / "kernels"


@pytest.fixture
def sources(tmp_path):
    """The example's sources, with mul.cpp taking mul3's factor from a local header."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("minmax.cpp", "mul.cpp", "scaled_sum.cpp"):
        shutil.copy(KERNELS / name, src / name)
    mul = src / "mul.cpp"
    text = mul.read_text()
    edited = text.replace('#include "opforge/kernel.h"',
                          '#include "opforge/kernel.h"\n#include "scale.h"')
    edited = edited.replace('"my_ops::mul3.out", input, output, 3)',
                            '"my_ops::mul3.out", input, output, MUL3_FACTOR)')
    assert edited.count("MUL3_FACTOR") == 1 and "scale.h" in edited
    mul.write_text(edited)
    _set_factor(src / "scale.h", 3)
    return [src / "minmax.cpp", mul, src / "scaled_sum.cpp"]


def _set_factor(header, factor):
    header.write_text(f"#pragma once\n#define MUL3_FACTOR {factor}\n")


def _build(sources, tmp_path):
    # a new output directory each time: dlopen would hand back an already loaded path
    out = tmp_path / f"out{len(list(tmp_path.glob('out*')))}" / "libmy_ops.so"
    return build_library(manifest_path(), sources, out, cache_root=tmp_path / "cache")


def _mul3(result):
    x, out = np.arange(4, dtype=np.float32), np.empty(4, np.float32)
    NativeLibrary(result.path).kernel("my_ops::mul3.out")(x, out)
    return (out / np.maximum(x, 1)).tolist()[1:]


def _record(result):
    return json.loads((result.project_dir.parent / "build.json").read_text())


def test_build_json_records_the_user_header_only(sources, tmp_path):
    first = _build(sources, tmp_path)
    header = str(sources[1].parent / "scale.h")
    # the user's header, with its bytes' SHA-256; not opforge's headers, not the system's
    assert list(_record(first)["headers"]) == [header]
    assert _record(first)["headers"][header] == hashlib.sha256(
        (sources[1].parent / "scale.h").read_bytes()).hexdigest()


def test_unchanged_header_is_a_cache_hit(sources, tmp_path):
    first = _build(sources, tmp_path)
    assert not first.cached and _mul3(first) == [3.0, 3.0, 3.0]
    again = _build(sources, tmp_path)
    assert again.cached and again.key == first.key and again.compiled == ()
    assert _mul3(again) == [3.0, 3.0, 3.0]


def test_edited_header_rebuilds_with_the_new_constant(sources, tmp_path, caplog):
    first = _build(sources, tmp_path)
    assert _mul3(first) == [3.0, 3.0, 3.0]
    header = sources[1].parent / "scale.h"
    stat = header.stat()
    _set_factor(header, 7)
    # keep the old mtime: Ninja alone would not see the edit; the recorded SHA-256 does
    os.utime(header, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    with caplog.at_level(logging.INFO, logger="opforge.native"):
        second = _build(sources, tmp_path)
    assert not second.cached and second.key == first.key
    assert second.compiled == (str(sources[1]),)  # only the source that includes it
    assert _mul3(second) == [7.0, 7.0, 7.0]
    # an edit is no corruption: said at INFO, not as a warning
    (said,) = [r for r in caplog.records if "scale.h changed since the build" in r.getMessage()]
    assert said.levelno == logging.INFO
    # the new entry is published: the next build is a hit serving the new library
    third = _build(sources, tmp_path)
    assert third.cached and _mul3(third) == [7.0, 7.0, 7.0]
    assert list(_record(third)["headers"].values()) == [
        hashlib.sha256(header.read_bytes()).hexdigest()]


def test_deleted_header_fails_cleanly_in_the_compiler(sources, tmp_path):
    first = _build(sources, tmp_path)
    assert _mul3(first) == [3.0, 3.0, 3.0]
    (sources[1].parent / "scale.h").unlink()
    with pytest.raises(BuildError) as info:
        _build(sources, tmp_path)
    message = str(info.value)
    assert "scale.h" in message and "mul.cpp" in message
    # the outdated entry is gone, not served
    assert not (tmp_path / "cache" / "build" / "libs" / first.key).exists()
