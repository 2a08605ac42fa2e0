"""The native fuzzers' batched exchanges with their workers still pin a crash or a hang on
the one case that caused it, and the cases after it are still run (fuzz/native_exec_fuzz.py's
worker pool, fuzz/native_program_fuzz.py's driver), with stand-in workers that crash or hang
on a marked case.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

FUZZ = Path(__file__).resolve().parents[2] / "fuzz"
sys.path.insert(0, str(FUZZ))

import native_exec_fuzz as NX  # noqa: E402
import native_program_fuzz as NF  # noqa: E402


def _stand_in_worker(conn) -> None:
    """Answers each case of a batch at once; killed by 'crash', silent on 'hang'."""
    while True:
        batch = conn.recv()
        if batch is None:
            return
        for case in batch:
            if case == "crash":
                os.kill(os.getpid(), signal.SIGSEGV)
            if case == "hang":
                time.sleep(60)
            conn.send(("ran", case))


def test_a_batch_pins_the_crash_and_the_hang_and_runs_the_rest():
    pool = NX._Spawned(_stand_in_worker, ())
    try:
        answers = pool.run_batch(["a", "b", "crash", "c", "hang", "d"], timeout=3)
    finally:
        pool.close()
    assert answers[:2] == [("ran", "a"), ("ran", "b")]
    assert answers[2].startswith("finding: worker died") and "signal 11" in answers[2]
    assert answers[3] == ("ran", "c")
    assert answers[4] == "finding: hang (no answer in 3 s)"
    assert answers[5] == ("ran", "d")


_DRIVER = f"""#!{sys.executable}
import os, struct, sys, time
while True:
    head = sys.stdin.buffer.read(4)
    if len(head) < 4:
        sys.exit(0)
    data = sys.stdin.buffer.read(struct.unpack("<I", head)[0])
    if data == b"crash":
        os.abort()
    if data == b"hang":
        time.sleep(60)
    sys.stdout.write(f"3\\t{{len(data)}}\\n")
    sys.stdout.flush()
"""


def test_the_program_driver_answers_a_batch_larger_than_a_pipe_and_stops_at_a_crash(tmp_path):
    exe = tmp_path / "driver"
    exe.write_text(_DRIVER)
    exe.chmod(0o755)
    # 300 cases of 4 KiB: more than a pipe holds either way, written while answers are read
    driver = NF.Driver(exe)
    try:
        answers = driver.ask_many([bytes(4096)] * 300, timeout=20)
        assert [a[:3] for a in answers] == [("ok", 3, "4096")] * 300
        answers = driver.ask_many([b"x", b"crash", b"y"], timeout=20)
        assert [a[0] for a in answers] == ["ok", "dead"]  # the crash is the last answer
    finally:
        driver.close()
    driver = NF.Driver(exe)
    try:
        answers = driver.ask_many([b"x", b"hang", b"y"], timeout=2)
        assert [a[0] for a in answers] == ["ok", "hang"]
    finally:
        driver.proc.kill()
        driver.close()
