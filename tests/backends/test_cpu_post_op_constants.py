"""Constants read only by a post-op the engine's own kernel runs after its sums.

The few-row matmul (small_matmul.cpp) runs a decode-shaped matmul's binary post-ops in
place after its kernel (the Epilogue of nan.cpp); their operands are the op's late_reads.
At finalize the engine frees the constants that only ops' reordered copies read (core.cpp),
and that pass saw a DnnlOp's Epilogue operands but not an own kernel's late_reads: a
constant post-op operand (timm cait_xxs24_224's layer scale, ``x + gamma * fc2(h)`` on one
row) was freed, and the Epilogue read it through a null pointer: SIGSEGV in oneDNN's
binary kernel. Only when the engine had copied the constant: it borrows one that is 64-byte
aligned in the program's bytes (engine.py), so the crash came and went with where numpy or
the file put the program (a run in 3 passed). Each program here is therefore run from its
bytes at an aligned address (constants borrowed) and at one 4 bytes past it (copied), in a
child process, so that a crash fails the test instead of ending the test runner.

Shapes: K·N = 768·192 > 2^16 (decode-shaped) and 1-8 rows; the operands of the post-ops:
a layer scale of [N], [1, N] or [M, N] (alone too: one constant operand crashed as well), a residual input of [M, N] or broadcast [1, N], a
constant residual; in both orders (scale then add, add then scale) and with three. Every
output is checked against eager float64 by cpu_reference.check_against_float64.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn

from opforge.backends.cpu import blob
from opforge.backends.cpu import engine as cpu_engine
from opforge.backends.named_data import NamedDataMap
from opforge.export import export
from opforge.program import to_bytes

from cpu_reference import check_against_float64
from test_cpu_hostile_plans import cpu_flags

K, N = 768, 192  # K·N past 2^16: the few-row kernel's decode-shaped path
DECODE_KERNEL = "matmul on few rows, decode-shaped (own kernel)"


class LinearThenPostOps(nn.Module):
    """fc(h) then `steps` in order: "mul" by the constant `scale`, "add" the input x,
    "add_const" the constant `shift`."""

    def __init__(self, steps, scale_shape=(N,), shift_shape=(N,)):
        super().__init__()
        self.steps = steps
        self.fc = nn.Linear(K, N)
        self.scale = nn.Parameter(torch.rand(scale_shape) + 0.5)
        self.shift = nn.Parameter(torch.randn(shift_shape))

    def forward(self, h, x):
        y = self.fc(h)
        for step in self.steps:
            if step == "mul":
                y = y * self.scale
            elif step == "add":
                y = x + y
            else:
                y = y + self.shift
        return y


# name: (rows, steps, scale's shape, x's shape or None for a shape of the output, shift's shape)
CASES = {
    "layer scale alone, 1 row": (1, ("mul",), (N,), None, (N,)),
    "cait layer scale then residual, 1 row": (1, ("mul", "add"), (N,), None, (N,)),
    "residual then scale, 1 row": (1, ("add", "mul"), (N,), None, (N,)),
    "scale [1, N] then residual, 2 rows": (2, ("mul", "add"), (1, N), None, (N,)),
    "scale [M, N] then residual, 4 rows": (4, ("mul", "add"), (4, N), None, (N,)),
    "scale then residual broadcast [1, N], 8 rows": (8, ("mul", "add"), (N,), (1, N), (N,)),
    "constant [M, N] added then scale, 3 rows": (3, ("add_const", "mul"), (N,), None, (3, N)),
    "scale, residual, constant, 5 rows": (5, ("mul", "add", "add_const"), (N,), None, (5, N)),
}

# run in the child: each program from its bytes at an aligned address and 4 bytes past it
_CHILD = r"""
import sys
from pathlib import Path
import numpy as np
from opforge.runtime import load

folder = Path(sys.argv[1])
for case in sorted(folder.glob("*.program")):
    raw = case.read_bytes()
    inputs = np.load(case.with_suffix(".inputs.npz"))
    for shift in (0, 4):
        print(f"start {case.stem} {shift}", flush=True)
        buf = np.zeros(len(raw) + 128, np.uint8)
        start = (-buf.ctypes.data) % 64 + shift
        buf[start:start + len(raw)] = np.frombuffer(raw, np.uint8)
        method = load(memoryview(buf[start:start + len(raw)])).method("forward")
        (got,) = method(inputs["h"], inputs["x"])
        np.save(folder / f"{case.stem}.{shift}.npy", np.asarray(got))
"""


def _build(name):
    rows, steps, scale_shape, x_shape, shift_shape = CASES[name]
    torch.manual_seed(0)
    model = LinearThenPostOps(steps, scale_shape, shift_shape).eval()
    inputs = (torch.randn(rows, K), torch.randn(x_shape or (rows, N)))
    return model, inputs


def _check_plan(program, steps):
    """One matmul carrying every step as a binary post-op; on AVX-512, the engine builds it
    on the few-row kernel (else the test would not reach the Epilogue)."""
    (delegate,) = program.delegates
    plan, data = blob.parse(program.segments[delegate.segment].data)
    matmuls = [op for op in plan["ops"] if op["kind"] == "matmul"]
    assert len(matmuls) == 1 and len(plan["ops"]) == 1, [op["kind"] for op in plan["ops"]]
    assert sum(p[0] == 1 for p in matmuls[0]["post"]) == len(steps), matmuls[0]["post"]
    if "avx512f" not in cpu_flags():
        return
    # the constants at an aligned address: borrowed, so this check is safe without the fix
    buf = np.zeros(len(data) + 64, np.uint8)
    start = (-buf.ctypes.data) % 64
    buf[start:start + len(data)] = np.frombuffer(data, np.uint8)
    handle = cpu_engine.EngineHandle(plan, memoryview(buf[start:start + len(data)]), 1, 1 << 30,
                                     None, {}, named=NamedDataMap(program))
    try:
        ops = handle.describe()
        assert ops == [DECODE_KERNEL], ops
    finally:
        handle.close()


def test_decode_matmul_constant_post_op_operands_borrowed_or_copied(tmp_path, monkeypatch):
    monkeypatch.delenv("OPFORGE_CPU_CAPABILITY", raising=False)
    monkeypatch.delenv("OPFORGE_CPU_DECODE_MATMUL", raising=False)
    models = {}
    for k, name in enumerate(CASES):
        model, inputs = _build(name)
        program = export(model, inputs, backends=["cpu"])
        _check_plan(program, CASES[name][1])
        (tmp_path / f"case{k}.program").write_bytes(to_bytes(program))
        np.savez(tmp_path / f"case{k}.inputs.npz", h=inputs[0].numpy(), x=inputs[1].numpy())
        models[f"case{k}"] = (name, model, inputs)
    done = subprocess.run([sys.executable, "-c", _CHILD, str(tmp_path)], capture_output=True,
                          text=True, timeout=300)
    started = [line.split()[1:] for line in done.stdout.splitlines() if line.startswith("start")]
    if done.returncode != 0:
        case, shift = started[-1] if started else ("?", "?")
        pytest.fail(f"the child ended with {done.returncode} in {models.get(case, (case,))[0]!r} "
                    f"(constants {'copied' if shift == '4' else 'borrowed'}):\n{done.stderr[-3000:]}")
    for case, (name, model, inputs) in models.items():
        for shift in (0, 4):
            got = np.load(tmp_path / f"{case}.{shift}.npy")
            try:
                check_against_float64(model, inputs, [got])
            except AssertionError as e:
                raise AssertionError(f"{name}, constants {'copied' if shift else 'borrowed'}: {e}") from None
