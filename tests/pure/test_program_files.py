"""Program files on a real filesystem: save keeps modes and sweeps the temp files of killed
writers; load refuses FIFOs, directories and devices without opening them; a path that
cannot be written is a ProgramError naming it (issue 11). NumPy only."""

from __future__ import annotations

import errno
import os
import stat
import subprocess
import sys
import textwrap

import pytest

import opforge.program as P
from opforge._user_files import TEMP_SUFFIX
from opforge.errors import ProgramError
from opforge.program._sample import chain_program, sample_program


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.mark.parametrize("mask", [0o022, 0o077, 0o027, 0o002])
def test_a_new_file_gets_the_default_mode(tmp_path, umask, mask):
    umask(mask)
    P.save(sample_program(), tmp_path / "new.opf")
    assert _mode(tmp_path / "new.opf") == 0o666 & ~mask


@pytest.mark.parametrize("existing", [0o644, 0o600, 0o664, 0o444])
def test_an_existing_file_keeps_its_mode(tmp_path, umask, existing):
    umask(0o077)  # would give 0o600 to a new file: the existing mode must win
    path = tmp_path / "model.opf"
    path.write_bytes(b"old")
    os.chmod(path, existing)
    P.save(sample_program(), path)
    assert _mode(path) == existing
    assert P.load(path) == sample_program()


def test_a_stale_temp_file_of_a_dead_writer_is_swept_by_the_next_save(tmp_path):
    dead, alive = _dead_pid(), os.getppid()
    stale = tmp_path / f".model.opf.{dead}.0badc0de{TEMP_SUFFIX}"
    live = tmp_path / f".model.opf.{alive}.0badc0de{TEMP_SUFFIX}"  # a writer still running
    other = tmp_path / f".other.opf.{dead}.0badc0de{TEMP_SUFFIX}"  # another target's
    for p in (stale, live, other):
        p.write_bytes(b"half a program")
    P.save(sample_program(), tmp_path / "model.opf")
    assert not stale.exists()
    assert live.exists() and other.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [live.name, other.name, "model.opf"])


def test_a_writer_killed_mid_save_leaves_a_temp_file_that_the_next_save_removes(tmp_path):
    # The child blocks inside its write (the iterator of chunks waits for SIGKILL), so the
    # temp file exists with the child's pid when it dies: exactly what kill -9 leaves.
    target = tmp_path / "model.opf"
    script = textwrap.dedent(f"""
        import sys, time
        import opforge._user_files as U
        def chunks():
            yield b"partial"
            print("writing", flush=True)
            time.sleep(600)
        U.write_atomic(U.Path({str(target)!r}), chunks())
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "writing"
        left = [p for p in tmp_path.iterdir() if p.name.endswith(TEMP_SUFFIX)]
        assert [p.name.split(".")[3] for p in left] == [str(proc.pid)]
    finally:
        proc.kill()
        proc.wait()
    assert left[0].exists() and not target.exists()
    P.save(sample_program(), target)
    assert [p.name for p in tmp_path.iterdir()] == ["model.opf"]


def test_a_missing_directory_is_a_program_error_naming_the_path(tmp_path):
    target = tmp_path / "nodir" / "x.opf"
    with pytest.raises(ProgramError) as info:
        P.save(sample_program(), target)
    message = str(info.value)
    assert f"file {target} — cannot write it (No such file or directory, ENOENT)" in message
    assert f"mkdir -p {target.parent}" in message
    assert TEMP_SUFFIX not in message and ".tmp" not in message


def test_a_path_under_a_regular_file_is_a_program_error(tmp_path):
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(ProgramError, match=r"cannot write it \(Not a directory, ENOTDIR\)"):
        P.save(sample_program(), tmp_path / "file" / "x.opf")


def test_a_full_disk_is_a_program_error_and_leaves_no_temp_file(tmp_path, monkeypatch):
    path = tmp_path / "model.opf"
    P.save(chain_program(2), path)
    before = path.read_bytes()

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(ProgramError) as info:
        P.save(sample_program(), path)
    message = str(info.value)
    assert message.startswith(f"`opforge.program.save({str(path)!r})`: file {path}")
    assert "(No space left on device, ENOSPC)" in message and "free disk space" in message
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["model.opf"]


def _load_in_child(path) -> subprocess.CompletedProcess:
    # In a child with a timeout: a regression (open() on a FIFO) would block forever.
    code = ("import sys\nimport opforge.program as P\nfrom opforge.errors import ProgramError\n"
            "try:\n    P.load(sys.argv[1])\n"
            "except ProgramError as e:\n    print(e)\n    sys.exit(3)\n")
    return subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                          text=True, timeout=60)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_load_refuses_a_fifo_without_blocking(tmp_path):
    fifo = tmp_path / "model.opf"
    os.mkfifo(fifo)
    proc = _load_in_child(fifo)
    assert proc.returncode == 3, proc.stderr
    assert f"file — found {fifo} is a FIFO (named pipe) — valid: a regular file" in proc.stdout
    assert "from_bytes" in proc.stdout


@pytest.mark.parametrize("special,kind", [(".", "a directory"),
                                          ("/dev/null", "a character device")])
def test_load_refuses_directories_and_devices(tmp_path, special, kind):
    path = tmp_path if special == "." else special
    if not os.path.exists(path):
        pytest.skip(f"no {special}")
    with pytest.raises(ProgramError, match=f"found {path} is {kind}"):
        P.load(path)


def test_a_symlink_to_a_program_still_loads(tmp_path):
    P.save(sample_program(), tmp_path / "real.opf")
    (tmp_path / "link.opf").symlink_to(tmp_path / "real.opf")
    assert P.load(tmp_path / "link.opf") == sample_program()


def test_an_unreadable_file_names_the_errno(tmp_path):
    path = tmp_path / "model.opf"
    P.save(sample_program(), path)
    os.chmod(path, 0)
    try:
        if os.access(path, os.R_OK):
            pytest.skip("running as root: permissions are not enforced")
        with pytest.raises(ProgramError, match=r"cannot read it \(Permission denied, EACCES\)"):
            P.load(path)
    finally:
        os.chmod(path, 0o644)
