"""A program file changed on disk after load (opforge/program/file_guard.py): truncated in
place under a running program (what ``cp new.opf old.opf`` over a served file does), a read
of its constants was SIGBUS; now it is a ProgramError naming the file and the fix, from the
SIGBUS guard (a C++ handler, compiled on first use: these tests need a compiler) or from the
fstat check before a call. Crash cases run in a child process."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from opforge.errors import ProgramError
from opforge.program import _sample, file_guard, save
from opforge.runtime import load

N = 1024  # N mul.out calls over N constants of 256 bytes (a 256 KiB segment at the file's end)


def _write(path, n=N, value=1.0):
    """forward(x) = x * c_1 * ... * c_n, every constant ``value``."""
    import dataclasses

    from opforge.program import Operator, Segment

    program = _sample.chain_program(n)
    method = dataclasses.replace(program.methods[0], operators=(Operator("aten::mul", "out"),))
    weights = Segment(np.full(64 * n, value, np.float32))
    save(dataclasses.replace(program, methods=(method,), segments=(weights,)), path)
    return path


def _child(code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *map(str, args)],
                          capture_output=True, text=True, timeout=120)


def test_the_guard_is_in_use_here():
    assert file_guard.problem() is None, file_guard.problem()


# the call after the truncation reads the constants past the new end: the fstat check is put
# off (FSTAT_EVERY_NS), so the read itself faults and the guard must catch it
_TRUNCATED_UNDER_A_CALL = """
    import sys
    import numpy as np
    from opforge.program import file_guard
    from opforge.runtime import load
    file_guard.FSTAT_EVERY_NS = 1 << 62
    path, other = sys.argv[1], sys.argv[2]
    forward = load(path).method("forward")
    untouched = load(other).method("forward")
    x = np.ones(64, np.float32)
    assert forward(x)[0][0] == 1.0
    forward._file._checked = 1 << 61  # no fstat for this call (the one at method() ran)
    with open(path, "r+b") as f:
        f.truncate(4096)
    for attempt in range(2):
        try:
            forward(x)
            print("ran")
        except Exception as e:
            print(type(e).__name__, e)
    print("other", untouched(x)[0][0])
"""


def test_a_file_truncated_under_a_running_program_is_a_program_error_not_sigbus(tmp_path):
    path, other = _write(tmp_path / "served.opf"), _write(tmp_path / "other.opf")
    done = _child(_TRUNCATED_UNDER_A_CALL, path, other)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])  # was -7 (SIGBUS)
    lines = done.stdout.splitlines()
    assert len(lines) == 3, done.stdout
    for line in lines[:2]:  # this call and every later one
        assert line.startswith(f"ProgramError `opforge.runtime.load({str(path)!r})"
                               ".method('forward')(...)`: program file "), line
        assert f"{path} — truncated in place (a read past its new end was stopped)" in line
        assert "load the program again" in line and "rename it over the old one" in line
    assert lines[0].count("this call's results are discarded") == 1
    assert lines[2] == "other 1.0"  # another program's file is not affected


def test_a_truncated_mapping_reads_zeros_and_is_flagged(tmp_path):
    done = _child("""
        import sys, tempfile, os
        import numpy as np
        from opforge.program import load
        from opforge.program.file_guard import watch_of
        path = sys.argv[1]
        program = load(path)
        watch = watch_of(program)
        watch.guard()
        data = np.frombuffer(program.segments[0].data, np.float32)
        assert not watch.faulted()
        os.truncate(path, 4096)
        print(float(np.abs(data).sum()), watch.faulted(), watch.changed())
    """, _write(tmp_path / "p.opf"))
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert done.stdout.split(" ", 2)[:2] == ["0.0", "True"], done.stdout
    assert "truncated in place" in done.stdout


@pytest.mark.parametrize("change", ["truncate", "rewrite", "rewrite_same_size"])
def test_a_file_changed_in_place_is_refused_before_the_call_reads_it(tmp_path, monkeypatch, change):
    monkeypatch.setattr(file_guard, "FSTAT_EVERY_NS", 0)
    path = _write(tmp_path / "served.opf")
    forward = load(path).method("forward")
    x = np.ones(64, np.float32)
    forward(x)
    size = os.path.getsize(path)
    if change == "truncate":
        os.truncate(path, 4096)
        found = rf"truncated or rewritten in place \({size} bytes at load, 4096 now\)"
    else:  # what `cp` does: the same file, new bytes (a same-size file changes no length)
        fresh = (_write(tmp_path / "new.opf", value=0.0) if change == "rewrite_same_size"
                 else _write(tmp_path / "new.opf", n=N // 2))
        data = fresh.read_bytes()
        assert (len(data) == size) == (change == "rewrite_same_size")
        stamp = os.stat(path).st_mtime_ns
        with open(path, "r+b") as f:
            f.truncate(0)
            f.write(data)
        os.utime(path, ns=(stamp + 10**9, stamp + 10**9))  # a coarse clock still moves
        found = ("rewritten in place" if change == "rewrite_same_size"
                 else "truncated or rewritten in place")
    with pytest.raises(ProgramError, match=rf"program file {path} — {found}.* no call can run"):
        forward(x)
    with pytest.raises(ProgramError, match=found):
        forward(x)  # and every later call


def test_a_file_replaced_by_rename_keeps_serving_the_loaded_program(tmp_path, monkeypatch):
    monkeypatch.setattr(file_guard, "FSTAT_EVERY_NS", 0)
    path = _write(tmp_path / "served.opf")
    loaded = load(path)
    forward = loaded.method("forward")
    x = np.ones(64, np.float32)
    before = forward(x)[0].copy()
    _write(path, value=0.0)  # save(): a new file renamed over the old one
    np.testing.assert_array_equal(forward(x)[0], before)
    np.testing.assert_array_equal(loaded.method("forward")(x)[0], before)
    assert before[0] == 1.0 and load(path).method("forward")(x)[0][0] == 0.0  # the new file's


def test_without_the_guard_the_fstat_check_still_refuses(tmp_path):
    path = _write(tmp_path / "served.opf")
    done = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import os, sys
        import numpy as np
        from opforge.program import file_guard
        from opforge.runtime import load
        forward = load(sys.argv[1]).method("forward")
        x = np.ones(64, np.float32)
        forward(x)
        os.truncate(sys.argv[1], 4096)
        forward._file._checked = 0
        try:
            forward(x)
        except Exception as e:
            print(file_guard.problem(), "|", type(e).__name__, e)
    """), str(path)], capture_output=True, text=True, timeout=120,
        env={**os.environ, file_guard.DISABLE_ENV: "0"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("disabled by OPFORGE_FILE_GUARD=0 | ProgramError"), done.stdout
    assert "truncated or rewritten in place" in done.stdout


def test_an_installed_guard_loads_with_no_compiler_and_no_toolchain_import(tmp_path):
    """What setup.py builds (``file_guard.build`` into ``_guard/``) is what a deploy process
    loads: no compiler on PATH, an empty cache, and neither OpenSSL nor the toolchain
    imported to find it."""
    site = tmp_path / "_guard"
    built = file_guard.build(site)
    assert built == site / file_guard.installed_name() and built.is_file()
    (tmp_path / "bin").mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("CXX", "CC", "PATH")}
    env.update(PATH=str(tmp_path / "bin"), OPFORGE_CACHE_DIR=str(tmp_path / "cache"))
    code = """
        import sys
        from pathlib import Path
        from opforge.program import file_guard
        file_guard.INSTALL_DIR = Path(sys.argv[1])
        problem = file_guard.problem()
        print(problem, getattr(file_guard._state["lib"], "_name", None))
        print(" ".join(m for m in ("_hashlib", "opforge.native.toolchain") if m in sys.modules))
    """
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code), str(site)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    loaded, heavy = (done.stdout.splitlines() + [""])[:2]
    assert loaded == f"None {built}" and heavy == "", done.stdout
    assert not (tmp_path / "cache").exists()  # nothing compiled or copied
    # and without it, no compiler: no guard, said why, nothing imported either
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code), str(tmp_path / "none")],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    said, heavy = (done.stdout.splitlines() + [""])[:2]
    assert said.startswith("GuardBuildError: not installed, and no C++ compiler") and \
        said.endswith(" None") and heavy == "", done.stdout
