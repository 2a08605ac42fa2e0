"""The engine's copy loops on walks its build simplifies (copy.cpp, CopyOp::collapse: size-1
dims dropped, dims merged where both walks run on contiguously) and its 8×8 transposes
(transpose32: a 4-byte dim contiguous on each side) and interleaves (2-4 planes into
channels-last rows), against NumPy: the element pairs must
be the same whatever the merge makes of them. Walks under 4096 elements (larger ones may go
to oneDNN's reorder), float32, int32 and int8, with broadcast (stride 0), reversed
(negative stride, the offset at the far end) and transposed dims, tiles with every edge;
with the engine's own paths and without (OPFORGE_CPU_CAPABILITY=default)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import test_cpu_hostile_plans as hostile  # noqa: E402

pytestmark = hostile.pytestmark

WALKS = [  # (dims, in_strides, in_offset, out_strides) over an input of `reach` elements
    ([1, 32, 8, 8], [2048, 1, 256, 32], 0, None),        # channels-last to row-major
    ([1, 16, 8, 4], [512, 32, 4, 1], 0, None),           # row-major to row-major: one run
    ([4, 1, 6, 5], [30, 999, 5, 1], 0, None),            # a size-1 dim with any stride
    ([3, 4, 5], [0, 5, 1], 0, None),                     # broadcast outer dim
    ([3, 4, 5], [20, 0, 0], 0, None),                    # broadcast inner dims
    ([6, 7], [-7, -1], 41, None),                        # reversed, mergeable
    ([5, 6, 7], [1, 35, 5], 0, None),                    # a 3-d transpose
    ([2, 3, 4], [12, 4, 1], 0, [1, 8, 2]),               # scattered output
    # transposes of 4-byte elements with a dim contiguous on each side, >= 8 long: 8×8 tiles
    # (AVX2) and their edges
    ([1, 20, 9, 11], [1980, 1, 220, 20], 0, None),       # channels-last to row-major, tails
    ([2, 16, 8, 8], [1024, 64, 8, 1], 0, [1024, 1, 128, 16]),  # row-major to channels-last, a batch
    ([3, 8, 13], [104, 1, 8], 0, None),                  # one tile row, a 5-wide edge
    ([9, 8], [1, 9], 0, None),                           # a 1-deep edge in j
    ([8, 8], [1, 8], 0, [1, 8]),                         # a transpose onto a transpose: one run
    # 2-4 planes, each contiguous in the input, interleaved into channels-last rows
    # (interleave32, interleave8): vectors of 8 (4 bytes) or 16 (1 byte) pixels and the tails
    ([1, 3, 5, 7], [105, 35, 7, 1], 0, [105, 1, 21, 3]),  # an image to NHWC: 35 pixels
    ([1, 3, 16, 16], [768, 256, 16, 1], 0, [768, 1, 48, 3]),  # whole vectors only
    ([2, 4, 6, 6], [144, 36, 6, 1], 0, [144, 1, 24, 4]),  # a batch of 4-plane images
    ([2, 33], [40, 1], 0, [1, 2]),                        # 2 planes with a gap between them
    ([3, 20], [-20, 1], 40, [1, 3]),                      # planes in reverse order
    ([5, 20], [20, 1], 0, [1, 5]),                        # 5 planes: the loop
]


def _reach(dims, strides, offset):
    hi = offset + sum((d - 1) * s for d, s in zip(dims, strides) if s > 0)
    return hi + 1


capability = hostile.capability  # the engine's own kernels, then oneDNN's paths


@pytest.mark.parametrize("dtype", [hostile.F32, hostile.I32, hostile.I8])
@pytest.mark.parametrize("walk", WALKS, ids=[str(w[0]) for w in WALKS])
def test_a_copy_walk_copies_each_element_pair(walk, dtype, capability):
    _check_walk(walk, dtype)


def _check_walk(walk, dtype):
    dims, in_strides, in_off, out_strides = walk
    out_strides = out_strides or hostile.row_major(dims)
    n_in = _reach(dims, in_strides, in_off)
    n_out = _reach(dims, out_strides, 0)
    rng = np.random.default_rng(len(dims) + n_in)
    x = rng.integers(-100, 100, n_in).astype(hostile.NUMPY[dtype])
    p = hostile.Plan()
    xt = p.tensor(dtype, [n_in], role="input")
    yt = p.tensor(dtype, [n_out], role="output")
    p.op("copy", [xt], [yt], hostile.copy_ia(dims, in_strides, in_off, out_strides, 0))
    got = hostile.run(p.handle(), x)[0]
    want = np.zeros(n_out, x.dtype)
    for idx in np.ndindex(*dims):
        want[sum(i * s for i, s in zip(idx, out_strides))] = x[in_off + sum(i * s for i, s in zip(idx, in_strides))]
    np.testing.assert_array_equal(got, want)
    return "ran ok"


# --- cases for the sanitized run (test_cpu_sanitized.py): the transposes, the interleaves and
# their edges
FIRST_INTERLEAVE = 13  # WALKS[13:]: the interleaves, which also run on bytes
CASES, EXPECT = hostile.ran_ok_cases({
    **{f"walk_{k}": (lambda w=w: _check_walk(w, hostile.F32)) for k, w in enumerate(WALKS) if k >= 8},
    **{f"walk_{k}_i8": (lambda w=w: _check_walk(w, hostile.I8))
       for k, w in enumerate(WALKS) if k >= FIRST_INTERLEAVE}})
test_the_case_file_runs = hostile.case_file_test(__file__, CASES, EXPECT)


if __name__ == "__main__":
    hostile.report_cases(CASES, sys.argv[1:])
