"""The per-call cost of the native runtime from Python and from C (issue 44, item 4).

    python bench/native_tiny_call.py [--batch 20000] [--rounds 7]

- ``add 1x4``: one ``aten::add.out`` of two 1x4 float32 tensors: the lean runtime's call,
  the native binding's call (``executor="native"``), and ``opforge-run --repeat`` (set the
  inputs + execute, timed inside the C++ tool);
- ``chain50``: 50 dependent adds of a 1x4 tensor (per-instruction overhead), the same three.

Each Python figure is the best of ``--rounds`` batches of ``--batch`` calls (the minimum
is the least disturbed on a shared machine); opforge-run prints its own median and minimum.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from opforge.native_runtime.build import build_runtime  # noqa: E402
from opforge.program import (  # noqa: E402
    ArenaStorage, IntValue, KernelCall, MemoryPlan, Method, Operator, Program, ScalarType,
    TensorValue, save,
)
from opforge.runtime import load  # noqa: E402


def chain_program(length: int) -> Program:
    """``x + y``, then ``+ y`` again ``length - 1`` times, all 1x4 float32."""
    def tensor(slot: int) -> TensorValue:
        return TensorValue(ScalarType.FLOAT32, (1, 4), storage=ArenaStorage(0, 64 * slot))

    values = [tensor(0), tensor(1), IntValue(1)] + [tensor(2 + i) for i in range(length)]
    calls = [KernelCall(0, (0, 1, 2, 3))] + [KernelCall(0, (3 + i - 1, 1, 2, 3 + i))
                                              for i in range(1, length)]
    method = Method("forward", tuple(values), (0, 1), (len(values) - 1,), tuple(calls),
                    (Operator("aten::add", "out"),), MemoryPlan((64 * (2 + length),)))
    return Program(methods=(method,))


def best_us(call, inputs, batch: int, rounds: int) -> float:
    for _ in range(min(batch, 2000)):
        call(*inputs)
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter_ns()
        for _ in range(batch):
            call(*inputs)
        best = min(best, (time.perf_counter_ns() - start) / batch / 1e3)
    return best


def tool_us(tool: Path, program: Path, x: Path, repeat: int) -> tuple[float, float]:
    out = subprocess.run([str(tool), str(program), "--input", str(x), "--input", str(x),
                          "--repeat", str(repeat)], capture_output=True, text=True, check=True)
    match = re.search(r"median ([\d.]+) us.*min ([\d.]+) us", out.stdout)
    return float(match.group(1)), float(match.group(2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    built = build_runtime()
    x = np.ones((1, 4), np.float32)
    print(f"{'workload':<10} {'lean µs':>9} {'native µs':>10} {'opforge-run median/min µs':>27}")
    with tempfile.TemporaryDirectory() as folder:
        np.save(os.path.join(folder, "x.npy"), x)
        for name, program in (("add 1x4", chain_program(1)), ("chain50", chain_program(50))):
            lean = load(program).method("forward")
            native = load(program, executor="native").method("forward")
            assert native(x, x)[0].tobytes() == lean(x, x)[0].tobytes()
            path = Path(folder) / "p.opf"
            save(program, path)
            median, low = tool_us(built.tool("opforge-run"), path, Path(folder) / "x.npy",
                                  args.batch)
            print(f"{name:<10} {best_us(lean, (x, x), args.batch, args.rounds):>9.2f} "
                  f"{best_us(native, (x, x), args.batch, args.rounds):>10.2f} "
                  f"{median:>18.2f} / {low:.2f}")


if __name__ == "__main__":
    main()
