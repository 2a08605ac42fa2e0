"""``engine_build.run_compiler``: one compile-and-link call (the engine's, compile_shared's)
run as side-by-side ``-c`` compiles and a link. The library must be the one call's: every
unit compiled with the call's flags (a define given once reaches each), the objects linked
with its libraries; a failing unit's errors come back; the objects' folder goes."""

from __future__ import annotations

import ctypes
import shutil

import pytest

from opforge.backends.cpu import engine_build

pytestmark = pytest.mark.skipif(shutil.which("c++") is None and shutil.which("g++") is None,
                                reason="no C++ compiler")


def _cxx() -> str:
    return shutil.which("c++") or shutil.which("g++")


def _sources(tmp_path, n=3):
    paths = []
    for i in range(n):
        path = tmp_path / f"unit{i}.cpp"
        # FACTOR comes from the call's -D: a unit compiled without the call's flags fails
        path.write_text(f'#include <cmath>\nextern "C" double f{i}(double x) '
                        f'{{ return std::sqrt(x) * FACTOR + {i}; }}\n')
        paths.append(str(path))
    return paths


def test_units_compiled_side_by_side_link_into_the_one_calls_library(tmp_path, monkeypatch):
    monkeypatch.setenv("OPFORGE_BUILD_JOBS", "3")
    out = tmp_path / "libunits.so"
    call = [_cxx(), "-shared", "-fPIC", "-O2", "-DFACTOR=3", "-o", str(out), *_sources(tmp_path), "-lm"]
    proc = engine_build.run_compiler(call)
    assert proc.returncode == 0, proc.stdout
    lib = ctypes.CDLL(str(out))
    for i in range(3):
        fn = getattr(lib, f"f{i}")
        fn.restype, fn.argtypes = ctypes.c_double, [ctypes.c_double]
        assert fn(16.0) == 4 * 3 + i
    assert sorted(p.name for p in tmp_path.iterdir()) == ["libunits.so", "unit0.cpp", "unit1.cpp",
                                                          "unit2.cpp"]  # no objects left


def test_a_failing_unit_returns_its_errors_and_writes_no_library(tmp_path):
    sources = _sources(tmp_path)
    (tmp_path / "unit1.cpp").write_text('extern "C" int g() { return undeclared_name; }\n')
    out = tmp_path / "libunits.so"
    proc = engine_build.run_compiler([_cxx(), "-shared", "-fPIC", "-DFACTOR=3", "-o", str(out), *sources])
    assert proc.returncode != 0 and "undeclared_name" in proc.stdout and "unit1.cpp" in proc.stdout
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".objects.")]


def test_build_jobs_reads_its_switch(monkeypatch):
    monkeypatch.setenv("OPFORGE_BUILD_JOBS", "5")
    assert engine_build.build_jobs() == 5
    monkeypatch.delenv("OPFORGE_BUILD_JOBS")
    assert 1 <= engine_build.build_jobs() <= 8
    monkeypatch.setenv("OPFORGE_BUILD_JOBS", "many")
    with pytest.raises(engine_build.EngineBuildError, match="OPFORGE_BUILD_JOBS"):
        engine_build.build_jobs()
