"""The native executor's own cost, timed from C, against the Python lean runtime (issue 44).

    python bench/native_runtime_overhead.py [--calls 20000] [--rounds 7]

- ``noop x1000``: a chain of 1,000 kernel calls of a kernel that returns at once (a native
  library built here): the executor's per-instruction overhead, nothing else;
- ``add x1000``: 1,000 dependent ``aten::add.out`` of 1x4 float32 (the portable C++
  kernel): per instruction with a real, tiny kernel;
- ``add 1x4``: one add of two 1x4 tensors: set both inputs (copied) + execute;
- ``new shape``: a dynamic 10-instruction chain called at a shape it has not seen (symbols
  bound, guards checked, sizes evaluated and written into the bound arguments) and at the
  shape of the previous call;
- ``--zoo``: the zoo's transformer_layer (47 instructions, seq in [1, 64]): the executor's
  own time per call (wall time minus the instructions' profiled times, so the kernels'
  cache behaviour at other sizes does not count) at a new shape and at a repeated one.

The C figures come from a small C++ program compiled here against libopforge_runtime
(steady_clock around a loop of calls, best of ``--rounds``); the Python figures time the
lean runtime's method call on the same program (best of ``--rounds`` batches).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from opforge.manifest import parse_manifest  # noqa: E402
from opforge.native import build_library  # noqa: E402
from opforge.native.toolchain import find_toolchain  # noqa: E402
from opforge.native_runtime.build import build_runtime  # noqa: E402
from opforge.program import (  # noqa: E402
    ArenaStorage, IntValue, KernelCall, MemoryPlan, Method, Operator, Program, ScalarType,
    SizeExpr, Symbol, SymbolicValue, TensorValue, save,
)
from opforge.runtime import load  # noqa: E402

MANIFEST = """
- func: bench_ops::noop.out(Tensor x, *, Tensor(a!) out) -> Tensor(a!)
  kernels:
    - arg_meta: null
      kernel_name: bench::noop_out
"""
KERNEL = """
#include "opforge/kernel.h"
namespace bench { namespace native {
opforge::Tensor& noop_out(const opforge::Tensor& x, opforge::Tensor& out) { return out; }
}}
"""

TIMER = r"""
// bench/native_runtime_overhead.py's timer: best ns per call of a method, from C.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include "opforge/runtime.h"

static void check(opf_status s, const char* what) {
  if (s) { std::fprintf(stderr, "%s: %s\n", what, opf_last_error()); std::exit(1); }
}

int main(int argc, char** argv) {
  // timer PROGRAM LIBRARY|- CALLS ROUNDS MODE [N]  (MODE: exec | inputs | shapes)
  const char* path = argv[1];
  const char* library = argv[2];
  long calls = std::atol(argv[3]), rounds = std::atol(argv[4]);
  const char* mode = argv[5];
  opf_registry* registry;
  check(opf_registry_new(&registry), "registry");
  if (std::strcmp(library, "-") != 0) check(opf_registry_load_library(registry, library, 0), "library");
  opf_program* program;
  check(opf_program_load_path(path, registry, nullptr, &program), "load");
  opf_method* method;
  check(opf_method_new(program, "forward", nullptr, &method), "method");
  alignas(64) float x[64 * 4] = {1, 2, 3, 4}, y[64 * 4] = {0.5f, 0.25f, 0.125f, 1};
  int64_t sizes[2] = {1, 4};
  int64_t num_inputs = 0;
  check(opf_program_method_io(program, "forward", &num_inputs, nullptr), "io");
  auto set = [&](int64_t rows) {
    sizes[0] = rows;
    check(opf_method_set_input(method, 0, x, 6, 2, sizes, 0), "input 0");
    if (num_inputs > 1) check(opf_method_set_input(method, 1, y, 6, 2, sizes, 0), "input 1");
  };
  if (std::strcmp(mode, "seq") == 0) {
    // a (2, n, 64) float32 input; the executor's own time of a call (its wall time minus the
    // instructions' profiled times) at a shape the 16-shape cache has not got (n cycling
    // through 17 sizes) and at the shape of the previous call; medians
    static float big[2 * 64 * 64];
    check(opf_method_set_profiling(method, 1), "profiling");
    const int64_t count = opf_method_num_instructions(method);
    auto overhead = [&](int64_t n) {
      int64_t shape[3] = {2, n, 64};
      check(opf_method_set_input(method, 0, big, 6, 3, shape, 0), "input");
      auto start = std::chrono::steady_clock::now();
      check(opf_method_execute(method), "execute");
      double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count();
      for (int64_t i = 0; i < count; ++i) {
        int64_t t = 0;
        check(opf_method_instruction_profile(method, i, nullptr, nullptr, &t), "profile");
        if (t > 0) ns -= double(t);
      }
      return ns;
    };
    std::vector<double> fresh, same;
    for (long r = 0; r < calls; ++r)
      for (int64_t n = 8; n < 25; ++n) fresh.push_back(overhead(n));
    for (long r = 0; r < calls; ++r)
      for (int64_t n = 8; n < 25; ++n) { overhead(n); same.push_back(overhead(n)); }
    std::sort(fresh.begin(), fresh.end());
    std::sort(same.begin(), same.end());
    std::printf("%.1f %.1f\n", fresh[fresh.size() / 2], same[same.size() / 2]);
    opf_method_free(method);
    opf_program_free(program);
    opf_registry_free(registry);
    return 0;
  }
  set(1);
  check(opf_method_execute(method), "execute");
  double best = 1e30;
  for (long r = 0; r < rounds; ++r) {
    auto start = std::chrono::steady_clock::now();
    if (std::strcmp(mode, "exec") == 0) {
      for (long i = 0; i < calls; ++i) check(opf_method_execute(method), "execute");
    } else if (std::strcmp(mode, "inputs") == 0) {
      for (long i = 0; i < calls; ++i) { set(1); check(opf_method_execute(method), "execute"); }
    } else {  // shapes: alternate between more shapes than the cache holds (each call a new binding)
      for (long i = 0; i < calls; ++i) { set(1 + i % 40); check(opf_method_execute(method), "execute"); }
    }
    double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count() / calls;
    if (ns < best) best = ns;
  }
  std::printf("%.1f\n", best);
  opf_method_free(method);
  opf_program_free(program);
  opf_registry_free(registry);
  return 0;
}
"""


def chain(length: int, op: str, *, dynamic: bool = False) -> Program:
    """x (op) ... length times, 1x4 float32 (rows s in [1, 64] when dynamic)."""
    rows = 64 if dynamic else 1
    slot = (rows * 16 + 63) // 64 * 64

    def tensor(k: int) -> TensorValue:
        return TensorValue(ScalarType.FLOAT32, (rows, 4), storage=ArenaStorage(0, slot * k))

    if op == "aten::add":
        values = [tensor(0), tensor(1), IntValue(1), tensor(2), tensor(3)]
        calls = [KernelCall(0, (0, 1, 2, 3))] + [
            KernelCall(0, ((3, 1, 2, 4) if i % 2 else (4, 1, 2, 3))) for i in range(1, length)]
        inputs, out = (0, 1), 3 if length % 2 else 4
    else:
        values = [tensor(0), tensor(1), tensor(2)]
        calls = [KernelCall(0, (0, 1))] + [KernelCall(0, ((1, 2) if i % 2 else (2, 1))) for i in range(1, length)]
        inputs, out = (0,), 1 if length % 2 else 2
    extra = {}
    if dynamic:
        e = SizeExpr.parse
        extra = dict(symbols=(Symbol("s", 1, 64),), symbolic_values=tuple(
            SymbolicValue(i, (e("s"), e("4"))) for i, v in enumerate(values) if type(v) is TensorValue))
    method = Method("forward", tuple(values), inputs, (out,), tuple(calls),
                    (Operator(op, "out"),),
                    MemoryPlan((slot * sum(type(v) is TensorValue for v in values),)), **extra)
    return Program(methods=(method,))


def python_ns(program: Program, libraries, inputs, calls: int, rounds: int, vary=None) -> float:
    method = load(program, kernels=libraries).method("forward")
    method(*inputs)
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter_ns()
        if vary is None:
            for _ in range(calls):
                method(*inputs)
        else:
            for i in range(calls):
                method(*vary(i))
        best = min(best, (time.perf_counter_ns() - start) / calls)
    return best


def export_transformer(folder: Path) -> Path:
    """The zoo's transformer_layer with seq in [1, 64] (example 2x16x64), portable kernels,
    exported in a child process (the measuring process never imports torch)."""
    path = folder / "transformer_layer-dynamic.opf"
    code = (
        "from torch.export import Dim\n"
        "from opforge.examples.zoo import ZOO\n"
        "from opforge.export import export\n"
        "from opforge.program import save\n"
        "model, inputs = ZOO['transformer_layer']()\n"
        "save(export(model, inputs, kernels='portable', dynamic_shapes=({1: Dim('seq', min=1, max=64)},)), "
        f"{str(path)!r})\n")
    subprocess.run([sys.executable, "-c", code], check=True)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--zoo", action="store_true",
                        help="also the zoo transformer layer with a dynamic sequence (needs torch to export)")
    args = parser.parse_args()
    runtime = build_runtime()
    cxx = find_toolchain(None).cxx
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "noop.cpp").write_text(KERNEL)
        noop = build_library(parse_manifest(MANIFEST, "bench.yaml"), [tmp / "noop.cpp"], tmp / "libbench.so").path
        (tmp / "timer.cpp").write_text(TIMER)
        include = Path(runtime.path).parent  # unused; headers come from the source tree
        root = Path(__file__).resolve().parents[1] / "opforge"
        subprocess.run([cxx, "-O2", "-std=c++17", str(tmp / "timer.cpp"), "-o", str(tmp / "timer"),
                        "-I", str(root / "native_runtime" / "include"), "-I", str(root / "native" / "include"),
                        str(runtime.runtime_library), f"-Wl,-rpath,{runtime.path}"], check=True)
        del include

        def c_ns(program: Program, library, mode: str, calls: int) -> float:
            path = tmp / "p.opf"
            save(program, path)
            out = subprocess.run([str(tmp / "timer"), str(path), str(library) if library else "-", str(calls),
                                  str(args.rounds), mode], check=True, capture_output=True, text=True)
            return float(out.stdout)

        x = np.array([[1, 2, 3, 4]], np.float32)
        y = np.array([[0.5, 0.25, 0.125, 1]], np.float32)
        rows = []
        few = max(args.calls // 100, 20)
        noop_program = chain(1000, "bench_ops::noop")
        c = c_ns(noop_program, noop, "exec", few)
        p = python_ns(noop_program, [str(noop)], (x,), max(few // 10, 5), args.rounds)
        rows.append(("noop x1000, per instruction", c / 1000, p / 1000))
        add_program = chain(1000, "aten::add")
        c = c_ns(add_program, None, "exec", few)
        p = python_ns(add_program, [], (x, y), max(few // 10, 5), args.rounds)
        rows.append(("add 1x4 x1000, per instruction", c / 1000, p / 1000))
        tiny = chain(1, "aten::add")
        rows.append(("add 1x4: execute only", c_ns(tiny, None, "exec", args.calls), float("nan")))
        rows.append(("add 1x4: 2 inputs copied + execute", c_ns(tiny, None, "inputs", args.calls),
                     python_ns(tiny, [], (x, y), args.calls, args.rounds)))
        dynamic = chain(10, "aten::add", dynamic=True)
        shapes = [(np.ones((n, 4), np.float32), np.ones((n, 4), np.float32)) for n in range(1, 41)]
        rows.append(("dynamic x10, same shape: inputs + execute", c_ns(dynamic, None, "inputs", args.calls),
                     python_ns(dynamic, [], shapes[0], args.calls, args.rounds)))
        rows.append(("dynamic x10, a new shape each call (40 > cache)", c_ns(dynamic, None, "shapes", few * 10),
                     python_ns(dynamic, [], shapes[0], few, args.rounds, vary=lambda i: shapes[i % 40])))
        if args.zoo:
            zoo = export_transformer(tmp)
            out = subprocess.run([str(tmp / "timer"), str(zoo), "-", "30", "1", "seq"],
                                 check=True, capture_output=True, text=True)
            new, same = (float(v) for v in out.stdout.split())
            rows.append(("zoo transformer_layer, executor time: repeated shape", same, float("nan")))
            rows.append(("zoo transformer_layer, executor time: a new shape", new, float("nan")))
    print(f"{'case':52s} {'native (C) ns':>14s} {'lean (Python) ns':>17s} {'ratio':>7s}")
    for name, c, p in rows:
        ratio = f"{p / c:7.1f}" if p == p else "      -"
        pt = f"{p:17.1f}" if p == p else f"{'-':>17s}"
        print(f"{name:52s} {c:14.1f} {pt} {ratio}")


if __name__ == "__main__":
    main()
