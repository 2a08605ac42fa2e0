"""The engine's copy loops on walks its build simplifies (copy.cpp, CopyOp::collapse: size-1
dims dropped, dims merged where both walks run on contiguously) against NumPy: the element
pairs must be the same whatever the merge makes of them. Walks under 4096 elements (the
loops; larger ones may go to oneDNN's reorder), float32 and int8, with broadcast (stride 0),
reversed (negative stride, the offset at the far end) and transposed dims."""

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
]


def _reach(dims, strides, offset):
    hi = offset + sum((d - 1) * s for d, s in zip(dims, strides) if s > 0)
    return hi + 1


@pytest.mark.parametrize("dtype", [hostile.F32, hostile.I8])
@pytest.mark.parametrize("walk", WALKS, ids=[str(w[0]) for w in WALKS])
def test_a_copy_walk_copies_each_element_pair(walk, dtype):
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
