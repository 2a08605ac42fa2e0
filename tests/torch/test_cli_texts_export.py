"""Export texts and module lookup (issue 16, items 6 and 8).

- `export --help` described `--kernels` as "(LIB.so later)" though a library works;
- with only `--kernels lib.so`, a missing ATen op was met with "--kernels aten" instead of
  "add --kernels portable", which is what the lean runtime always has beside the library;
- `export MODULE:FACTORY` finds MODULE in the current directory (one rule for every verb).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from opforge.cli import cli
from opforge.export.kernel_sets import ExportMissingKernelError, check_kernels


def test_export_help_has_no_stale_library_text():
    result = CliRunner().invoke(cli, ["export", "--help"])
    text = " ".join(result.output.split())
    assert "later" not in text
    assert "LIB.so" in text


def test_library_alone_suggests_adding_portable():
    with pytest.raises(ExportMissingKernelError) as info:
        check_kernels({"aten::relu.out": ["forward"]}, "libmy_ops.so", frozenset(),
                      allow_missing=False)
    message = str(info.value)
    assert "portable kernel set has it: add it beside 'libmy_ops.so' (--kernels portable" \
        in message
    assert "--kernels aten" not in message


def test_op_without_portable_kernel_still_suggests_aten():
    with pytest.raises(ExportMissingKernelError) as info:
        check_kernels({"aten::no_such_thing.out": ["forward"]}, "libmy_ops.so", frozenset(),
                      allow_missing=False)
    assert "--kernels aten" in str(info.value)


def run_cli(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """The installed console script (sys.path[0] is its bin directory), no PYTHONPATH."""
    script = Path(sys.executable).parent / "opforge"
    if not script.exists():
        pytest.skip("the opforge console script is not installed")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([str(script), *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def test_export_imports_the_factory_from_the_current_directory(tmp_path):
    (tmp_path / "localmodel.py").write_text(textwrap.dedent('''
        import torch

        def make():
            return torch.nn.ReLU(), (torch.randn(3),)
    '''))
    proc = run_cli(tmp_path, "export", "localmodel:make", "-o", "m.opf", "-q")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "m.opf").is_file()
