"""The cpu engine's attention op (native/attention.cpp) on hand-built plans, against float64.

All three implementations run every case: the one-pass AVX-512 kernel (attention_rows.cpp:
the G query heads of a KV head share each block of 16 slots, online softmax, a vector exp),
the one-pass AVX2 kernel (attention_rows_avx2.cpp: the same in 8-lane vectors; with
OPFORGE_CPU_ATTENTION_AVX512=0, so that an AVX-512 CPU runs it too) and the plain loops
(both switches 0). Each case checks the op's name says which one ran; on a CPU without
AVX-512 the "avx512" case runs the AVX2 kernel. Shapes cross the kernels' edges: head sizes
not a multiple of 8 or 16 and above 64 or 128 (segments), 1/15/16/17/33 slots (a block's
boundary), 1 to 4 query heads per KV head, prefill rows (each its own causal length), K/V
rows dense or strided, float32/float16/bfloat16 caches (the half values are exact in
float64), an additive float mask.

The tolerance is a first-order float32 error bound computed from the data (u = 2^-24):
each score's dot product errs by at most (D + 2) u sum_d |q_d k_d| / f (E: its max over the
row), which moves the softmax weights by a relative 2E; the exp (<= 2 u), the sum of the
weights and the value sums (n terms) add (2n + 10) u relative to sum_j w_j |v_j|; twice
that is allowed. A wrong slot count, KV head or exp gives errors of the order of the
values (and the slots after the last read hold NaN: reading one fails loudly)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from opforge.backends.cpu import engine as cpu_engine

pytestmark = pytest.mark.skipif(cpu_engine.missing() is not None,
                                reason=f"cpu backend: {cpu_engine.missing()}")

sys.path.insert(0, str(Path(__file__).resolve().parent))

import test_cpu_hostile_plans as hostile  # noqa: E402

F16, BF16 = 5, 15
U = 2.0 ** -24


SWITCHES = {"avx512": (None, None), "avx2": ("0", None), "loops": ("0", "0")}


@pytest.fixture(params=list(SWITCHES))
def path(request, monkeypatch):
    """Which implementation a plan built now takes (the switches are read at build): the
    op's name that says so, which _run checks."""
    monkeypatch.delenv("OPFORGE_CPU_CAPABILITY", raising=False)
    for env, value in zip(("OPFORGE_CPU_ATTENTION_AVX512", "OPFORGE_CPU_ATTENTION_AVX2"),
                          SWITCHES[request.param]):
        if value is None:
            monkeypatch.delenv(env, raising=False)
        else:
            monkeypatch.setenv(env, value)
    flags = hostile.cpu_flags()
    avx2 = {"avx2", "fma", "f16c"} <= flags
    if request.param == "avx512" and {"avx512f", "avx512bw", "avx512vl"} <= flags:
        return "attention (filled slots, AVX-512)"
    if request.param != "loops" and avx2:
        return "attention (filled slots, AVX2)"
    return "attention (filled slots)"


def _cache(rng, shape, dtype):
    """(the array the engine gets, its values in float64): float32, float16, or bfloat16 as
    raw bits (float32 values rounded toward zero to 8 significant bits: exact either way)."""
    x = rng.standard_normal(shape).astype(np.float32)
    if dtype == "float16":
        x = x.astype(np.float16)
        return x, x.astype(np.float64)
    if dtype == "bfloat16":
        bits = (x.view(np.uint32) >> 16).astype(np.uint16)
        return bits, (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return x, x.astype(np.float64)


def _reference(q, k, v, slots, factor, terms=None):
    """float64 attention of each query row over its first slots[i] slots, and the error bound
    (module docstring) for each output element."""
    H, M, D = q.shape
    group = H // k.shape[0]
    want, bound = np.zeros_like(q), np.zeros_like(q)
    for h in range(H):
        kv = h // group
        for i in range(M):
            n = slots[i]
            kr, vr = k[kv, :n], v[kv, :n]
            s = kr @ q[h, i] / factor
            if terms is not None:
                s = s + terms[i, :n]
            w = np.exp(s - s.max())
            w /= w.sum()
            want[h, i] = w @ vr
            err = (D + 2) * U * (np.abs(kr) @ np.abs(q[h, i])).max() / factor
            bound[h, i] = 2 * (2 * err + (2 * n + 10) * U) * (w @ np.abs(vr)) + 1e-30
    return want, bound


def _run(q, k, v, pos_or_mask, factor, name, *, source=0, pad=0, threads=1):
    """The op on a plan of its own: q f32 [H, M, D], k, v [Hkv, S, D] (their rows `pad`
    elements apart beyond D: an alias of a wider input), positions i64 [M] or a mask; the
    op's name must be `name` (the implementation the fixture `path` expects)."""
    H, M, D = q.shape
    Hkv, S = k.shape[:2]
    code = {np.float32: hostile.F32, np.float16: F16, np.uint16: BF16}[k.dtype.type]
    p = hostile.Plan()
    tq = p.tensor(hostile.F32, (H, M, D), role="input")
    kv = []
    for _ in range(2):
        wide = p.tensor(code, (Hkv, S, D + pad), role="input")
        kv.append(p.alias(wide, (Hkv, S, D), (S * (D + pad), D + pad, 1)) if pad else wide)
    tp = p.tensor(hostile.I64 if source == 0 else hostile.F32,
                  (M,) if source == 0 else (M, S), role="input")
    out = p.tensor(hostile.F32, (H, M, D), role="output")
    p.op("attention", [tq, *kv, tp], [out], ia=[0, 0, 1, source], fa=[factor])

    def widen(a):
        return np.concatenate([a, np.zeros((Hkv, S, pad), a.dtype)], axis=2) if pad else a

    handle = p.handle(threads)
    assert handle.describe() == [name]
    return hostile.run(handle, q, widen(k), widen(v), pos_or_mask)[0]


def _check(got, want, bound):
    err = np.abs(got.astype(np.float64) - want)
    worst = np.unravel_index(np.argmax(err / bound), err.shape)
    assert np.all(err <= bound), \
        f"error {err[worst]:.3g} at {worst}, allowed {bound[worst]:.3g} (want {want[worst]:.6g})"


# (heads, kv_heads, head size, query rows' slot counts): GQA 1-4 heads per KV head, head
# sizes 1, 5, 17, 64, 80, 144 (past one 128-float segment), slot counts at a block's edges
CASES = [(1, 1, 1, [1]), (4, 4, 5, [15]), (6, 2, 17, [16]), (12, 4, 64, [17]),
         (8, 2, 80, [33]), (4, 1, 144, [16]), (12, 4, 64, [1]), (3, 3, 16, [40]),
         (4, 2, 64, [12, 13, 14, 15, 16, 17]),  # prefill rows: each its causal length
         (8, 2, 32, [1, 16, 17, 31, 32, 33])]


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}h{c[1]}kv{c[2]}d{c[3][-1]}n")
def test_attention_against_float64(case, dtype, path):
    H, Hkv, D, slots = case
    M, S = len(slots), max(slots) + 3
    rng = np.random.default_rng(H * 1000 + D + len(slots))
    q = rng.standard_normal((H, M, D)).astype(np.float32)
    k, k64 = _cache(rng, (Hkv, S, D), dtype)
    v, v64 = _cache(rng, (Hkv, S, D), dtype)
    last = max(slots)  # every slot from here on is never read: NaN
    nan = np.float16(np.nan) if dtype == "float16" else 0x7FC0 if dtype == "bfloat16" else np.nan
    k[:, last:], v[:, last:] = nan, nan
    factor = float(np.sqrt(D))
    want, bound = _reference(q.astype(np.float64), k64, v64, slots, factor)
    positions = np.array(slots, np.int64) - 1  # a row reads slots 0..position
    for pad in (0, 3):  # dense K/V rows, and rows 3 elements apart beyond D
        _check(_run(q, k, v, positions, factor, path, pad=pad), want, bound)


def test_attention_on_two_threads(path):
    """Enough multiply-adds for the op to split its (KV head, row) pairs over two threads
    (each with its own scratch): the same bound as on one."""
    H, Hkv, D, slots = 12, 4, 64, [300, 301, 17]
    rng = np.random.default_rng(11)
    q = rng.standard_normal((H, len(slots), D)).astype(np.float32)
    k, v = (rng.standard_normal((Hkv, 310, D)).astype(np.float32) for _ in range(2))
    want, bound = _reference(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64),
                             slots, 8.0)
    _check(_run(q, k, v, np.array(slots, np.int64) - 1, 8.0, path, threads=2), want, bound)


def test_attention_additive_mask(path):
    """A float mask read at run time: its terms added to the scores, -inf holes before the
    last attended slot, nothing read after it (NaN there)."""
    H, Hkv, D, S, M = 8, 2, 64, 40, 3
    rng = np.random.default_rng(5)
    q = rng.standard_normal((H, M, D)).astype(np.float32)
    k, v = (rng.standard_normal((Hkv, S, D)).astype(np.float32) for _ in range(2))
    mask = rng.uniform(-3, 0, (M, S)).astype(np.float32)
    slots = [5, 18, 33]
    for i, n in enumerate(slots):
        mask[i, n:] = -np.inf
        mask[i, [1, 3, 16]] = -np.inf  # holes (row 0's slot 1 and 3, the others' and slot 16)
    k[:, 33:], v[:, 33:] = np.nan, np.nan
    want, bound = _reference(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64),
                             slots, 8.0, terms=mask.astype(np.float64))
    _check(_run(q, k, v, mask, 8.0, path, source=3), want, bound)


def test_softmax_weights_read_through_identity_values(path):
    """Values v_j = e_j make the output the softmax weights themselves; scores s_j = k_j[0]
    (q = e_0, factor 1) from -80 to 0 rising, so the max moves on in every block (the online
    softmax's rescaling). The ratio of each weight to the last one's (exp(0) = 1) is
    exp(s_j) with the common sum divided out: within the exp's error (1.2e-7 measured, see
    vector_exp.h) plus two roundings and a rescale's exp: 10 u = 6e-7 relative allowed.
    A polynomial off by 1e-6 fails this."""
    n = 48
    scores = np.linspace(-80.0, 0.0, n).astype(np.float32)
    scores[20] = -0.5  # a max early, passed later
    q = np.zeros((1, 1, n), np.float32)
    q[0, 0, 0] = 1.0
    k = np.zeros((1, n, n), np.float32)
    k[0, :, 0] = scores
    v = np.eye(n, dtype=np.float32)[None]
    got = _run(q, k, v, np.array([n - 1], np.int64), 1.0, path)[0, 0].astype(np.float64)
    want = np.exp(scores.astype(np.float64))  # the last score is 0: its weight's ratio is 1
    ratio = got / got[-1]
    rel = np.abs(ratio - want) / want
    assert rel.max() <= 10 * U, f"weight ratio off by {rel.max():.3g} at slot {rel.argmax()}"


def test_exp_against_float64_on_many_points(path):
    """The exp of each path (vector_exp.h's 16- and 8-lane ones, the loops' scalar one) on
    65,536 arguments x in [-87.33654, 0] and below: row i attends to two slots, scores 0 and
    x_i (k_0 = 0, k_1 = e_0, q_i = (x_i, 0), factor 1: exact), values 2^64 e_0 and 2^64 e_1
    (exact products, and the outputs stay normal floats where e^x is near float32's
    smallest normal), so the output's ratio o_1 / o_0 is exp(x_i) with the row's sum divided
    out: within the exp's claimed 2^-23 plus the two divisions' roundings (2 u), 4 u in all.
    Below -87.33654 the weight is exactly 0 (at -inf too: test_attention_additive_mask). A polynomial coefficient off by a
    few ulps, or a 2^n off by one, fails this."""
    rng = np.random.default_rng(3)
    x = np.concatenate([np.linspace(-87.33654, 0.0, 32768, dtype=np.float32),
                        rng.uniform(-87.33654, 0.0, 32756).astype(np.float32),
                        np.float32([0.0, -0.0, -1e-30, -1e-7, -87.33654, -87.3365, -87.33655,
                                    -87.34, -88.0, -100.0, -1e30, -3e38])])
    M = len(x)
    q = np.zeros((1, M, 2), np.float32)
    q[0, :, 0] = x
    k = np.float32([[[0.0, 0.0], [1.0, 0.0]]])
    v = np.float32([[[2.0 ** 64, 0.0], [0.0, 2.0 ** 64]]])
    got = _run(q, k, v, np.ones(M, np.int64), 1.0, path)[0].astype(np.float64)
    below = x < np.float32(-87.33654)
    assert np.all(got[below, 1] == 0.0), x[below][got[below, 1] != 0.0]
    want = np.exp(x[~below].astype(np.float64))
    rel = np.abs(got[~below, 1] / got[~below, 0] - want) / want
    assert rel.max() <= 4 * U, f"exp off by {rel.max():.3g} at x = {x[~below][rel.argmax()]!r}"
