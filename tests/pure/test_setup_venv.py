"""scripts/setup-venv.sh installs only when an install input changed (issue 43, item 7):
scripts/test.sh used to reinstall and recompile the engine (1.5-3 min) before every run.

The script runs in a scratch copy of the repository's install inputs, with a stand-in
`python3` on PATH that records what it is asked to do and makes a stand-in `.venv`: no
real install happens, so this needs nothing but bash and coreutils."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("bash") is None or shutil.which("sha256sum") is None,
                                reason="needs bash and sha256sum")

# Appends its arguments to $LOG; `-m venv DIR` makes DIR/bin/python (this same stand-in).
FAKE_PYTHON = """#!/usr/bin/env bash
echo "$*" >> "$LOG"
if [[ "$1" == "--version" ]]; then echo "Python 3.11.0"; fi
if [[ "$1" == "-m" && "$2" == "venv" ]]; then
    mkdir -p "$3/bin" && cp "$0" "$3/bin/python" && chmod +x "$3/bin/python"
fi
if [[ -n "${FAIL_PIP:-}" && "$*" == *"install --quiet -e"* ]]; then exit 1; fi
exit 0
"""


@pytest.fixture
def checkout(tmp_path):
    repo = tmp_path / "repo"
    for name in ("pyproject.toml", "setup.py", "scripts/setup-venv.sh",
                 "opforge/backends/cpu/native/core.cpp", "opforge/backends/cpu/engine_build.py"):
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, repo / name)
    (repo / "opforge" / "__init__.py").write_text("")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(FAKE_PYTHON)
    (bin_dir / "python3").chmod(0o755)
    log = tmp_path / "log"
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "LOG": str(log)}
    env.pop("OPFORGE_REINSTALL", None)

    def setup(**extra) -> tuple[bool, subprocess.CompletedProcess]:
        """Run the script; True when it installed (asked pip to install opforge)."""
        log.write_text("")
        proc = subprocess.run(["bash", str(repo / "scripts" / "setup-venv.sh")],
                              env={**env, **extra}, capture_output=True, text=True, timeout=60)
        return "install --quiet -e .[torch,test,cpu,quantize]" in log.read_text(), proc

    return repo, setup


def test_a_fresh_checkout_installs_and_an_unchanged_one_does_not(checkout):
    repo, setup = checkout
    installed, proc = setup()
    assert proc.returncode == 0 and installed, proc.stderr
    assert (repo / ".venv" / ".opforge-install-stamp").is_file()
    installed, proc = setup()
    assert proc.returncode == 0 and not installed, "reinstalled with nothing changed"
    assert "up to date" in proc.stderr
    (repo / "opforge" / "__init__.py").write_text("# python sources: the install is editable\n")
    assert setup()[0] is False


@pytest.mark.parametrize("changed", ["pyproject.toml", "setup.py",
                                     "opforge/backends/cpu/native/core.cpp",
                                     "opforge/backends/cpu/native/new_kernel.cpp"])
def test_a_changed_install_input_reinstalls(checkout, changed):
    repo, setup = checkout
    assert setup()[0]
    with open(repo / changed, "a") as f:
        f.write("\n// changed\n" if changed.endswith(".cpp") else "\n# changed\n")
    assert setup()[0], f"{changed} changed and the script did not reinstall"
    assert setup()[0] is False


def test_a_failed_install_leaves_no_stamp_and_reinstall_can_be_forced(checkout):
    repo, setup = checkout
    installed, proc = setup(FAIL_PIP="1")
    assert installed and proc.returncode != 0
    assert not (repo / ".venv" / ".opforge-install-stamp").exists()
    assert setup()[0]  # the next run installs again
    assert setup(OPFORGE_REINSTALL="1")[0]


def test_the_readme_says_how_long_the_tests_take_and_when_setup_installs():
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert re.search(r"The tests then take about \d+ minutes on 2 otherwise idle cores", readme)
    assert "later runs skip the install while no install input changed" in readme
    assert "OPFORGE_REINSTALL=1" in readme
