"""The portable C++ products, convolution, normalisations, softmax, reductions and pooling
against the NumPy kernels they restate (issue 44, item 2(d)).

    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 python bench/native_kernels.py [--repeats 200]

For each workload (the shapes the zoo and the decoders run): the NumPy kernel as the lean
runtime runs it (``kernel.bind(args)``: NumPy's OpenBLAS for products and convolution
columns) and the C++ kernel of libopforge_portable.so through the kernel ABI
(``NativeKernel.bind``: one ctypes call, ~1 µs, counted against the C++ kernel). Each
figure is the median of ``--repeats`` timed calls after warm-up, in microseconds, on one
thread, the NumPy and the C++ call timed alternately (both see the same load); ``ratio`` is NumPy / C++ (above 1: the C++ kernel is faster). The GEMM lines also
give GFLOP/s of the C++ kernel. ``--only WORD`` keeps workloads whose name contains it;
``--programs`` also times the zoo's programs on the lean runtime with and without these
C++ kernels (the other ops stay on NumPy kernels), and on the native executor
(``load(..., executor="native")``: the C++ instruction loop, every kernel from the C++
library, no ctypes per kernel) against the lean runtime.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from opforge.kernels.portable import portable_kernels  # noqa: E402
from opforge.native_runtime.build import build_runtime  # noqa: E402
from opforge.runtime.native import NativeLibrary  # noqa: E402

RNG = np.random.default_rng(0)


def randn(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def empty(*shape, dtype=np.float32):
    return np.empty(shape, dtype)


def conv(name, x, w, stride, padding, groups=1, bias=True):
    n, _, h, wd = x.shape
    k = w.shape[-1]
    oh = (h + 2 * padding - k) // stride + 1
    ow = (wd + 2 * padding - k) // stride + 1
    b = randn(w.shape[0]) if bias else None
    return (name, "aten::convolution.out",
            (x, w, b, [stride], [padding], [1], False, [0], groups, empty(n, w.shape[0], oh, ow)),
            2 * n * w.shape[0] * oh * ow * w.shape[1] * k * k)


def workloads():
    """(name, key, args, flops or 0)."""
    cases = []
    for m, k, n in ((4, 64, 128), (128, 768, 768), (1, 768, 3072), (64, 3072, 768),
                    (16, 64, 64), (512, 512, 512)):
        cases.append((f"mm {m}x{k}x{n}", "aten::mm.out", (randn(m, k), randn(k, n), empty(m, n)),
                      2 * m * k * n))
    # linear as exported: addmm(bias, x, W^T) with W^T a view of the (N, K) weight
    for m, k, n in ((4, 64, 128), (1, 768, 3072), (1, 3072, 768), (32, 768, 768)):
        w = randn(n, k)
        cases.append((f"addmm {m}x{k}x{n} (W^T)", "aten::addmm.out",
                      (randn(n), randn(m, k), w.T, 1, 1, empty(m, n)), 2 * m * k * n))
    cases.append(("bmm 8x32x64x32", "aten::bmm.out",
                  (randn(8, 32, 64), randn(8, 64, 32), empty(8, 32, 32)), 2 * 8 * 32 * 64 * 32))
    cases.append(("bmm 8x16x16x16 (q k^T)", "aten::bmm.out",
                  (randn(8, 16, 16), randn(8, 16, 16).transpose(0, 2, 1), empty(8, 16, 16)),
                  2 * 8 * 16 ** 3))
    cases.append(("bmm 12x64x64x64", "aten::bmm.out",
                  (randn(12, 64, 64), randn(12, 64, 64), empty(12, 64, 64)), 2 * 12 * 64 ** 3))
    cases.append(conv("conv cnn1 1x3x32x32 k3 ->8", randn(1, 3, 32, 32), randn(8, 3, 3, 3), 1, 1))
    cases.append(conv("conv cnn2 1x8x16x16 k3 ->16", randn(1, 8, 16, 16), randn(16, 8, 3, 3), 1, 1))
    cases.append(conv("conv resnet 1x16x16x16 k3 s2 ->32", randn(1, 16, 16, 16),
                      randn(32, 16, 3, 3), 2, 1, bias=False))
    cases.append(conv("conv resnet 1x32x8x8 k3 ->32", randn(1, 32, 8, 8), randn(32, 32, 3, 3), 1, 1,
                      bias=False))
    cases.append(conv("conv 1x1 s2 1x16x16x16 ->32", randn(1, 16, 16, 16), randn(32, 16, 1, 1), 2, 0,
                      bias=False))
    cases.append(conv("conv depthwise 1x16x16x16 k3", randn(1, 16, 16, 16), randn(16, 1, 3, 3), 1, 1,
                      groups=16, bias=False))
    cases.append(conv("conv pointwise 1x16x16x16 ->32", randn(1, 16, 16, 16), randn(32, 16, 1, 1), 1,
                      0, bias=False))
    cases.append(conv("conv 8x64x56x56 k3 ->64", randn(8, 64, 56, 56), randn(64, 64, 3, 3), 1, 1))
    for shape in ((1, 8, 32, 32), (8, 64, 56, 56)):
        c = shape[1]
        cases.append((f"batch norm {'x'.join(map(str, shape))}",
                      "aten::_native_batch_norm_legit_no_training.out",
                      (randn(*shape), randn(c), randn(c), randn(c), np.abs(randn(c)) + 0.5, 0.1, 1e-5,
                       empty(*shape), empty(0), empty(0)), 0))
    for shape in ((2, 16, 64), (4, 768), (128, 768)):
        n = shape[-1]
        rows = shape[:-1] + (1,)
        cases.append((f"layer norm {'x'.join(map(str, shape))}", "aten::native_layer_norm.out",
                      (randn(*shape), [n], randn(n), randn(n), 1e-5, empty(*shape), empty(*rows),
                       empty(*rows)), 0))
    for shape in ((8, 16, 16), (2, 4, 32, 32), (12, 64, 64), (1, 50257)):
        cases.append((f"softmax {'x'.join(map(str, shape))}", "aten::_softmax.out",
                      (randn(*shape), -1, False, empty(*shape)), 0))
    cases.append(("mean (global pool) 1x16x8x8", "aten::mean.out",
                  (randn(1, 16, 8, 8), [-1, -2], True, None, empty(1, 16, 1, 1)), 0))
    cases.append(("mean 8x64x56x56 over HW", "aten::mean.out",
                  (randn(8, 64, 56, 56), [-1, -2], True, None, empty(8, 64, 1, 1)), 0))
    cases.append(("sum 128x768 dim -1", "aten::sum.IntList_out",
                  (randn(128, 768), [-1], False, None, empty(128)), 0))
    cases.append(("amax 128x768 dim -1", "aten::amax.out",
                  (randn(128, 768), [-1], False, empty(128)), 0))
    cases.append(("argmax 1x50257", "aten::argmax.out",
                  (randn(1, 50257), -1, False, empty(1, dtype=np.int64)), 0))
    for shape in ((1, 8, 32, 32), (8, 64, 56, 56)):
        out = shape[:2] + (shape[2] // 2, shape[3] // 2)
        cases.append((f"max pool 2x2 {'x'.join(map(str, shape))}",
                      "aten::max_pool2d_with_indices.out",
                      (randn(*shape), [2, 2], [2, 2], [0, 0], [1, 1], False, empty(*out),
                       empty(*out, dtype=np.int64)), 0))
    cases.append(("max pool 3x3 s2 p1 8x64x56x56", "aten::max_pool2d_with_indices.out",
                  (randn(8, 64, 56, 56), [3, 3], [2, 2], [1, 1], [1, 1], False, empty(8, 64, 28, 28),
                   empty(8, 64, 28, 28, dtype=np.int64)), 0))
    cases.append(("adaptive avg pool 1x16x8x8 -> 1", "aten::_adaptive_avg_pool2d.out",
                  (randn(1, 16, 8, 8), [1, 1], empty(1, 16, 1, 1)), 0))
    return cases


FAMILIES = ("linalg", "convolution", "normalization", "softmax", "reduction", "pooling")


def programs(lib, path: str, repeats: int) -> None:
    """The zoo's programs on the lean runtime, NumPy kernels only and with this work's C++
    kernels (the six families) registered over them: median µs a call."""
    import torch

    from opforge.examples.zoo import ZOO
    from opforge.export.api import export
    from opforge.runtime import KernelRegistry, load
    from opforge.runtime.native import kernel_table

    mine = {e.key for e in kernel_table(path) if e.source in FAMILIES}
    print(f"\n{'zoo program':24s} {'lean numpy':>11s} {'lean+C++ six':>13s} {'ratio':>6s} "
          f"{'native exec':>12s} {'ratio':>6s}  C++-six keys")
    for name in ZOO:
        torch.manual_seed(0)
        model, inputs = ZOO[name]()
        program = export(model.eval(), inputs)
        keys = sorted({o.key for o in program.method("forward").operators})
        registry = KernelRegistry.portable()
        used = [k for k in keys if k in mine]
        for key in used:
            registry.register(key, lib.kernel(key), origin=path, target="native", override=True)
        arrays = [t.numpy() for t in inputs]
        numpy_method = load(program).method("forward")
        native_method = load(program, registry=registry).method("forward")
        numpy_us, native_us = paired_us(numpy_method, arrays, native_method, arrays, repeats)
        # the whole program on the native executor (C++ loop, every kernel the library's)
        try:
            executor = load(program, executor="native").method("forward")
            lean_us, exec_us = paired_us(numpy_method, arrays, executor, arrays, repeats)
            whole = f"{exec_us:12.1f} {lean_us / exec_us:5.2f}x"
        except Exception as e:  # an op the C++ library does not serve yet
            whole = f"{'n/a':>12s} {'':6s}  ({type(e).__name__}: {str(e)[:60]}...)"
        print(f"{name:24s} {numpy_us:11.1f} {native_us:13.1f} {numpy_us / native_us:5.2f}x {whole}  "
              f"{len(used)} of {len(keys)}", flush=True)


def paired_us(first, first_args, second, second_args, repeats: int) -> tuple[float, float]:
    """Medians (µs) of two calls timed alternately, so that both see the same load on a
    shared machine."""
    for _ in range(3):
        first(*first_args)
        second(*second_args)
    a, b = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        first(*first_args)
        t1 = time.perf_counter()
        second(*second_args)
        t2 = time.perf_counter()
        a.append(t1 - t0)
        b.append(t2 - t1)
    return statistics.median(a) * 1e6, statistics.median(b) * 1e6


def median_us(call, args, repeats: int) -> float:
    for _ in range(3):
        call(*args)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        call(*args)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--only", default="")
    parser.add_argument("--programs", action="store_true",
                        help="also time the zoo's programs with and without the C++ kernels")
    opts = parser.parse_args()
    spec = portable_kernels()
    lib = NativeLibrary(build_runtime().portable_library)
    print(f"median of {opts.repeats} calls, µs, one thread (OMP_NUM_THREADS="
          f"{os.environ['OMP_NUM_THREADS']}, OPENBLAS_NUM_THREADS="
          f"{os.environ['OPENBLAS_NUM_THREADS']}); ratio = NumPy / C++")
    # what the ctypes bridge adds to every C++ figure (the native runtime calls kernels
    # directly): a 1x1x1 product through the same bind
    tiny_call, tiny_args = lib.kernel("aten::mm.out").bind((empty(1, 1), empty(1, 1), empty(1, 1)))
    print(f"bridge: a 1x1x1 mm through NativeKernel.bind takes {median_us(tiny_call, tiny_args, opts.repeats):.2f} µs "
          "(ctypes; included in every C++ figure below)")
    print(f"{'workload':38s} {'numpy':>10s} {'C++':>10s} {'ratio':>7s} {'C++ GFLOP/s':>12s}")
    for name, key, args, flops in workloads():
        if opts.only not in name:
            continue
        kernel = spec[key]
        numpy_args = tuple(a.copy() if isinstance(a, np.ndarray) and a.flags.writeable else a
                           for a in args)
        bound_fn, bound_args = (kernel.bind(numpy_args) if hasattr(kernel, "bind")
                                else (kernel, numpy_args))
        repeats = opts.repeats if flops < 1e9 else max(5, opts.repeats // 20)
        native_call, native_args = lib.kernel(key).bind(args)
        numpy_us, native_us = paired_us(bound_fn, bound_args, native_call, native_args, repeats)
        rate = f"{flops / native_us / 1e3:12.1f}" if flops else f"{'':12s}"
        print(f"{name:38s} {numpy_us:10.1f} {native_us:10.1f} {numpy_us / native_us:6.2f}x {rate}",
              flush=True)
    if opts.programs:
        programs(lib, str(build_runtime().portable_library), opts.repeats)


if __name__ == "__main__":
    main()
