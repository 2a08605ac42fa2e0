"""The native runtime's portable kernels on 1 and N threads (num_threads, issue 44).

    python bench/native_threads.py [--threads 2] [--repeats 30]

Each workload is a one-kernel program (opforge.program._sample.one_kernel_program) run by
``load(..., executor="native", num_threads=T)``; a call sets the inputs (a copy into the
arena, counted) and runs the kernel. The 1-thread and T-thread instances are called
alternately, so both see the same machine load; each figure is the median of ``--repeats``
calls after warm-up, in ms. Products also give GFLOP/s (2mnk per call), and every pair is
checked bit for bit (threads split rows or columns, never the sum). ``speedup`` is the
1-thread median over the T-thread one; the two ``CPU ms`` columns are the process's CPU
time per call (all threads) at 1 and T threads: close together, the split itself costs
little, and a wall time above the 1-thread one is the scheduler's (a busy machine). The load average is printed: on a shared machine,
a busy neighbour takes the second core and the speedup with it.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import numpy as np

from opforge.program import BoolValue, IntListValue, IntValue, NoneValue, ScalarType
from opforge.program._sample import one_kernel_program
from opforge.runtime import load

F32 = ScalarType.FLOAT32
RNG = np.random.default_rng(0)


def randn(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def mm(m, n, k):
    program = one_kernel_program("aten::mm", "out", [(F32, (m, k)), (F32, (k, n)), (F32, (m, n))], [0, 1], [2])
    return f"mm {m}x{n}x{k}", program, (randn(m, k), randn(k, n)), 2 * m * n * k


def linear(m, n, k):
    program = one_kernel_program("aten::linear", "out", [(F32, (m, k)), (F32, (n, k)), NoneValue(), (F32, (m, n))],
                                 [0, 1], [3])
    return f"linear {m}x{n}x{k} (W^T)", program, (randn(m, k), randn(n, k)), 2 * m * n * k


def conv(n, c, h, co, k, groups=1, stride=1):
    pad = k // 2
    oh = (h + 2 * pad - k) // stride + 1
    program = one_kernel_program(
        "aten::convolution", "out",
        [(F32, (n, c, h, h)), (F32, (co, c // groups, k, k)), NoneValue(), IntListValue((stride, stride)),
         IntListValue((pad, pad)), IntListValue((1, 1)), BoolValue(False), IntListValue((0, 0)),
         IntValue(groups), (F32, (n, co, oh, oh))], [0, 1], [9])
    name = f"conv {c}->{co} {k}x{k} on {h}x{h}" + (" depthwise" if groups > 1 else "")
    return name, program, (randn(n, c, h, h), randn(co, c // groups, k, k)), 2 * n * co * oh * oh * (c // groups) * k * k


def unary(op, n):
    program = one_kernel_program(op, "out", [(F32, (n,)), (F32, (n,))], [0], [1])
    return f"{op.split('::')[1]} {n} elements", program, (randn(n),), 0


def workloads():
    return [mm(128, 768, 768), mm(512, 512, 512), mm(64, 3072, 768), mm(1024, 1024, 256),
            linear(1, 3072, 768), linear(32, 768, 768),
            conv(1, 64, 56, 64, 3), conv(1, 128, 28, 128, 3, groups=128),
            unary("aten::exp", 1 << 20), unary("aten::tanh", 1 << 20)]


def timed(call, inputs) -> tuple[float, float]:
    """(wall ms, CPU ms of the whole process: every thread of the pool counted)."""
    start, cpu = time.perf_counter(), time.process_time()
    call(*inputs, views=True)
    return (time.perf_counter() - start) * 1e3, (time.process_time() - cpu) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"load average {os.getloadavg()[0]:.2f}; threads 1 vs {args.threads}; medians of {args.repeats}")
    print(f"{'workload':34} {'1 thread ms':>11} {f'{args.threads} threads ms':>12} {'speedup':>8} "
          f"{'GFLOP/s (1)':>12} {f'GFLOP/s ({args.threads})':>12} {'CPU ms':>7} {f'CPU ms':>7}")
    for name, program, inputs, flops in workloads():
        one = load(program, executor="native", num_threads=1).method("forward")
        many = load(program, executor="native", num_threads=args.threads).method("forward")
        a, b = one(*inputs)[0], many(*inputs)[0]
        assert a.tobytes() == b.tobytes(), f"{name}: {args.threads} threads changed the bits"
        for _ in range(3):
            timed(one, inputs), timed(many, inputs)
        t1, tn = [], []
        for _ in range(args.repeats):
            t1.append(timed(one, inputs))
            tn.append(timed(many, inputs))
        m1, mn = statistics.median(w for w, _ in t1), statistics.median(w for w, _ in tn)
        c1, cn = statistics.median(c for _, c in t1), statistics.median(c for _, c in tn)
        rate = (f"{flops / m1 / 1e6:12.1f} {flops / mn / 1e6:12.1f}" if flops else f"{'':25}")
        print(f"{name:34} {m1:11.3f} {mn:12.3f} {m1 / mn:8.2f} {rate} {c1:7.2f} {cn:7.2f}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
