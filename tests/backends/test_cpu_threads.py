"""The cpu engine runs a delegate call on exactly the threads it was given (num_threads, 1 by
default), however many processors the machine has: counted as the threads of the process
that gained CPU time during long calls (/proc/self/task/*/stat), not by timing, and with
one thread no OpenMP pool is ever started (init's weight reorders used to start one)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from opforge.backends.cpu import engine as cpu_engine
from test_cpu_hostile_plans import capability  # noqa: F401 (a fixture: own kernels, then oneDNN's)

pytestmark = [
    pytest.mark.skipif(cpu_engine.missing() is not None, reason=f"cpu backend: {cpu_engine.missing()}"),
    pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc"),
]

CHILD = textwrap.dedent("""
    import os, sys
    import numpy as np
    sys.path.insert(0, {here!r})
    from test_cpu_hostile_plans import Plan, run, F32

    def cpu_ticks():
        ticks = {{}}
        for tid in os.listdir("/proc/self/task"):
            try:
                fields = open(f"/proc/self/task/{{tid}}/stat").read().rsplit(")", 1)[1].split()
            except OSError:
                continue  # a thread that ended
            ticks[tid] = int(fields[11]) + int(fields[12])  # utime + stime
        return ticks

    # a convolution (oneDNN sizes its thread team when the primitive is made) and a matmul
    n, c, s = 512, 64, 56
    threads_before = set(os.listdir("/proc/self/task"))
    p = Plan()
    x = p.tensor(F32, [1, c, s, s], role="input")
    w = p.const(np.ones((c, c, 3, 3), np.float32))
    y = p.tensor(F32, [1, c, s, s], role="output")
    p.op("conv", [x, w], [y], [2, 1, 1, 1, 1, 1, 1, 1, 1, 0])
    a = p.tensor(F32, [n, n], role="input")
    m = p.const(np.ones((n, n), np.float32))
    b = p.tensor(F32, [n, n], role="output")
    p.op("matmul", [a, m], [b])
    handle = p.handle(threads={threads})
    inputs = [np.ones((1, c, s, s), np.float32), np.ones((n, n), np.float32)]
    run(handle, *inputs)  # warm: oneDNN's kernels and OpenMP's pool exist before counting
    before = cpu_ticks()
    for _ in range(40):
        run(handle, *inputs)
    after = cpu_ticks()
    busy = [t for t in after if after[t] - before.get(t, 0) >= 5]  # >= 50 ms of CPU
    print("BUSY", len(busy), sorted(after[t] - before.get(t, 0) for t in after))
    print("NEW", len(set(after) - threads_before))  # threads started by init and the calls
""")


def thread_counts(threads: int) -> tuple[int, int]:
    """(threads that gained CPU time during the calls, threads started since before init)"""
    here = str(Path(__file__).resolve().parent)
    env = dict(os.environ, OMP_NUM_THREADS="", OMP_WAIT_POLICY="passive")
    env.pop("OMP_NUM_THREADS")
    proc = subprocess.run([sys.executable, "-c", CHILD.format(here=here, threads=threads)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = {s.split()[0]: int(s.split()[1]) for s in proc.stdout.splitlines()
             if s.startswith(("BUSY", "NEW"))}
    return lines["BUSY"], lines["NEW"]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 processors")
def test_one_thread_by_default_even_on_a_multicore_machine():
    # one thread runs the calls, and neither init (weight reorders) nor the calls start an
    # OpenMP pool
    assert thread_counts(1) == (1, 0)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 processors")
def test_two_threads_when_asked():
    busy, _ = thread_counts(2)
    assert busy == 2


SMALL_CHILD = textwrap.dedent("""
    import os, sys
    import numpy as np
    sys.path.insert(0, {here!r})
    from test_cpu_hostile_plans import Plan, run, F32, RELU, B_ADD

    # small ops (a matmul of 32 × 64 × 64 multiply-adds, a relu and an add of 2048 elements)
    # and a large matmul (256^3 = 2^24): the small ones run on one thread at threads=2
    p = Plan()
    a = p.tensor(F32, [32, 64], role="input")
    t = p.tensor(F32, [32, 64])
    p.op("matmul", [a, p.const(np.full((64, 64), 0.01, np.float32))], [t])
    u = p.tensor(F32, [32, 64])
    p.op("eltwise", [t], [u], [RELU], [0.0, 0.0])
    small = p.tensor(F32, [32, 64], role="output")
    p.op("binary", [u, a], [small], [B_ADD])
    big_in = p.tensor(F32, [256, 256], role="input")
    big = p.tensor(F32, [256, 256], role="output")
    p.op("matmul", [big_in, p.const(np.full((256, 256), 0.01, np.float32))], [big])
    handle = p.handle(threads=2)
    print("THREADS", *handle.op_threads())
    x, y = np.ones((32, 64), np.float32), np.ones((256, 256), np.float32)
    got = run(handle, x, y)
    assert np.allclose(got[0], 1.64) and np.allclose(got[1], 2.56), (got[0][0, :3], got[1][0, :3])
    # the small ops alone, many calls: the second thread gains no CPU time
    q = Plan()
    a = q.tensor(F32, [32, 64], role="input")
    out = q.tensor(F32, [32, 64], role="output")
    q.op("matmul", [a, q.const(np.full((64, 64), 0.01, np.float32))], [out])
    handle = q.handle(threads=2)
    run(handle, x)
    before = {{tid: open(f"/proc/self/task/{{tid}}/stat").read() for tid in os.listdir("/proc/self/task")}}
    def ticks(text):
        fields = text.rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    for _ in range(100000):
        run(handle, x)
    busy = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            now = ticks(open(f"/proc/self/task/{{tid}}/stat").read())
        except OSError:
            continue
        busy += now - ticks(before.get(tid, "x) " + "0 " * 20)) >= 5
    print("BUSY", busy)
""")


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 processors")
def test_small_ops_run_on_one_thread_when_the_delegate_has_two():
    """A small op's second thread costs more (its wake-up, a barrier, and on a shared machine
    a stall until it is scheduled) than it saves: such ops run on one thread, large ones on
    the delegate's (docs/backend-cpu.md, "Threads")."""
    here = str(Path(__file__).resolve().parent)
    env = dict(os.environ, OMP_WAIT_POLICY="passive")
    env.pop("OMP_NUM_THREADS", None)
    proc = subprocess.run([sys.executable, "-c", SMALL_CHILD.format(here=here)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = {line.split()[0]: line.split()[1:] for line in proc.stdout.splitlines()}
    assert lines["THREADS"] == ["1", "1", "1", "2"], lines
    assert lines["BUSY"] == ["1"], lines


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 processors")
def test_ops_that_move_more_than_they_compute_count_their_work_four_times(capability):
    """A depthwise convolution's few multiply-adds per output leave it bound by memory:
    MobileNetV2's 14×14×384 one (0.68 M multiply-adds, under the 2^20 of a small op) runs on
    two threads, a matmul of 0.52 M over 128 terms an output and a 16×16×16 depthwise one
    (37 K) on one; the own depthwise kernel and oneDNN's alike."""
    import numpy as np

    import test_cpu_depthwise as dw
    from test_cpu_hostile_plans import F32, Plan

    def depthwise(c, h):
        plan = dw._plan(1, c, h, h, post="relu6")[0]
        return plan.handle(threads=2).op_threads()

    p = Plan()
    a = p.tensor(F32, [32, 128], role="input")
    out = p.tensor(F32, [32, 128], role="output")
    p.op("matmul", [a, p.const(np.full((128, 128), 0.01, np.float32))], [out])
    assert depthwise(384, 14) == [2]
    assert depthwise(16, 16) == [1]
    assert p.handle(threads=2).op_threads() == [1]


def test_a_method_of_cpu_delegates_alone_holds_no_pools_around_its_calls():
    """The engine sizes its own OpenMP regions each call, so a method whose only instruction
    is a cpu delegate gets no thread governor (threadpoolctl's reads cost ~1 µs a call); the
    same model on the portable kernels (NumPy's BLAS for the matmul) keeps one, and so does a
    delegate calling out to a kernel library (whose pools are not the engine's)."""
    import torch

    from opforge.backends.cpu import CpuBackend
    from opforge.export import export
    from opforge.runtime import load

    model, x = torch.nn.Linear(8, 4).eval(), torch.randn(3, 8)
    cpu = load(export(model, (x,), backends=["cpu"]), num_threads=2).method("forward")
    lean = load(export(model, (x,)), num_threads=2).method("forward")
    assert cpu._threads is None and lean._threads is not None
    got = cpu(x.numpy())[0]
    with torch.no_grad():
        want = model.double()(x.double()).numpy()
    assert abs(got - want).max() < 1e-6

    class Handle:
        callouts = True

    assert not CpuBackend().own_threads(Handle())
