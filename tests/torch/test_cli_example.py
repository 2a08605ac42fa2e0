"""The README's main job, as the user runs it (`opforge example`)."""

import subprocess
import sys


def test_example_runs_every_stage():
    proc = subprocess.run([sys.executable, "-m", "opforge", "example"], capture_output=True,
                          text=True, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"}, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "all stages passed" in proc.stdout
    assert "my_ops::mul3.out(x, output=out)" in proc.stdout
