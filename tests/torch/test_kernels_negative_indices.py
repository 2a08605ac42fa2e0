"""Ops where ATen refuses a negative index (it does not count from the end there): the
portable kernels must refuse it too, not wrap around to the last rows (wrong numbers)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from opforge.errors import KernelError
from opforge.kernels.portable import portable_kernels

KERNELS = portable_kernels()

W = np.arange(15, dtype=np.float32).reshape(5, 3)


def _torch_refuses(fn) -> bool:
    try:
        fn()
    except (IndexError, RuntimeError):
        return True
    return False


CASES = {
    "aten::embedding.out": (
        lambda i: (W, i, -1, False, False, np.empty((i.size, 3), np.float32)),
        lambda i: torch.nn.functional.embedding(torch.from_numpy(i), torch.from_numpy(W))),
    "aten::index_select.out": (
        lambda i: (W, 0, i, np.empty((i.size, 3), np.float32)),
        lambda i: torch.index_select(torch.from_numpy(W), 0, torch.from_numpy(i))),
    "aten::gather.out": (
        lambda i: (W, 0, np.stack([i] * 3, 1), False, np.empty((i.size, 3), np.float32)),
        lambda i: torch.gather(torch.from_numpy(W), 0, torch.from_numpy(np.stack([i] * 3, 1)))),
    "aten::scatter.src_out": (
        lambda i: (W, 0, np.stack([i] * 3, 1), np.ones((i.size, 3), np.float32),
                   np.empty_like(W)),
        lambda i: torch.from_numpy(W).scatter(0, torch.from_numpy(np.stack([i] * 3, 1)),
                                              torch.ones(i.size, 3))),
}


@pytest.mark.parametrize("key", sorted(CASES))
@pytest.mark.parametrize("bad", [-1, -5, 5])
def test_out_of_range_and_negative_indices_are_refused_as_in_aten(key, bad):
    args, reference = CASES[key]
    index = np.array([0, bad, 2], np.int64)
    assert _torch_refuses(lambda: reference(index))  # ATen's own behaviour, checked here
    with pytest.raises(KernelError, match=r"valid: \[0, 4\]"):
        KERNELS[key](*args(index))


@pytest.mark.parametrize("key", sorted(CASES))
def test_valid_indices_match_aten(key):
    args, reference = CASES[key]
    index = np.array([4, 0, 2], np.int64)
    call = args(index)
    KERNELS[key](*call)
    np.testing.assert_array_equal(call[-1], reference(index).numpy())
