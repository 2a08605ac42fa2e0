"""The build cache verifies every hit: a cached library that was truncated, altered in place
or deleted, a broken build.json, or an entry from before hashes were recorded is evicted
and rebuilt, and the library then loads. The copy-out to -o keeps modes, sweeps stale temp
files, and a full disk or a cache under a regular file is a clean BuildError (issue 11).

Needs a C++ compiler (skipped without one); no torch.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import stat
import subprocess
import sys

import numpy as np
import pytest

from opforge._user_files import TEMP_SUFFIX
from opforge.native import build_library
from opforge.native.cache import BuildCache
from opforge.cli import main
from opforge.errors import BuildError
from opforge.runtime.native import NativeLibrary

pytestmark = pytest.mark.skipif(shutil.which("c++") is None and shutil.which("g++") is None,
                                reason="needs a C++ compiler")

MANIFEST = """
- func: cache_ops::mul7.out(Tensor input, *, Tensor(a!) output) -> Tensor(a!)
  kernels:
    - arg_meta: null
      kernel_name: custom::mul7_out_impl
"""
SOURCE = """
#include "opforge/kernel.h"
namespace custom { namespace native {
opforge::Tensor& mul7_out_impl(opforge::KernelContext& ctx, const opforge::Tensor& input,
                               opforge::Tensor& output) {
  for (int64_t i = 0; i < input.numel(); ++i)
    output.data_ptr<float>()[i] = 7 * input.const_data_ptr<float>()[i];
  return output;
}
}}
"""
LIB = "libcache_ops.so"


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """A cache of this module's own (holding one verified entry) and the sources: each test
    copies the cache, so corrupting it never touches another module's cache."""
    folder = tmp_path_factory.mktemp("cache_integrity")
    (folder / "kernel.cpp").write_text(SOURCE)
    (folder / "cache_ops.yaml").write_text(MANIFEST)
    result = _build(folder, folder / "cache", folder / LIB)
    assert not result.cached
    return folder, result.key


@pytest.fixture
def warm(pristine, tmp_path):
    """``(cache root, entry directory)``: a private copy of the warm cache."""
    folder, key = pristine
    shutil.copytree(folder / "cache", tmp_path / "cache")
    return tmp_path / "cache", BuildCache(tmp_path / "cache").entry(key)


def _build(folder, cache, output):  # as `opforge build` does it, so that its builds hit
    return build_library(folder / "cache_ops.yaml", [folder / "kernel.cpp"], output,
                         cache_root=cache)


def _works(path) -> None:
    x = np.arange(5, dtype=np.float32)
    out = np.empty_like(x)
    NativeLibrary(path).kernel("cache_ops::mul7.out")(x, out)
    np.testing.assert_array_equal(out, 7 * x)


def _truncate(entry):
    lib = entry / LIB
    lib.write_bytes(lib.read_bytes()[: lib.stat().st_size // 2])
    return "has"


def _flip_same_size(entry):
    lib = entry / LIB
    data = bytearray(lib.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 64] = bytes(b ^ 0xFF for b in data[middle:middle + 64])
    lib.write_bytes(bytes(data))
    return "SHA-256"


def _delete_library(entry):
    (entry / LIB).unlink()
    return "missing"


def _build_json_not_json(entry):
    (entry / "build.json").write_bytes(b'{"key": "trunc')
    return "not JSON"


def _build_json_deleted(entry):
    (entry / "build.json").unlink()
    return "no build.json"


def _entry_without_hashes(entry):  # what an opforge before this change wrote
    record = json.loads((entry / "build.json").read_text())
    del record["files"], record["library_file"]
    (entry / "build.json").write_text(json.dumps(record))
    return "no file hashes"


def _project_file_edited(entry):
    cmake = entry / "project" / "CMakeLists.txt"
    cmake.write_text(cmake.read_text().replace("cache_ops", "cache_oqs", 1))
    return "CMakeLists.txt"


@pytest.mark.parametrize("corrupt", [_truncate, _flip_same_size, _delete_library,
                                     _build_json_not_json, _build_json_deleted,
                                     _entry_without_hashes, _project_file_edited],
                         ids=lambda f: f.__name__.strip("_"))
def test_a_corrupt_entry_is_evicted_and_rebuilt(pristine, warm, tmp_path, caplog, corrupt):
    folder, _ = pristine
    cache, entry = warm
    why = corrupt(entry)
    with caplog.at_level(logging.WARNING, logger="opforge.native"):
        result = _build(folder, cache, tmp_path / LIB)
    assert not result.cached
    _works(result.path)
    notes = [r.getMessage() for r in caplog.records if r.name == "opforge.native"]
    assert len(notes) == 1 and "evicted a corrupt or outdated cache entry" in notes[0]
    assert str(entry) in notes[0] and why in notes[0]
    assert not any((BuildCache(cache).root / "tmp").iterdir())  # the evicted entry is gone
    caplog.clear()
    again = _build(folder, cache, tmp_path / "again" / LIB)  # the rebuilt entry verifies
    assert again.cached and not caplog.records
    _works(again.path)


def test_an_intact_entry_is_served_without_a_note(pristine, warm, tmp_path, caplog):
    folder, _ = pristine
    cache, entry = warm
    before = {p: p.stat().st_mtime_ns for p in entry.rglob("*")}
    with caplog.at_level(logging.WARNING, logger="opforge.native"):
        result = _build(folder, cache, tmp_path / LIB)
    assert result.cached and not caplog.records
    assert {p: p.stat().st_mtime_ns for p in entry.rglob("*")} == before
    assert result.path.read_bytes() == (entry / LIB).read_bytes()


def test_the_entry_records_size_and_sha256_of_every_file(warm):
    import hashlib

    _, entry = warm
    record = json.loads((entry / "build.json").read_text())
    on_disk = sorted(p.relative_to(entry).as_posix() for p in entry.rglob("*")
                     if p.is_file() and p.name != "build.json")
    assert record["library_file"] == LIB and sorted(record["files"]) == on_disk
    for rel, want in record["files"].items():
        data = (entry / rel).read_bytes()
        assert want == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.parametrize("mask", [0o022, 0o077])
def test_copy_out_gives_a_new_library_the_default_mode(pristine, warm, tmp_path, umask, mask):
    umask(mask)
    result = _build(pristine[0], warm[0], tmp_path / LIB)
    assert result.cached and _mode(result.path) == 0o777 & ~mask


@pytest.mark.parametrize("existing", [0o644, 0o600, 0o750])
def test_copy_out_keeps_the_mode_of_an_existing_library(pristine, warm, tmp_path, umask,
                                                        existing):
    umask(0o077)
    out = tmp_path / LIB
    out.write_bytes(b"an older build")
    os.chmod(out, existing)
    result = _build(pristine[0], warm[0], out)
    assert _mode(out) == existing
    _works(result.path)


def test_copy_out_sweeps_temp_files_of_dead_writers(pristine, warm, tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    stale = tmp_path / f".{LIB}.{proc.pid}.deadbeef{TEMP_SUFFIX}"
    stale.write_bytes(b"half a library")
    _build(pristine[0], warm[0], tmp_path / LIB)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["cache", LIB])


def _cli_build(folder, output, capsys) -> tuple[int, str]:
    with pytest.raises(SystemExit) as info:
        main(["build", str(folder / "cache_ops.yaml"), "--sources", str(folder / "kernel.cpp"),
              "-o", str(output)])
    return info.value.code, capsys.readouterr().err


def test_a_full_disk_during_copy_out_is_a_clean_cli_error(pristine, warm, tmp_path, capsys,
                                                          monkeypatch):
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(warm[0]))  # a hit: no compile, only copy-out

    def full(src, dst):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "replace", full)
    out = tmp_path / "out" / LIB
    code, err = _cli_build(pristine[0], out, capsys)
    assert code == 1 and "Traceback" not in err
    assert err.startswith(f"error: BuildError: `opforge build`: output {out} — cannot write it "
                          "(No space left on device, ENOSPC)")
    assert "free disk space" in err and TEMP_SUFFIX not in err
    assert list(out.parent.iterdir()) == []  # neither the library nor a temp file


def test_a_cache_dir_under_a_regular_file_is_a_clean_cli_error(pristine, tmp_path, capsys,
                                                               monkeypatch):
    (tmp_path / "file").write_text("not a directory")
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(tmp_path / "file" / "sub"))
    code, err = _cli_build(pristine[0], tmp_path / LIB, capsys)
    assert code == 1 and "Traceback" not in err
    assert err.startswith(f"error: BuildError: `opforge build`: build cache {tmp_path}/file/sub")
    assert "(Not a directory, ENOTDIR)" in err and "OPFORGE_CACHE_DIR" in err
    assert not (tmp_path / LIB).exists()


def test_a_full_disk_while_writing_the_cache_is_a_build_error(pristine, tmp_path, monkeypatch):
    from pathlib import Path

    real = Path.write_text

    def full(self, *args, **kwargs):  # a real ENOSPC from write() names no file
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(Path, "write_text", full)
    cache = tmp_path / "fresh"
    with pytest.raises(BuildError) as info:
        _build(pristine[0], cache, tmp_path / LIB)
    message = str(info.value)
    assert message.startswith(f"`opforge build`: build cache {cache}/build — cannot write it "
                              "(No space left on device, ENOSPC)")
    assert "OPFORGE_CACHE_DIR" in message
    assert not any((cache / "build" / "tmp").iterdir()) and not (tmp_path / LIB).exists()
    monkeypatch.setattr(Path, "write_text", real)
    result = _build(pristine[0], cache, tmp_path / LIB)  # nothing half-written was cached
    assert not result.cached
    _works(result.path)


def test_an_output_under_a_regular_file_is_a_build_error(pristine, warm, tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(BuildError, match=r"output .*file/lib.so — cannot write it \(Not a "
                                         r"directory, ENOTDIR\)"):
        _build(pristine[0], warm[0], tmp_path / "file" / "lib.so")
