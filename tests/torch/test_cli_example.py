"""The README's main job, as the user runs it (`opforge example`): define → build → export → run."""

import subprocess
import sys


def test_example_runs_every_stage(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "opforge", "example", "--workdir", str(tmp_path),
                           "--iterations", "5"], capture_output=True, text=True,
                          env={"COLUMNS": "200", "PATH": "/usr/bin:/bin",
                               "OPFORGE_CACHE_DIR": str(tmp_path / "cache")}, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "all stages passed" in out
    for stage in ("1. define", "2. build", "3. register", "4. export", "5. run", "6. export and run on the cpu backend", "cpu backend vs eager PyTorch", "7. profile", "8. a decoder", "same tokens as eager"):
        assert stage in out
    assert "lean runtime vs eager PyTorch" in out and "NO" not in out
    assert "opforge generate" in out  # stage 8 ran the generation runner and says how
    assert (tmp_path / "libmy_ops.so").is_file() and (tmp_path / "model.opf").is_file()
    assert "my_ops::mul3.out" in out  # the profile names the custom op's instruction
    assert "FutureWarning" not in proc.stderr
