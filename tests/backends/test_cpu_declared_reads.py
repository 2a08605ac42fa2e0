"""Every tensor an engine op reads at run time is one its declaration names (Op::run_reads
in native/engine.h): the memory plan's lifetimes and finalize's freeing of constants come
from that declaration alone, so a read it misses is a read of reused or freed bytes. Stop
55's crash was one: a constant layer scale read only by an own kernel's in-place post-op
(``late_reads``) was freed by a pass that did not look there (test_cpu_post_op_constants.py
has those cases, on AVX-512, where the few-row kernel runs them).

With ``OPFORGE_CPU_CHECK_READS=1`` the engine (core.cpp, memory_plan.cpp) withdraws at
finalize every constant no op declares reading, borrowed ones too (a read of one faults on
every run, not only when the constant was copied), and gives each intermediate its own
bytes, filled with NaN (0xff bytes) after its last declared use. Each program below runs in
a child process so (a crash fails the test instead of ending the runner) and must give what
the same program gives in the normal engine, itself checked against float64 elsewhere
(test_cpu_models.py, test_cpu_memory_plan.py): the arithmetic is the same, only where the
bytes live differs, so any NaN or fault is a read the declaration missed.

Programs: a decoder (embedding, norms, rotary, KV cache, attention), a convolution net with
post-ops (batch norm folded, ReLU, a residual add, ReLU6, pooling), a cait-like layer scale
on one row (the few-row kernel's late_reads on AVX-512) and on 16 rows after a ReLU (oneDNN's
matmul with the scale and residual in its Epilogue: the same bug on every x86-64).
"""

from __future__ import annotations

import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch
from torch import nn

from opforge.backends.cpu import blob
from opforge.backends.cpu import engine as cpu_engine
from opforge.export import export
from opforge.program import to_bytes
from opforge.runtime import load

pytestmark = pytest.mark.skipif(cpu_engine.missing() is not None,
                                reason=f"cpu backend: {cpu_engine.missing()}")

CHECK_ENV = "OPFORGE_CPU_CHECK_READS"
K, N = 768, 192  # K·N past 2^16: the few-row kernel's decode-shaped path (one row)


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 32, 3, padding=1)
        self.b1 = nn.BatchNorm2d(32)
        self.c2 = nn.Conv2d(32, 32, 3, padding=1)  # 3×3, 32 in: Winograd on AVX-512
        self.b2 = nn.BatchNorm2d(32)
        self.dw = nn.Conv2d(32, 32, 3, padding=1, groups=32)
        self.c3 = nn.Conv2d(32, 64, 1)
        self.fc = nn.Linear(64, 10)

    def forward(self, x):
        y = torch.relu(self.b1(self.c1(x)))
        y = torch.relu(self.b2(self.c2(y)) + y)
        y = nn.functional.relu6(self.dw(y))
        y = nn.functional.max_pool2d(self.c3(y), 2)
        return self.fc(y.mean((2, 3)))


class LayerScale(nn.Module):
    """cait's ``x + gamma * f(h)``: the scale a constant read only by the matmul's post-ops;
    with ``relu``, after a NaN-unsafe one (so in oneDNN's case the Epilogue runs them)."""

    def __init__(self, relu):
        super().__init__()
        self.relu = relu
        self.fc = nn.Linear(K, N)
        self.gamma = nn.Parameter(torch.rand(N) + 0.5)

    def forward(self, h, x):
        y = self.fc(h)
        if self.relu:
            y = torch.relu(y)
        return x + self.gamma * y


def _decoder():
    from opforge.examples.decoder import TinyDecoder

    model = TinyDecoder(vocab=64, dim=64, heads=8, kv_heads=4, hidden=192, layers=1, max_len=16,
                        seed=0).eval()
    return model, (torch.arange(12) * 5 % 64, torch.arange(12))


def _convnet():
    torch.manual_seed(0)
    model = ConvNet().eval()
    with torch.no_grad():
        for b in (model.b1, model.b2):
            b.running_mean.uniform_(-0.2, 0.2)
            b.running_var.uniform_(0.5, 1.5)
    return model, (torch.randn(1, 3, 20, 20),)


def _layer_scale(rows, relu):
    def make():
        torch.manual_seed(0)
        return LayerScale(relu).eval(), (torch.randn(rows, K), torch.randn(rows, N))
    return make


PROGRAMS = {
    "decoder": _decoder,
    "convnet with post-ops": _convnet,
    "layer scale, 1 row": _layer_scale(1, False),
    "layer scale after relu, 16 rows": _layer_scale(16, True),
}

_CHILD = r"""
import sys
from pathlib import Path
import numpy as np
from opforge.backends.cpu import blob
from opforge.backends.cpu import engine as cpu_engine
from opforge.backends.named_data import NamedDataMap
from opforge.program import from_bytes
from opforge.runtime import load

folder = Path(sys.argv[1])
for case in sorted(folder.glob("*.program")):
    raw = case.read_bytes()
    program = from_bytes(raw)
    print(f"start {case.stem}", flush=True)
    for d in program.delegates:  # the check is on: every intermediate in its own bytes
        plan, data = blob.parse(program.segments[d.segment].data)
        h = cpu_engine.EngineHandle(plan, data, 1, 1 << 30, None, {}, named=NamedDataMap(program))
        m = h.memory()
        h.close()
        print(f"memory {case.stem} {m['arena']} {m['intermediates']}", flush=True)
    inputs = np.load(case.with_suffix(".inputs.npz"))
    got = load(raw).method("forward")(*(inputs[f"a{k}"] for k in range(len(inputs.files))))
    np.savez(folder / f"{case.stem}.got.npz", *[np.asarray(g) for g in got])
"""


def _aligned(raw: bytes) -> memoryview:
    """The program's bytes at a 64-byte aligned address: the engine borrows its constants
    (engine.py), so the normal run that gives the expected values frees none of them and a
    missed read cannot crash it (test_cpu_post_op_constants.py runs copied ones too)."""
    buf = np.zeros(len(raw) + 64, np.uint8)
    start = (-buf.ctypes.data) % 64
    buf[start:start + len(raw)] = np.frombuffer(raw, np.uint8)
    return memoryview(buf[start:start + len(raw)])


def _child_env():
    import os

    env = dict(os.environ)
    env.update({CHECK_ENV: "1", "OMP_NUM_THREADS": "1", "OPFORGE_NUM_THREADS": "1"})
    return env


def test_every_read_is_declared_in_check_mode(tmp_path, monkeypatch):
    monkeypatch.delenv(CHECK_ENV, raising=False)
    want, names = {}, {}
    for k, (name, make) in enumerate(PROGRAMS.items()):
        model, inputs = make()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            program = export(model, inputs, backends=["cpu"])
        assert program.delegates, name
        for d in program.delegates:  # every op the engine's: nothing left to the portable path
            plan, _ = blob.parse(program.segments[d.segment].data)
            assert plan["ops"], name
        raw = to_bytes(program)
        (tmp_path / f"case{k}.program").write_bytes(raw)
        arrays = [t.numpy() for t in inputs]
        np.savez(tmp_path / f"case{k}.inputs.npz", **{f"a{j}": a for j, a in enumerate(arrays)})
        want[f"case{k}"] = [np.asarray(g) for g in load(_aligned(raw)).method("forward")(*arrays)]
        names[f"case{k}"] = name
    done = subprocess.run([sys.executable, "-c", _CHILD, str(tmp_path)], capture_output=True,
                          text=True, timeout=600, env=_child_env())
    started = [line.split()[1] for line in done.stdout.splitlines() if line.startswith("start")]
    if done.returncode != 0:
        case = started[-1] if started else "?"
        pytest.fail(f"the child ended with {done.returncode} in {names.get(case, case)!r} (a read "
                    f"of a constant no op declares?):\n{done.stderr[-3000:]}")
    # the check was on: no intermediate shares bytes with another
    for line in done.stdout.splitlines():
        if line.startswith("memory"):
            _, case, arena, intermediates = line.split()
            assert int(arena) >= int(intermediates) > 0 or int(intermediates) == 0, line
    assert any(line.startswith("memory") and int(line.split()[3]) > 0
               for line in done.stdout.splitlines()), done.stdout
    for case, expected in want.items():
        got = np.load(tmp_path / f"{case}.got.npz")
        got = [got[f"arr_{j}"] for j in range(len(got.files))]
        assert len(got) == len(expected), names[case]
        for g, w in zip(got, expected):
            # the same ops on the same values, one thread: equal but for a kernel's choice
            # by address (1e-6 of the scale); a poisoned read is NaN or -1-filled bytes
            scale = float(np.max(np.abs(w))) if w.size else 0.0
            assert np.isfinite(g).all() == np.isfinite(w).all(), (
                f"{names[case]}: NaN where the normal engine has none: a read the declaration missed")
            np.testing.assert_allclose(g, w, rtol=0, atol=1e-6 * max(scale, 1.0),
                                       err_msg=f"{names[case]}: a read the declaration missed?")
