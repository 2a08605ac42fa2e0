"""The engine's quantize loop to 8 bits and to int32 storage (quantization.cpp: AVX-512
and, to 8 bits, SSE2 blocks of 16,
then the scalar tail) against its definition in NumPy: clamp(round_half_even(x · f32(1 /
scale)) + zp, qmin, qmax), NaN → qmin, element for element. Exact ties (scale 1/4: x · 4
lands on k + 0.5), values past the clamp and past 2^24, infinities and NaNs, at lengths
that leave every tail; with the engine's own kernels and without
(OPFORGE_CPU_CAPABILITY=default: the SSE2 blocks)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import test_cpu_hostile_plans as hostile  # noqa: E402

pytestmark = hostile.pytestmark
capability = hostile.capability

RANGES = {  # (dtype, qmin, qmax, zero point)
    "u8": (hostile.U8, 0, 255, 128.0),
    "i8": (hostile.I8, -128, 127, -3.0),
    "u4 in u8": (hostile.U8, 0, 15, 7.0),
    "u16 in i32": (hostile.I32, 0, 65535, 32238.0),  # a 16-bit scheme's storage (AVX-512 blocks)
}


def _want(x: np.ndarray, scale: float, qmin: int, qmax: int, zp: float, dtype) -> np.ndarray:
    with np.errstate(invalid="ignore", over="ignore"):
        v = np.clip(x * np.float32(1.0 / scale), np.float32(-2.0**24), np.float32(2.0**24))
        r = np.clip(np.rint(v) + np.float32(zp), qmin, qmax)
    r[np.isnan(x)] = qmin
    return r.astype(hostile.NUMPY[dtype])


def _inputs(n: int, scale: float) -> np.ndarray:
    rng = np.random.default_rng(n)
    x = (rng.standard_normal(n) * 40 * scale).astype(np.float32)
    ties = (rng.integers(-140, 140, n) + 0.5) * scale  # x · (1 / scale) is exactly k + 0.5
    x[::3] = ties[::3].astype(np.float32)
    specials = np.array([np.nan, np.inf, -np.inf, 1e30, -1e30, 3e7, -3e7, 0.0, -0.0], np.float32)
    x[5::11][: len(specials)] = specials[: len(x[5::11])]
    return x


LENGTHS = [16, 63, 81, 1000]


@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("rng_name", list(RANGES))
def test_quantize_matches_its_definition_element_for_element(rng_name, n, capability):
    _check(rng_name, n)


def _check(rng_name: str, n: int) -> str:
    dtype, qmin, qmax, zp = RANGES[rng_name]
    scale = 0.25
    x = _inputs(n, scale)
    p = hostile.Plan()
    xt = p.tensor(hostile.F32, [n], role="input")
    yt = p.tensor(dtype, [n], role="output")
    p.op("quant", [xt], [yt], [0, qmin, qmax], [scale, zp])
    got = hostile.run(p.handle(), x)[0]
    want = _want(x, scale, qmin, qmax, zp, dtype)
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, [(float(x[i]), int(got[i]), int(want[i])) for i in bad[:5]]
    return "ran ok"


@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("rng_name", list(RANGES))
def test_quantize_dequantize_is_the_two_steps(rng_name, n, capability):
    """Mode 2 (a dequantize of a quantize of the same parameters, the integer kept in
    registers): (q - zp) · scale in float32 of the q above, element for element."""
    dtype, qmin, qmax, zp = RANGES[rng_name]
    scale = 0.25
    x = _inputs(n, scale)
    p = hostile.Plan()
    xt = p.tensor(hostile.F32, [n], role="input")
    yt = p.tensor(hostile.F32, [n], role="output")
    p.op("quant", [xt], [yt], [2, qmin, qmax], [scale, zp])
    got = hostile.run(p.handle(), x)[0]
    q = _want(x, scale, qmin, qmax, zp, dtype)
    want = (q.astype(np.float32) - np.float32(zp)) * np.float32(scale)
    assert np.array_equal(got, want), np.flatnonzero(got != want)[:5]


# --- cases for the sanitized run (test_cpu_sanitized.py): every range at every length
CASES, EXPECT = hostile.ran_ok_cases({f"quantize_{r.replace(' ', '_')}_{n}": (lambda r=r, n=n: _check(r, n))
                                      for r in RANGES for n in LENGTHS})
test_the_case_file_runs = hostile.case_file_test(__file__, CASES, EXPECT)


if __name__ == "__main__":
    hostile.report_cases(CASES, sys.argv[1:])
