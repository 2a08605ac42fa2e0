"""The portable C++ elementwise kernels against the NumPy kernels they restate (issue 44).

    OMP_NUM_THREADS=1 python bench/portable_elementwise.py [--size 1048576] [--repeats 50]

For each op, on float32 tensors of ``--size`` elements: the NumPy kernel as the lean
runtime runs it (``kernel.bind(args)``: promotion and scalars settled once, a large GELU
in cache-sized blocks) and called directly, and the C++ kernel of libopforge_portable.so
through the kernel ABI (``NativeKernel.bind``: one ctypes call). Each figure is the median
of ``--repeats`` timed calls after warm-up, in milliseconds; single-threaded (the C++
kernels have no threads, and NumPy's ufuncs none either).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from opforge.kernels.portable import portable_kernels  # noqa: E402
from opforge.native_runtime.build import build_runtime  # noqa: E402
from opforge.runtime.native import NativeLibrary  # noqa: E402


def cases(n: int):
    rng = np.random.default_rng(0)
    a = rng.standard_normal(n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    out = np.empty(n, np.float32)
    row = rng.standard_normal(1024).astype(np.float32)
    a2 = a.reshape(-1, 1024)
    out2 = out.reshape(-1, 1024)
    return [
        ("add", "aten::add.out", (a, b, 1, out)),
        ("add, row broadcast", "aten::add.out", (a2, row, 1, out2)),
        ("mul", "aten::mul.out", (a, b, out)),
        ("mul by scalar", "aten::mul.Scalar_out", (a, 0.5, out)),
        ("div", "aten::div.out", (a, b, out)),
        ("relu", "aten::relu.out", (a, out)),
        ("exp", "aten::exp.out", (a, out)),
        ("sigmoid", "aten::sigmoid.out", (a, out)),
        ("silu", "aten::silu.out", (a, out)),
        ("gelu (erf)", "aten::gelu.out", (a, "none", out)),
        ("gelu (tanh)", "aten::gelu.out", (a, "tanh", out)),
        ("eq scalar", "aten::eq.Scalar_out", (a, 0.0, np.empty(n, bool))),
        ("where", "aten::where.self_out", (a > 0, a, b, out)),
    ]


def median_ms(call, args, repeats: int) -> tuple[float, float]:
    """(median, minimum) of ``repeats`` timed calls, in ms; the minimum is the figure to
    trust on a machine other processes share."""
    for _ in range(3):
        call(*args)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        call(*args)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3, min(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1 << 20)
    parser.add_argument("--repeats", type=int, default=50)
    opts = parser.parse_args()
    spec = portable_kernels()
    lib = NativeLibrary(build_runtime().portable_library)
    print(f"{opts.size} float32 elements, median of {opts.repeats}, ms "
          f"(OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']})")
    print(f"os.getloadavg() = {os.getloadavg()[0]:.1f}; median (min)")
    print(f"{'op':20s} {'numpy bound':>16s} {'numpy direct':>17s} {'C++':>16s} {'bound/C++':>10s}")
    for name, key, args in cases(opts.size):
        kernel = spec[key]
        bound_fn, bound_args = kernel.bind(args) if hasattr(kernel, "bind") else (kernel, args)
        numpy_bound = median_ms(bound_fn, bound_args, opts.repeats)
        numpy_direct = median_ms(kernel, args, max(3, opts.repeats // 10))
        native_call, native_args = lib.kernel(key).bind(args)
        native = median_ms(native_call, native_args, opts.repeats)
        cell = lambda t: f"{t[0]:7.3f} ({t[1]:6.3f})"  # noqa: E731
        print(f"{name:20s} {cell(numpy_bound):>16s} {cell(numpy_direct):>17s} {cell(native):>16s} "
              f"{numpy_bound[0] / native[0]:9.2f}x")


if __name__ == "__main__":
    main()
