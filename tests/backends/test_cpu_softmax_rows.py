"""The engine's softmax row kernel (native/softmax.cpp: AVX-512F, over an axis of stride 1)
and the oneDNN path it replaces (``OPFORGE_CPU_CAPABILITY=default``, what a CPU without
AVX-512 runs), each against float64 torch on the same plans.

Row lengths cover the kernel's 16-lane body and every tail (1, 5, 15, 16, 17, 31, 128,
1000); scores are wide (σ = 30: many exp underflow) or narrow, with masked (-inf)
entries, and rows holding NaN, +inf or only -inf, which go to the exact loop. Each element
must be within (2e-6 + 1.2e-7 |x - max|) of its float64 value relative to it, plus 2e-38
absolute. Why: float32 gives 1-2 ulps per exp plus the sum's rounding (at most 1.3e-6
measured on 1000-long rows), x - max rounds to half an ulp of itself (exp's relative
error grows by |x - max| 2^-24), and exp below float32's smallest normal is 0 (at most
1.2e-38 lost against a sum >= 1). A wrong tail mask or max gives O(1) errors, a wrong
polynomial term 1e-4 or more. NaN and the exact zeros of masked entries match torch's.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import test_cpu_hostile_plans as hostile  # noqa: E402

pytestmark = hostile.pytestmark


def _has_avx512f() -> bool:
    try:
        return " avx512f " in Path("/proc/cpuinfo").read_text().replace("\n", " ")
    except OSError:
        return False


capability = hostile.capability  # the engine's own kernels, then oneDNN's paths


def _softmax(a: np.ndarray, axis: int, safe: bool, strides=None):
    """Softmax of ``a`` over ``axis`` in an engine plan, source and destination laid out
    with ``strides`` (elements, over buffers as large as their reach; row-major if None):
    (result, op names)."""
    p = hostile.Plan()
    if strides is None:
        x = p.tensor(hostile.F32, list(a.shape), role="input")
        y = p.tensor(hostile.F32, list(a.shape), role="output")
        p.op("softmax", [x], [y], [axis, 0, int(safe)])
        handle = p.handle()
        return hostile.run(handle, a)[0], handle.describe()
    reach = 1 + sum((d - 1) * s for d, s in zip(a.shape, strides))
    flat = np.full(reach, 7.0, np.float32)  # gaps hold numbers the op must not read

    def view(buffer):
        return np.lib.stride_tricks.as_strided(buffer, a.shape, [s * 4 for s in strides])

    view(flat)[...] = a
    x = p.alias(p.tensor(hostile.F32, [reach], role="input"), list(a.shape), list(strides))
    y = p.alias(p.tensor(hostile.F32, [reach], role="output"), list(a.shape), list(strides))
    p.op("softmax", [x], [y], [axis, 0, int(safe)])
    handle = p.handle()
    return np.array(view(hostile.run(handle, flat)[0])), handle.describe()


def _scores(shape, axis, sigma, seed):
    rng = np.random.default_rng(seed)
    a = (rng.standard_normal(shape) * sigma).astype(np.float32)
    a[rng.random(shape) < 0.3] = -np.inf
    rows = np.moveaxis(a, axis, -1)  # a view: writes land in a
    rows[..., 0] = rng.standard_normal(rows.shape[:-1]).astype(np.float32)  # a finite max
    if rows.shape[:-1] and np.prod(rows.shape[:-1]) >= 4:
        idx = np.unravel_index(np.arange(4), rows.shape[:-1])
        rows[tuple(i[0] for i in idx)] = -np.inf                 # only -inf
        rows[tuple(i[1] for i in idx) + (rows.shape[-1] // 2,)] = np.nan
        rows[tuple(i[2] for i in idx) + (rows.shape[-1] - 1,)] = np.inf
    return a


def _check(got, a, axis, safe):
    t = torch.from_numpy(a).double()
    ref = torch.softmax(t, axis)
    if safe:
        ref = torch.where(torch.isneginf(t).all(axis, keepdim=True), torch.zeros_like(ref), ref)
    ref = ref.numpy()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    assert (got[ref == 0] == 0).all()  # masked entries and safe rows: exactly 0
    ok = np.isfinite(ref)
    err = np.abs(got[ok].astype(np.float64) - ref[ok])
    # x - max in float32 is off by up to half an ulp of it: exp's relative error grows by
    # |x - max| * 2**-24 (3.6e-6 at x - max = -60, which the wide scores reach)
    with np.errstate(invalid="ignore"):
        t = np.abs((t - t.amax(axis, keepdim=True)).numpy()[ok])
    t[~np.isfinite(t)] = 0  # masked entries: 0 in both, checked above
    bound = (2e-6 + 1.2e-7 * t) * ref[ok] + 2e-38
    worst = np.argmax(err - bound)
    assert (err <= bound).all(), (got[ok][worst], ref[ok][worst])


@pytest.mark.parametrize("n", [1, 5, 15, 16, 17, 31, 128, 1000])
@pytest.mark.parametrize("sigma", [1.0, 30.0])
@pytest.mark.parametrize("safe", [False, True])
def test_rows_match_float64(capability, n, sigma, safe):
    a = _scores((3, 5, n), 2, sigma, seed=n)
    got, names = _softmax(a, 2, safe)
    _check(got, a, 2, safe)
    kernel = capability == "native" and _has_avx512f()
    assert names == [("safe softmax" if safe else "softmax") + (" (row kernel)" if kernel else "")]


@pytest.mark.parametrize("case", ["axis_first_transposed", "gapped_rows", "axis_strided"])
def test_layouts(capability, case):
    """An axis of stride 1 that is not the last dim, rows with gaps between them (the row
    kernel's offsets), and an axis that is not of stride 1 (oneDNN's path on every CPU)."""
    if case == "axis_first_transposed":  # dims [n, 6], strides [1, n]: softmax over dim 0
        a = _scores((6, 40), 1, 10.0, seed=1).T
        got, names = _softmax(a, 0, False, strides=[1, 40])
        axis = 0
    elif case == "gapped_rows":  # [4, 3, 33] rows, 40 apart: 7 unused floats after each
        a = _scores((4, 3, 33), 2, 10.0, seed=2)
        got, names = _softmax(a, 2, True, strides=[3 * 40, 40, 1])
        axis = 2
    else:  # softmax over the middle dim: stride 33
        a = _scores((4, 19, 33), 1, 10.0, seed=3)
        got, names = _softmax(a, 1, False)
        axis = 1
    _check(got, a, axis, safe=case == "gapped_rows")
    kernel = capability == "native" and _has_avx512f() and case != "axis_strided"
    assert names[0].endswith(" (row kernel)") == kernel


def test_two_threads_give_the_one_thread_rows(monkeypatch):
    """Rows split between threads: each row is still one thread's, so the results are the
    same bits as one thread's."""
    monkeypatch.delenv("OPFORGE_CPU_CAPABILITY", raising=False)
    a = _scores((8, 64, 128), 2, 5.0, seed=4)
    outs = []
    for threads in (1, 2):
        p = hostile.Plan()
        x = p.tensor(hostile.F32, list(a.shape), role="input")
        y = p.tensor(hostile.F32, list(a.shape), role="output")
        p.op("softmax", [x], [y], [2, 0, 1])
        outs.append(hostile.run(p.handle(threads=threads), a)[0])
    np.testing.assert_array_equal(outs[0], outs[1])
    _check(outs[1], a, 2, safe=True)


def test_exp_within_two_ulps(monkeypatch):
    """Rows [0, t₁ … t₁₅] with every t in [-87, -20]: the sum rounds to exactly 1, so each
    output is the kernel's exp(t) itself, with no sum or subtraction rounding (t - 0 is
    exact). Against float64, at most 2 ulps of float32 (2.4e-7 relative): what a correct
    range reduction and polynomial give; a polynomial term off by 2e-4 of itself gives
    1.4e-6 and fails here, where the whole-row tests above cannot see it. (oneDNN's softmax
    is not held to this: 3.5e-7 at its 99.9th percentile here, and 0 at exp(-87).)"""
    if not _has_avx512f():
        pytest.skip("the row kernel needs AVX-512F; this CPU runs oneDNN's softmax")
    monkeypatch.delenv("OPFORGE_CPU_CAPABILITY", raising=False)
    t = np.linspace(-87.0, -20.0, 15 * 4000, dtype=np.float32).reshape(4000, 15)
    a = np.concatenate([np.zeros((4000, 1), np.float32), t], axis=1)
    got, _ = _softmax(a, 1, False)
    assert (got[:, 0] == 1).all()
    ref = np.exp(t.astype(np.float64))
    assert (np.abs(got[:, 1:] - ref) / ref).max() <= 2.4e-7


@pytest.mark.parametrize("n", [17, 20, 31, 33, 47, 1000])
@pytest.mark.parametrize("high", [40.0, 1e4])
def test_a_rows_max_in_its_tail_is_its_max(capability, n, high):
    """Rows longer than 16 whose max is in the tail (the lanes past the last whole 16), far
    above everything before it: the max pass must cover the tail too. (A row shorter than 16
    is all tail, so a max pass over whole 16s alone gives -inf there and the row goes to the
    exact loop: only longer rows can show it.) Softmax of such a row is ~1 at that element
    and ~exp(-high) elsewhere; with the body's max instead, exp(x - max) > 1 there."""
    rng = np.random.default_rng(n)
    rows = 6
    a = rng.standard_normal((rows, n)).astype(np.float32)
    full = n - n % 16
    at = [full + r % (n - full) for r in range(rows)]  # each tail position, the last too
    at[-1] = n - 1
    for r, j in enumerate(at):
        a[r, j] = np.float32(high + r)
    got, _ = _softmax(a, 1, False)
    for r, j in enumerate(at):
        assert got[r].argmax() == j and abs(float(got[r, j]) - 1.0) < 1e-5, (
            f"row {r} of {n}: its max {float(a[r, j])} at {j}, in the tail past lane {full}, "
            f"got softmax {float(got[r, j])} there (float64: ~1), the row's largest at "
            f"{int(got[r].argmax())}")
    _check(got, a, 1, safe=False)


@pytest.mark.parametrize("strided", ["source", "destination"])
def test_masked_rows_with_source_and_destination_of_different_strides(capability, strided):
    """Softmax over an axis of stride 1 on one side and 40 on the other (a transposed view):
    oneDNN's path on every CPU, each masked (-inf) element then set to exactly 0 by the exact
    loop, which must step through each side by its own stride."""
    a = _scores((40, 33), 1, 10.0, seed=5)
    a[a == np.inf] = 1.0  # masked rows and finite ones only: the masked-element fix-up
    a[np.isnan(a)] = 2.0
    a[0] = -np.inf
    a[0, 3] = 0.5
    rows, n = a.shape
    p = hostile.Plan()
    transposed = [1, rows]  # [rows, n] elements of a row-major [n, rows] buffer
    if strided == "source":
        x = p.alias(p.tensor(hostile.F32, [n, rows], role="input"), [rows, n], transposed)
        y = p.tensor(hostile.F32, [rows, n], role="output")
        feed = np.ascontiguousarray(a.T)
    else:
        x = p.tensor(hostile.F32, [rows, n], role="input")
        y = p.alias(p.tensor(hostile.F32, [n, rows], role="output"), [rows, n], transposed)
        feed = a
    p.op("softmax", [x], [y], [1, 0, 0])
    got = hostile.run(p.handle(), feed)[0]
    got = got.T if strided == "destination" else got
    masked = np.isneginf(a)
    assert (got[masked] == 0).all(), (
        f"masked elements not 0 with the {strided} strided: {got[masked][got[masked] != 0][:4]}")
    _check(np.ascontiguousarray(got), a, 1, safe=False)
