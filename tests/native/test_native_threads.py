"""OpenMP inside a native kernel library obeys OPFORGE_NUM_THREADS / load(num_threads=N).

The kernel opens an OpenMP parallel region (default size: the machine's cores) in which
every thread spins for 150 ms of its own CPU time. Run from a child process with
OMP_NUM_THREADS unset, the threads that gained CPU during the call are counted from
``/proc/self/task/*/stat``: one asked, one ran; two asked (on ≥ 2 usable cores), two ran
(so the counter sees OpenMP's workers and the first check can fail). No torch.
"""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from opforge.manifest import parse_manifest
from opforge.native import build_library

pytestmark = [
    pytest.mark.skipif(shutil.which("c++") is None and shutil.which("g++") is None,
                       reason="needs a C++ compiler"),
    pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux /proc"),
]

MANIFEST = """
- func: omp_ops::spin.out(Tensor input, *, Tensor(a!) output) -> Tensor(a!)
  kernels:
    - arg_meta: null
      kernel_name: custom::spin_out_impl
"""
SOURCE = """
#include <ctime>
#include <omp.h>
#include "opforge/kernel.h"
namespace custom { namespace native {
static double thread_cpu() {
  timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t); return t.tv_sec + t.tv_nsec * 1e-9;
}
opforge::Tensor& spin_out_impl(const opforge::Tensor& input, opforge::Tensor& output) {
  float* out = output.mutable_data_ptr<float>();
  const float* in = input.const_data_ptr<float>();
  int threads = 0;
  #pragma omp parallel
  {
    double start = thread_cpu();
    volatile double sink = 0;
    while (thread_cpu() - start < 0.15) sink = sink + 1.0;
    #pragma omp atomic
    threads += 1;
  }
  for (long i = 0; i < input.numel(); ++i) out[i] = in[i] + (float) threads;
  return output;
}
}}
"""

CHILD = textwrap.dedent("""
    import json, os, sys
    import numpy as np
    from opforge.program import (ArenaStorage, KernelCall, MemoryPlan, Method, Operator,
                                 Program, ScalarType, TensorValue)
    from opforge.runtime import load
    library, how = sys.argv[1], sys.argv[2]
    f32 = ScalarType.FLOAT32
    x = TensorValue(f32, (4,), storage=ArenaStorage(0, 0))
    y = TensorValue(f32, (4,), storage=ArenaStorage(0, 64))
    method = Method("forward", (x, y), (0,), (1,), (KernelCall(0, (0, 1)),),
                    (Operator("omp_ops::spin", "out"),), MemoryPlan((128,)))
    num_threads = None if how == "env" else int(how)
    forward = load(Program(methods=(method,)), kernels=[library],
                   num_threads=num_threads).method("forward")
    forward(np.zeros(4, np.float32))  # OpenMP's workers exist from here on
    tick = os.sysconf("SC_CLK_TCK")

    def cpu_times():
        out = {}
        for tid in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out[tid] = (int(fields[11]) + int(fields[12])) / tick
        return out

    before = cpu_times()
    (y,) = forward(np.zeros(4, np.float32))
    after = cpu_times()
    ran = [round(after[t] - before.get(t, 0.0), 3) for t in after
           if after[t] - before.get(t, 0.0) >= 0.08]
    print(json.dumps({"ran": ran, "region": float(y[0])}))
""")


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    root = tmp_path_factory.mktemp("omp")
    (root / "spin.cpp").write_text(SOURCE)
    cache = tmp_path_factory.getbasetemp() / "opforge-cache"
    return str(build_library(parse_manifest(MANIFEST, "omp_ops.yaml"), [root / "spin.cpp"],
                             root / "libomp_ops.so", extra_flags=("-fopenmp",),
                             cache_root=cache).path)


def _run(library: str, how: str, env_threads: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OPFORGE_NUM_THREADS")}
    if env_threads is not None:
        env["OPFORGE_NUM_THREADS"] = env_threads
    proc = subprocess.run([sys.executable, "-c", CHILD, library, how], capture_output=True,
                          text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("env_threads", [None, "1"])
def test_openmp_in_a_native_kernel_runs_one_thread_when_one_is_asked(library, env_threads):
    result = _run(library, "env", env_threads)
    assert result["region"] == 1.0 and len(result["ran"]) == 1, result


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two usable cores")
def test_openmp_in_a_native_kernel_runs_two_threads_when_a_program_asks_for_two(library):
    result = _run(library, "2", "1")
    assert result["region"] == 2.0 and len(result["ran"]) == 2, result
