"""opforge-run and opforge-generate as installed commands: the console scripts pip writes
(opforge.native_runtime.launcher) exec the C++ tools, and `opforge native-tools
--install-dir` leaves a folder that runs with an empty environment (no Python, no paths).
Outputs are compared bit for bit with the lean runtime: the same add kernel math runs."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from opforge.cli import cli
from opforge.native_runtime import launcher
from opforge.program import save
from opforge.runtime import load
from tests.native_runtime._native_programs import add_program


def _add_case(tmp_path: Path):
    save(add_program((3, 5), alpha=2), tmp_path / "add.opf")
    rng = np.random.default_rng(0)
    x, y = (rng.standard_normal((3, 5)).astype(np.float32) for _ in range(2))
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    (expected,) = load(add_program((3, 5), alpha=2)).method("forward")(x, y)
    args = [str(tmp_path / "add.opf"), "--input", str(tmp_path / "x.npy"), "--input",
            str(tmp_path / "y.npy"), "--output-dir", str(tmp_path / "out")]
    return args, expected


def _check_output(tmp_path: Path, expected: np.ndarray) -> None:
    got = np.load(tmp_path / "out" / "output_0.npy")
    assert got.dtype == expected.dtype and got.tobytes() == expected.tobytes()


def test_the_console_scripts_are_declared_and_exec_the_built_tools(monkeypatch, native_runtime):
    scripts = {e.name: e for e in entry_points(group="console_scripts") if e.name.startswith("opforge-")}
    assert scripts["opforge-run"].load() is launcher.run_main
    assert scripts["opforge-generate"].load() is launcher.generate_main
    calls = []
    monkeypatch.setattr(os, "execve", lambda path, argv, env: calls.append((path, argv, env)))
    monkeypatch.setattr(sys, "argv", ["/somewhere/bin/opforge-generate", "p.opf", "--tokens", "1,2"])
    launcher.generate_main()
    # the process becomes the tool: same arguments, argv[0] the tool's name
    (path, argv, env), = calls
    # build_runtime()'s tool (compared by cache folder: in a tree being edited the sources'
    # hash, and with it the build's own folder, may move between two calls)
    assert Path(path).name == "opforge-generate" and Path(path).is_file()
    assert Path(path).parent.parent == native_runtime.path.parent
    assert argv == ["opforge-generate", "p.opf", "--tokens", "1,2"]
    assert env.get("OPFORGE_CPU_ENGINE") or "OPFORGE_CPU_ENGINE" not in os.environ


def test_the_installed_opforge_run_script_runs_a_program(tmp_path, native_runtime):
    script = Path(sys.executable).parent / "opforge-run"
    if not script.exists():
        pytest.skip(f"{script} is not installed: run scripts/setup-venv.sh (pip install -e .)")
    help_text = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=120)
    assert help_text.returncode == 0 and help_text.stdout.startswith("usage: opforge-run PROGRAM.opf")
    args, expected = _add_case(tmp_path)
    result = subprocess.run([str(script), *args], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    _check_output(tmp_path, expected)


def test_an_installed_folder_runs_with_an_empty_environment(tmp_path, native_runtime):
    out = CliRunner().invoke(cli, ["native-tools", "--install-dir", str(tmp_path / "opt")])
    assert out.exit_code == 0, out.output
    root = tmp_path / "opt"
    for name in ("bin/opforge-run", "bin/opforge-generate", "lib/libopforge_runtime.so",
                 "lib/libopforge_runtime.a", "lib/libopforge_portable.so",
                 "include/opforge/runtime.h", "include/opforge/kernel_abi.h"):
        assert (root / name).is_file(), name
    assert os.access(root / "bin/opforge-run", os.X_OK)
    args, expected = _add_case(tmp_path)
    # env={}: no PATH, no LD_LIBRARY_PATH, no PYTHONPATH; the tools link the runtime statically
    result = subprocess.run([str(root / "bin/opforge-run"), *args], capture_output=True, text=True,
                            timeout=120, env={})
    assert result.returncode == 0, result.stdout + result.stderr
    _check_output(tmp_path, expected)
    needed = subprocess.run(["readelf", "-d", str(root / "bin/opforge-run")], capture_output=True, text=True)
    if needed.returncode == 0:
        assert "libpython" not in needed.stdout and "libopforge" not in needed.stdout


def test_native_tools_without_a_folder_names_the_built_tools(native_runtime):
    out = CliRunner().invoke(cli, ["native-tools"])
    assert out.exit_code == 0, out.output
    line = next(x for x in out.output.splitlines() if x.startswith("opforge-run: "))
    tool = Path(line.split(": ", 1)[1])
    assert tool.name == "opforge-run" and tool.is_file() and tool.parent.parent == native_runtime.path.parent
