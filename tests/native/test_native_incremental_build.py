"""Incremental builds: after one of several sources changes, only it is recompiled, and the
library is right. Needs a C++ compiler; no torch.

The evidence is the build report (``BuildResult.compiled``, from the object files Ninja
rewrote) and the object files in the library's work area themselves, never timings.
"""

import os
import shutil

import numpy as np
import pytest

from opforge.native import build_library
from opforge.native.cache import IN_PROGRESS
from opforge.examples.my_ops import manifest_path
from opforge.runtime.native import NativeLibrary

pytestmark = pytest.mark.skipif(shutil.which("c++") is None and shutil.which("g++") is None,
                                reason="needs a C++ compiler")

KERNELS = manifest_path().parent / "kernels"
GLUE = "opforge_register.cpp"


@pytest.fixture
def sources(tmp_path):
    """Copies of the example's three kernel sources, to edit."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("minmax.cpp", "mul.cpp", "scaled_sum.cpp"):
        shutil.copy(KERNELS / name, src / name)
    return [src / "minmax.cpp", src / "mul.cpp", src / "scaled_sum.cpp"]


def _build(sources, tmp_path, **options):
    # a new output directory each time: dlopen would hand back an already loaded path
    # (the work area is per library file name, so the builds still share it)
    out = tmp_path / f"out{len(list(tmp_path.glob('out*')))}" / "libmy_ops.so"
    return build_library(manifest_path(), sources, out, cache_root=tmp_path / "cache", **options)


def _objects(tmp_path):
    """{object file name: (mtime_ns, inode)} of the library's (one) work area."""
    (area,) = (tmp_path / "cache" / "build" / "work").iterdir()
    return {p.name: (p.stat().st_mtime_ns, p.stat().st_ino) for p in area.rglob("*.o")}


def _set_mul3_factor(mul, factor, suffix=""):
    text = mul.read_text()
    edited = text.replace('"my_ops::mul3.out", input, output, 3)',
                          f'"my_ops::mul3.out", input, output, {factor}){suffix}')
    assert edited != text
    mul.write_text(edited)


def _mul3(result):
    x, out = np.arange(4, dtype=np.float32), np.empty(4, np.float32)
    NativeLibrary(result.path).kernel("my_ops::mul3.out")(x, out)
    return (out / np.maximum(x, 1)).tolist()[1:]


def test_only_the_changed_source_is_recompiled(sources, tmp_path):
    cold = _build(sources, tmp_path)
    assert set(cold.compiled) == {*map(str, sources), GLUE}
    assert _mul3(cold) == [3.0, 3.0, 3.0]
    before = _objects(tmp_path)

    mul = sources[1]
    _set_mul3_factor(mul, 5)
    warm = _build(sources, tmp_path)
    assert not warm.cached and warm.key != cold.key
    assert warm.compiled == (str(mul),)
    after = _objects(tmp_path)
    assert after["mul.cpp.o"] != before["mul.cpp.o"]
    for name in ("minmax.cpp.o", "scaled_sum.cpp.o", "opforge_register.cpp.o"):
        assert after[name] == before[name], name  # reused, not rewritten
    assert _mul3(warm) == [5.0, 5.0, 5.0]  # the new object was linked
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    lo, hi = np.empty(3, np.float32), np.empty(3, np.float32)
    NativeLibrary(warm.path).kernel("my_ops::minmax.out")(x, 1, lo, hi)  # the reused ones work
    np.testing.assert_array_equal(lo, x.min(1))
    np.testing.assert_array_equal(hi, x.max(1))


def test_a_changed_source_with_an_older_mtime_is_still_recompiled(sources, tmp_path):
    # Ninja compares mtimes only; opforge compares the bytes each object was compiled from
    _build(sources, tmp_path)
    mul = sources[1]
    _set_mul3_factor(mul, 7)
    os.utime(mul, ns=(1_000_000_000, 1_000_000_000))  # 1970: older than every object
    result = _build(sources, tmp_path)
    assert result.compiled == (str(mul),)
    assert _mul3(result) == [7.0, 7.0, 7.0]


def test_a_manifest_change_recompiles_the_glue_and_the_kernels(sources, tmp_path):
    _build(sources, tmp_path)
    result = _build(sources, tmp_path, ops=["my_ops::mul3"])
    # the glue and the force-included declarations change with the selection
    assert GLUE in result.compiled and result.ops == ["my_ops::mul3.out"]
    assert _mul3(result) == [3.0, 3.0, 3.0]


def test_a_build_killed_mid_way_leaves_a_work_area_that_starts_over(sources, tmp_path):
    _build(sources, tmp_path)
    (area,) = (tmp_path / "cache" / "build" / "work").iterdir()
    for obj in area.rglob("*.o"):  # as if killed while the compiler was writing them
        obj.write_bytes(b"\0garbage")
    (area / IN_PROGRESS).touch()
    mul = sources[1]
    mul.write_text(mul.read_text() + "\n// edited\n")
    result = _build(sources, tmp_path)
    assert set(result.compiled) == {*map(str, sources), GLUE}  # cold again, not the garbage
    assert not (area / IN_PROGRESS).exists()
    assert _mul3(result) == [3.0, 3.0, 3.0]


def test_a_compile_error_keeps_the_other_objects(sources, tmp_path):
    from opforge.errors import BuildError

    _build(sources, tmp_path)
    mul = sources[1]
    good = mul.read_text()
    _set_mul3_factor(mul, 3, suffix=" +")
    with pytest.raises(BuildError, match="mul.cpp"):
        _build(sources, tmp_path)
    mul.write_text(good)
    _set_mul3_factor(mul, 6)
    result = _build(sources, tmp_path)
    assert result.compiled == (str(mul),)
    assert _mul3(result) == [6.0, 6.0, 6.0]


def test_other_flags_never_reuse_objects_built_with_the_old_ones(sources, tmp_path):
    # CMake keeps a configured cache variable when the CMakeLists changes: a shared work
    # area would relink the old objects under the new flags' key
    _build(sources, tmp_path)
    result = _build(sources, tmp_path, extra_flags=("-DOPFORGE_TEST_FLAG=1",))
    assert set(result.compiled) == {*map(str, sources), GLUE}
    commands = {p.read_text() for p in (tmp_path / "cache" / "build" / "work").glob("*/build/build.ninja")}
    assert len(commands) == 2 and sum("-DOPFORGE_TEST_FLAG=1" in c for c in commands) == 1


def test_generated_files_that_look_older_than_their_objects_still_recompile(sources, tmp_path,
                                                                          monkeypatch):
    # A generated file rewritten within the filesystem's timestamp granularity of its
    # object's compile looks no newer than it: Ninja alone would keep the stale object.
    # Simulated by dating every rewritten file to 1970.
    from opforge.native import incremental

    _build(sources, tmp_path)
    sync = incremental.sync_project

    def sync_then_backdate(project_dir, build_dir, files):
        changed = sync(project_dir, build_dir, files)
        for rel in changed:
            os.utime(project_dir / rel, ns=(1_000_000_000, 1_000_000_000))
        return changed

    monkeypatch.setattr(incremental, "sync_project", sync_then_backdate)
    result = _build(sources, tmp_path, ops=["my_ops::mul3"])
    assert set(result.compiled) == {*map(str, sources), GLUE}  # a header changed: all
    assert result.ops == ["my_ops::mul3.out"]
    assert NativeLibrary(result.path).keys() == ["my_ops::mul3.out"]
    assert _mul3(result) == [3.0, 3.0, 3.0]
