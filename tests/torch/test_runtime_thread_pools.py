"""OPFORGE_NUM_THREADS (and ``load(num_threads=N)``) governs every pool a call can reach:
NumPy's BLAS in lean mode, torch's intra-op pool in ATen mode. Checked by counting the
threads that actually run during a long call, not by timing.

Each case runs in a child process with OMP_NUM_THREADS / OPENBLAS_NUM_THREADS unset, so
the pools start at the machine's size (what a user gets by default). The child samples
every thread's CPU time (``/proc/self/task/*/stat``) before and after a few large matmul
calls; a thread that gained ≥ 30 ms of CPU ran during them. One thread asked: exactly one
ran (the caller). Two asked, on a machine with ≥ 2 usable cores: two ran — this also shows
the counter sees pool threads, so the first assertion can fail.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux /proc")

CHILD = textwrap.dedent("""
    import json, os, sys, threading
    import numpy as np
    import torch
    from opforge.export import export
    from opforge.runtime import load

    mode, how = sys.argv[1], sys.argv[2]
    from threadpoolctl import threadpool_info
    pools_before = sorted(i["num_threads"] for i in threadpool_info())
    torch_before = torch.get_num_threads()
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(768, 768) for _ in range(4)]).eval()
    x = torch.randn(512, 768)
    program = export(model, (x,), kernels="portable")
    num_threads = None if how == "env" else int(how)
    forward = load(program, mode=mode, num_threads=num_threads).method("forward")
    a = x.numpy()
    forward(a)
    tick = os.sysconf("SC_CLK_TCK")

    def cpu_times():
        out = {}
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                out[tid] = (int(fields[11]) + int(fields[12])) / tick
            except OSError:
                pass
        return out

    before = cpu_times()
    for _ in range(12):
        forward(a)
    after = cpu_times()
    busy = sorted(after[t] - before.get(t, 0.0) for t in after)
    ran = [round(d, 3) for d in busy if d >= 0.03]
    pools_after = sorted(i["num_threads"] for i in threadpool_info())
    print(json.dumps({"ran": ran, "pools": [pools_before, pools_after],
                      "torch": [torch_before, torch.get_num_threads()]}))
""")


def _run(mode: str, how: str, env_threads: str | None) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                        "OPFORGE_NUM_THREADS")}
    if env_threads is not None:
        env["OPFORGE_NUM_THREADS"] = env_threads
    proc = subprocess.run([sys.executable, "-c", CHILD, mode, how], capture_output=True,
                          text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _cores() -> int:
    return len(os.sched_getaffinity(0))


@pytest.mark.parametrize("mode", ["lean", "aten"])
def test_one_thread_asked_one_thread_runs(mode):
    result = _run(mode, "env", "1")
    assert len(result["ran"]) == 1, result


@pytest.mark.parametrize("mode", ["lean", "aten"])
def test_unset_means_one_thread_and_pools_are_restored_after_the_call(mode):
    result = _run(mode, "env", None)
    assert len(result["ran"]) == 1, result
    # every pool is back at its size from before the load once the call returns
    assert result["pools"][0] == result["pools"][1], result
    assert result["torch"][0] == result["torch"][1], result


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two usable cores")
@pytest.mark.parametrize("mode", ["lean", "aten"])
def test_two_threads_asked_per_program_two_threads_run(mode):
    result = _run(mode, "2", "1")  # load(num_threads=2) wins over the environment
    assert len(result["ran"]) == 2, result


def test_bad_thread_counts_are_refused_at_load():
    from opforge.errors import ProgramError
    from opforge.program import (ArenaStorage, KernelCall, MemoryPlan, Method, Operator, Program,
                                 ScalarType, TensorValue)
    from opforge.runtime import load

    x = TensorValue(ScalarType.FLOAT32, (3,), storage=ArenaStorage(0, 0))
    y = TensorValue(ScalarType.FLOAT32, (3,), storage=ArenaStorage(0, 64))
    program = Program(methods=(Method("forward", (x, y), (0,), (1,), (KernelCall(0, (0, 1)),),
                                      (Operator("aten::relu", "out"),), MemoryPlan((128,))),))
    for bad in (0, -2, 1.5, True):
        with pytest.raises(ProgramError, match="num_threads"):
            load(program, num_threads=bad)
    os.environ["OPFORGE_NUM_THREADS"] = "zero"
    try:
        with pytest.raises(ProgramError, match="OPFORGE_NUM_THREADS='zero'"):
            load(program)
    finally:
        del os.environ["OPFORGE_NUM_THREADS"]
