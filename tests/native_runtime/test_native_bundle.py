"""`opforge bundle`: the folder builds with CMake alone, the app runs without Python, holds
only the kernels its program calls, and gives the lean runtime's outputs."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from opforge.errors import BuildError
from opforge.native.toolchain import find_toolchain
from opforge.native_runtime.bundle import bundle, family_rows
from opforge.native_runtime.build import source_dir
from opforge.program import (
    ArenaStorage, KernelCall, MemoryPlan, Method, Operator, Program, ScalarType, TensorValue,
    IntValue, save,
)
from opforge.runtime import load
from opforge.runtime.native import NativeLibrary

F32 = ScalarType.FLOAT32


def _chain_program() -> Program:
    """y = relu(x * w + x): three portable kernels, no delegate."""
    x = TensorValue(F32, (2, 8), storage=ArenaStorage(0, 0))
    w = TensorValue(F32, (2, 8), storage=ArenaStorage(0, 64))
    t = TensorValue(F32, (2, 8), storage=ArenaStorage(0, 128))
    u = TensorValue(F32, (2, 8), storage=ArenaStorage(0, 192))
    y = TensorValue(F32, (2, 8), storage=ArenaStorage(0, 256))
    one = IntValue(1)
    values = (x, w, t, u, y, one)
    ops = (Operator("aten::mul", "out"), Operator("aten::add", "out"), Operator("aten::relu", "out"))
    code = (KernelCall(0, (0, 1, 2)), KernelCall(1, (2, 0, 5, 3)), KernelCall(2, (3, 4)))
    return Program(methods=(Method("forward", values, (0, 1), (4,), code, ops, MemoryPlan((320,))),))


@pytest.fixture(scope="module")
def portable_keys(native_runtime) -> set[str]:
    return set(NativeLibrary(native_runtime.portable_library).keys())


def _needs(keys: set[str], *wanted: str) -> None:
    missing = [k for k in wanted if k not in keys]
    if missing:
        pytest.skip(f"portable kernels not written yet: {missing}")


def _cmake_build(folder: Path) -> Path:
    """Configure and build with the cmake binary itself and no Python on PATH."""
    tools = find_toolchain()
    env = {"PATH": f"{Path(tools.ninja).parent}:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp")}
    for step in ([tools.cmake, "-S", str(folder), "-B", str(folder / "build"), "-G", "Ninja",
                  f"-DCMAKE_MAKE_PROGRAM={tools.ninja}", f"-DCMAKE_CXX_COMPILER={tools.cxx}",
                  "-DCMAKE_BUILD_TYPE=Release"],
                 [tools.cmake, "--build", str(folder / "build")]):
        done = subprocess.run(step, env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert "python" not in Path(step[0]).name.lower()
    return folder / "build" / "opforge_app"


def test_every_kernel_row_is_found_by_the_bundler(portable_keys):
    found = {key for f in (source_dir() / "kernels" / "ops").glob("*.cpp") for _, key in family_rows(f)}
    assert found == portable_keys


def test_bundle_builds_alone_runs_without_python_and_matches_lean(tmp_path, portable_keys):
    _needs(portable_keys, "aten::mul.out", "aten::add.out", "aten::relu.out")
    program = _chain_program()
    save(program, tmp_path / "chain.opf")
    written = bundle([tmp_path / "chain.opf"], tmp_path / "app", portable_keys=portable_keys)
    assert written.selected == ("aten::add.out", "aten::mul.out", "aten::relu.out")
    app = _cmake_build(written.path)

    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 8)).astype(np.float32)
    w = rng.standard_normal((2, 8)).astype(np.float32)
    x.tofile(tmp_path / "x.bin")
    w.tofile(tmp_path / "w.bin")
    run = subprocess.run([str(app), str(tmp_path / "x.bin"), str(tmp_path / "w.bin")],
                         cwd=tmp_path, capture_output=True, text=True,
                         env={"LD_DEBUG": "files", "PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr[-3000:]
    loaded = [line for line in run.stderr.splitlines() if "file=" in line]
    assert loaded and not [line for line in loaded if "python" in line.lower()]
    got = np.fromfile(tmp_path / "output_0.bin", np.float32).reshape(2, 8)
    (want,) = load(program).method("forward")(x, w)
    np.testing.assert_array_equal(got, want)  # the same float32 ops in the same order

    # selective: the registry strings of kernels nobody calls are not in the app
    text = app.read_bytes()
    assert b"aten::relu.out" in text
    assert b"aten::convolution.out" not in text and b"aten::addmm.out" not in text


def test_bundle_refuses_missing_kernels_all_at_once(tmp_path, portable_keys):
    x = TensorValue(F32, (4,), storage=ArenaStorage(0, 0))
    y = TensorValue(F32, (4,), storage=ArenaStorage(0, 64))
    ops = (Operator("my_ops::frob", "out"), Operator("my_ops::blur", "out"))
    code = (KernelCall(0, (0, 1)), KernelCall(1, (1, 0)))
    program = Program(methods=(Method("forward", (x, y), (0,), (1,), code, ops, MemoryPlan((128,))),))
    save(program, tmp_path / "p.opf")
    with pytest.raises(BuildError, match=r"2 operator\(s\) without a kernel — my_ops::blur.out; my_ops::frob.out"):
        bundle([tmp_path / "p.opf"], tmp_path / "app", portable_keys=portable_keys)
    assert not (tmp_path / "app").exists()


def test_bundle_refuses_a_non_empty_folder(tmp_path, portable_keys):
    save(_chain_program(), tmp_path / "chain.opf")
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "keep.txt").write_text("mine")
    with pytest.raises(BuildError, match="not empty"):
        bundle([tmp_path / "chain.opf"], tmp_path / "app", portable_keys=portable_keys)
    assert (tmp_path / "app" / "keep.txt").read_text() == "mine"
