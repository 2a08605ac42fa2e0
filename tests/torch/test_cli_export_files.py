"""`opforge export -o PATH` where PATH cannot be written (a missing directory, a full disk),
and over an existing file: a clean ProgramError naming PATH, exit status 1, no traceback,
no temp file left, the old file and its mode kept (issue 11)."""

from __future__ import annotations

import errno
import os
import stat
import subprocess
import sys

import pytest

from opforge.cli import main
from opforge.program import load

FACTORY = "opforge.examples.zoo:mlp"


def _export(output, capsys) -> tuple[int, str]:
    try:
        main(["export", FACTORY, "-o", str(output), "-q"])
    except SystemExit as exit_:
        return exit_.code, capsys.readouterr().err
    return 0, capsys.readouterr().err


def test_an_output_in_a_missing_directory_is_a_clean_error(tmp_path, capsys):
    out = tmp_path / "nodir" / "x.opf"
    code, err = _export(out, capsys)
    assert code == 1 and "Traceback" not in err
    assert err.startswith(f"error: ProgramError: `opforge.program.save({str(out)!r})`: file "
                          f"{out} — cannot write it (No such file or directory, ENOENT)")
    assert f"mkdir -p {out.parent}" in err
    assert "opforge-tmp" not in err and not (tmp_path / "nodir").exists()


def test_a_full_disk_is_a_clean_error_and_keeps_the_old_file(tmp_path, capsys, monkeypatch):
    out = tmp_path / "x.opf"
    out.write_bytes(b"the previous program")

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    code, err = _export(out, capsys)
    assert code == 1 and "Traceback" not in err
    assert f"file {out} — cannot write it (No space left on device, ENOSPC)" in err
    assert "free disk space" in err
    assert out.read_bytes() == b"the previous program"
    assert [p.name for p in tmp_path.iterdir()] == ["x.opf"]


def test_export_over_an_existing_file_keeps_its_mode(tmp_path, capsys):
    out = tmp_path / "x.opf"
    out.write_bytes(b"old")
    os.chmod(out, 0o644)
    old = os.umask(0o077)  # a new file would be 0600: the existing mode must win
    try:
        code, err = _export(out, capsys)
    finally:
        os.umask(old)
    assert code == 0, err
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o644
    assert load(out).methods[0].name == "forward"


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_as_the_factory_file_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "models.py"
    os.mkfifo(fifo)
    proc = subprocess.run([sys.executable, "-m", "opforge", "export", f"{fifo}:make", "-o",
                           str(tmp_path / "x.opf")], capture_output=True, text=True,
                          timeout=300)  # a regression would block on the FIFO forever
    err = " ".join(proc.stderr.split())
    assert proc.returncode == 1 and "Traceback" not in err
    assert f"factory file {str(fifo)!r} — is a FIFO (named pipe)" in err
