"""Decode-shaped matmuls (small_matmul.cpp): at most 8 rows against constant weights past
the few-row kernel's 2^16, read in oneDNN's own reordered layout (BA16a64b) by the
engine's kernel: its numbers against float64 on rows 1..8, K not a multiple of 16 and N not
a multiple of 16 or 64, post-ops in registers and after it (a residual add), 2 threads,
and which calls take it (AVX-512 only; OPFORGE_CPU_DECODE_MATMUL=0 keeps oneDNN's).

Tolerance: as test_cpu_small_matmul.py (each output a float32 sum of K products plus a
bias, in order, one rounding each; 2·(K + 2)·2^-24·(Σ|a·b| + |bias|) covers both sides),
plus one rounding of the residual add.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import test_cpu_hostile_plans as hostile  # noqa: E402
import test_cpu_small_matmul as small  # noqa: E402

pytestmark = hostile.pytestmark
capability = hostile.capability
DECODE = "decode-shaped (own kernel)"

SHAPES = [(1, 300, 257), (2, 256, 300), (3, 100, 700), (4, 513, 130), (5, 129, 600),
          (8, 300, 1000), (7, 64, 1025)]


@pytest.mark.parametrize("m,k,n", SHAPES, ids=[f"{m}x{k}x{n}" for m, k, n in SHAPES])
@pytest.mark.parametrize("post", ["none", "relu6", "relu, gelu, clip"])
def test_decode_shaped_matmuls_match_float64(m, k, n, post, capability):
    described = small._check(m, k, n, post=post, transposed=(m + n) % 2 == 0,
                             bias=("column", "one", None)[(k + n) % 3])
    assert (DECODE in str(described)) == (capability == "native" and "avx512f" in hostile.cpu_flags())


def _residual(m, k, n, threads):
    p, w, bias = small._plan(m, k, n, transposed=True, bias="column", post="none")
    other = p.tensor(hostile.F32, [m, n], role="input")
    p.ops[-1]["post"] = [[0, small.RELU, 0.0, 0.0, -1], [1, hostile.B_ADD, 0.0, 0.0, other]]
    rng = np.random.default_rng(k)
    x = rng.standard_normal((m, k)).astype(np.float32)
    r = rng.standard_normal((m, n)).astype(np.float32)
    handle = p.handle(threads=threads)
    got = hostile.run(handle, x, r)[0]
    exact = np.maximum(x.astype(np.float64) @ w + bias, 0) + r
    size = np.abs(x).astype(np.float64) @ np.abs(w) + np.abs(bias)
    tol = 2 * (k + 2) * 2.0**-24 * size + 2.0**-24 * np.abs(exact)
    assert (np.abs(got - exact) <= tol).all()
    return str(handle.describe())


@pytest.mark.parametrize("threads", [1, 2])
def test_a_residual_add_runs_after_the_kernel(threads, capability):
    described = _residual(3, 200, 333, threads)
    assert (DECODE in described) == (capability == "native" and "avx512f" in hostile.cpu_flags())


def test_decode_matmul_switch(monkeypatch):
    monkeypatch.delenv("OPFORGE_CPU_CAPABILITY", raising=False)
    if "avx512f" not in hostile.cpu_flags():
        pytest.skip("the kernel needs AVX-512")
    assert DECODE in str(small._check(1, 768, 256))
    assert DECODE not in str(small._check(9, 768, 256))   # more than 8 rows: oneDNN
    monkeypatch.setenv("OPFORGE_CPU_DECODE_MATMUL", "0")
    assert DECODE not in str(small._check(1, 768, 256))


@pytest.mark.parametrize("threads", [1, 2])
def test_a_binary_operand_of_the_kernel_keeps_its_bytes(threads, capability):
    """A SwiGLU MLP on one row, exported for the portable kernel set: the `up` matmul takes
    `silu(gate(x)) *` as a binary post-op, which this kernel runs in place after writing
    its output. The memory plan must keep the operand (gate's output) live through that op:
    when it did not, up's output took gate's bytes and the product was up·up (a decoder's
    decode step 2-600× off eager). Checked against float64."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    from cpu_reference import check_against_float64, spread
    from opforge.backends.cpu import blob
    from opforge.export import export
    from opforge.runtime import load

    class SwiGLU(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate = nn.Linear(192, 512, bias=False)  # 98,304 weights: decode-shaped
            self.up = nn.Linear(192, 512, bias=False)
            self.down = nn.Linear(512, 192, bias=False)

        def forward(self, x):
            return self.down(F.silu(self.gate(x)) * self.up(x))

    model = spread(SwiGLU())
    x = torch.randn(1, 192, generator=torch.Generator().manual_seed(0))
    plans = []
    encode = blob.encode
    with pytest.MonkeyPatch().context() as mp:
        mp.setattr(blob, "encode", lambda plan, *named: (plans.append(plan), encode(plan, *named))[1])
        program = export(model, (x,), kernels="portable", backends=["cpu"],
                         compile_specs={"num_threads": threads})
    (plan,) = plans
    # the case under test: a matmul carrying the binary post-op (not a separate binary op)
    assert [op["kind"] for op in plan.ops] == ["matmul"] * 3, [op["kind"] for op in plan.ops]
    assert any(p[0] == 1 for op in plan.ops for p in op["post"])
    got = load(program).method("forward")(x.numpy())
    check_against_float64(model, (x,), got)


def _anon_huge_kb() -> int:
    with open("/proc/self/smaps_rollup") as f:
        return next((int(line.split()[1]) for line in f if line.startswith("AnonHugePages:")), 0)


def test_a_large_weight_copy_sits_in_huge_pages():
    """A constant's copy from 2 MB up is a mapping of its own aligned to 2 MB, advised into
    transparent huge pages (constants.cpp): a decode step streams every weight once, and on
    4 KB pages each one is a TLB miss (a 768x768 weight read 17-19 GB/s, 28 on 2 MB pages,
    AMD EPYC Zen 4). Checked where Linux gives huge pages on advice only (THP mode
    `madvise`; under `always` every allocation gets them, under `never` none): while the
    engine holds its 12 MB copy (5 whole 2 MB pages) the process's anonymous huge pages grow
    by at least 2 of them (not all 5: the kernel may find too few free 2 MB frames, and the
    advice is a hint); and the product read through it matches float64."""
    mode = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if not mode.exists() or "[madvise]" not in mode.read_text():
        pytest.skip("transparent huge pages on advice are not this machine's mode")
    m, k, n = 1, 768, 4096
    p, w, _ = small._plan(m, k, n, transposed=False, bias=None, post="none")
    before = _anon_huge_kb()
    handle = p.handle()
    grown = _anon_huge_kb() - before
    x = np.random.default_rng(5).standard_normal((m, k)).astype(np.float32)
    got = hostile.run(handle, x)[0]
    exact = x.astype(np.float64) @ w
    tol = 2 * (k + 2) * 2.0**-24 * (np.abs(x).astype(np.float64) @ np.abs(w))  # as above
    assert (np.abs(got - exact) <= tol).all()
    assert grown >= 2 * 2048, f"{grown} kB of huge pages for a 12 MB weight's copy"


def test_a_programs_smaller_weights_share_huge_pages():
    """A weight the program's weight cache shares, from 64 KB to 2 MB (a decoder's K and V
    projections: 786 KB at dim 768), is a piece of the cache's 32 MB slab, advised into huge
    pages like the larger ones (constants.cpp; 21 → 30 GB/s in the kernel's order on an AMD
    EPYC). Twelve 512 KB linear weights (6 MB: 3 whole 2 MB pages of a slab) loaded from a
    program: the process's anonymous huge pages grow by at least 2 MB while it is held (on
    oneDNN's own allocation they stay 4 KB pages under THP mode `madvise`), and one row
    through them matches float64."""
    import torch
    import torch.nn as nn

    from cpu_reference import check_against_float64, spread
    from opforge.export import export
    from opforge.runtime import load

    mode = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if not mode.exists() or "[madvise]" not in mode.read_text():
        pytest.skip("transparent huge pages on advice are not this machine's mode")
    model = spread(nn.Sequential(*[nn.Linear(256, 512, bias=False) if i % 2 == 0 else
                                   nn.Linear(512, 256, bias=False) for i in range(12)]))
    x = torch.randn(1, 256, generator=torch.Generator().manual_seed(0))
    program = export(model, (x,), backends=["cpu"])
    before = _anon_huge_kb()
    loaded = load(program)
    got = loaded.method("forward")(x.numpy())
    grown = _anon_huge_kb() - before
    check_against_float64(model, (x,), got)
    assert grown >= 2048, f"{grown} kB of huge pages for 6 MB of 512 KB weights"
