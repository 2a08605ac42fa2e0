"""A cpu-delegated program whose file is truncated in place after load (what ``cp new.opf
old.opf`` over a served file does): the engine reads a named constant through the mapping
on every call, and that read was SIGBUS (on the native call path, which runs no fstat
check); now the SIGBUS guard stops it and the call raises a ProgramError naming the file
(opforge/program/file_guard.py). In a child process: a regression would kill it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from opforge.backends.cpu import engine as cpu_engine
from opforge.backends.cpu import fastcall
from opforge.export import export
from opforge.program import file_guard, save

pytestmark = pytest.mark.skipif(cpu_engine.missing() is not None,
                                reason=f"cpu backend: {cpu_engine.missing()}")


class Scale(torch.nn.Module):  # x * w: the engine reads w (512 KiB, named data) in place per call
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(256, 512), requires_grad=False)

    def forward(self, x):
        return torch.relu(x * self.w)


_CHILD = textwrap.dedent("""
    import os, sys
    import numpy as np
    from opforge.program import file_guard
    from opforge.runtime import load
    file_guard.FSTAT_EVERY_NS = 1 << 62  # the read itself must be stopped, not an fstat
    path = sys.argv[1]
    forward = load(path).method("forward")
    assert (forward._native is not None) == (sys.argv[2] == "native")
    forward._file._checked = 1 << 61
    x = np.ones((256, 512), np.float32)
    forward(x)
    os.truncate(path, 4096)
    for _ in range(2):
        try:
            forward(x)
            print("ran")
        except Exception as e:
            print(type(e).__name__, e)
""")


@pytest.mark.parametrize("path", ["native", "ctypes"])
def test_a_truncated_file_under_a_cpu_delegate_is_a_program_error(tmp_path, path):
    if path == "native" and fastcall.module() is None:
        pytest.skip(f"no extension: {fastcall.problem()}")
    if file_guard.problem() is not None:
        pytest.skip(f"no guard: {file_guard.problem()}")
    torch.manual_seed(0)
    program = tmp_path / "served.opf"
    save(export(Scale().eval(), (torch.randn(256, 512),), backends=["cpu"]), program)
    done = subprocess.run([sys.executable, "-c", _CHILD, str(program), path],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OPFORGE_CPU_FASTCALL": "1" if path == "native" else "0"})
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])  # was -7 (SIGBUS)
    lines = done.stdout.splitlines()
    assert len(lines) == 2, done.stdout
    for line in lines:
        assert line.startswith("ProgramError "), line
        assert f"program file {program} — truncated in place" in line
        assert "load the program again" in line and "rename it over the old one" in line
