"""`opforge bundle`: the folder builds with CMake alone, the app runs without Python, holds
only the kernels its program calls, and gives the lean runtime's outputs."""

from __future__ import annotations

import os
import shutil
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

    # moved (as to a device): the folder it was built in is gone, OPFORGE_BUNDLE_DIR says
    # where the program is now; without it the load fails naming the old path
    moved = shutil.move(str(written.path), str(tmp_path / "moved"))
    (tmp_path / "output_0.bin").unlink()
    app = Path(moved) / "build" / "opforge_app"
    lost = subprocess.run([str(app), str(tmp_path / "x.bin"), str(tmp_path / "w.bin")],
                          cwd=tmp_path, capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert lost.returncode != 0 and str(written.path / written.programs[0]) in lost.stderr
    run = subprocess.run([str(app), str(tmp_path / "x.bin"), str(tmp_path / "w.bin")],
                         cwd=tmp_path, capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin", "OPFORGE_BUNDLE_DIR": moved})
    assert run.returncode == 0, run.stderr[-3000:]
    np.testing.assert_array_equal(np.fromfile(tmp_path / "output_0.bin", np.float32).reshape(2, 8), want)


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


# --- programs with cpu delegates: the bundle carries the engine and oneDNN -----------------------

class _ConvLinear:
    """A small conv → relu → linear model, for the cpu backend."""

    @staticmethod
    def program():
        import torch

        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
                self.fc = torch.nn.Linear(8 * 6 * 6, 10)

            def forward(self, x):
                return self.fc(torch.relu(self.conv(x)).flatten(1))

        from opforge.export import export

        torch.manual_seed(0)
        x = torch.randn(2, 3, 6, 6)
        return export(Net().eval(), (x,), kernels="portable", backends=["cpu"]), x.numpy()


def _loaded_files(stderr: str) -> list[str]:
    """The path of each library LD_DEBUG=files reports initialising (every C++ library
    has initialisers: libdnnl, the engine, libstdc++, a libpython would)."""
    return [line.split("calling init:", 1)[1].strip() for line in stderr.splitlines()
            if "calling init:" in line]


@pytest.mark.slow  # CMake builds the runtime with its cpu backend (~1 min on 2 busy cores)
def test_a_delegated_program_bundles_with_the_engine_and_onednn(tmp_path, portable_keys):
    from opforge.backends import get_backend

    if get_backend("cpu").unavailable() is not None:
        pytest.skip("the cpu backend's engine cannot run here")
    program, x = _ConvLinear.program()
    assert program.delegates and all(d.id == "cpu" for d in program.delegates)
    save(program, tmp_path / "net.opf")
    written = bundle([tmp_path / "net.opf"], tmp_path / "app", portable_keys=portable_keys)
    assert written.cpu is not None
    lib = written.path / "lib"
    assert (written.path / written.cpu.engine).is_file() and (lib / "libdnnl.so.3").is_file()
    assert (lib / "onednn" / "LICENSE").is_file()
    app = _cmake_build(written.path)

    x.tofile(tmp_path / "x.bin")
    run = subprocess.run([str(app), str(tmp_path / "x.bin")], cwd=tmp_path, capture_output=True,
                         text=True, env={"LD_DEBUG": "files", "PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr[-3000:]
    files = _loaded_files(run.stderr)
    assert files and not [f for f in files if "python" in f.lower() or "/.venv/" in f], files
    onednn = [f for f in files if "libdnnl" in f]
    engine = [f for f in files if "libopforge_cpu" in f]
    assert onednn == [str(lib / "libdnnl.so.3")], files  # from the bundle, once
    assert engine == [str(written.path / written.cpu.engine)], files
    got = np.fromfile(tmp_path / "output_0.bin", np.float32).reshape(2, 10)
    (want,) = load(program).method("forward")(x)  # the Python cpu backend: the same engine
    assert got.tobytes() == np.ascontiguousarray(want).tobytes()


def test_bundle_refuses_delegates_it_cannot_carry(tmp_path, portable_keys):
    from dataclasses import replace

    program, _ = _ConvLinear.program()
    other = replace(program, delegates=tuple(replace(d, id="xnnpack") for d in program.delegates))
    save(other, tmp_path / "x.opf")
    with pytest.raises(BuildError, match=r"backend\(s\) xnnpack — valid: cpu delegates"):
        bundle([tmp_path / "x.opf"], tmp_path / "app", portable_keys=portable_keys)
    assert not (tmp_path / "app").exists()
