"""The portable ``aten::as_strided_copy.out`` kernel against ``torch.as_strided``.

The kernel's storage is its input's own elements in row-major order (see
``opforge/kernels/portable/view_copy.py``), which is what ATen reads for a contiguous
tensor owning its storage: every reference here is ``torch.as_strided`` of such a tensor
(``make_array``'s contiguous copy), whatever layout the NumPy input has. Copies are exact,
so every comparison is exact.

Arguments come from a program file, i.e. are hostile: each bad one must raise a
``KernelError`` before anything is read, unbound and at bind, and a reach exactly at the
input's last element is accepted while one element further is refused.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from kernel_check import KERNELS, check_kernel, make_array

from opforge.errors import KernelError

KEY = "aten::as_strided_copy.out"
DTYPES = (np.float32, np.float64, np.int64, np.bool_, np.int32, np.float16)

# (input shape, size, stride, storage_offset)
CASES = [
    ((1,), (1,), (1,), None),
    ((3, 3), (2, 2), (1, 2), 0),
    ((3, 3), (2, 2), (1, 2), 1),
    ((4, 5), (5, 4), (1, 5), None),  # the transpose
    ((16,), (2, 2, 2, 2), (1, 1, 1, 1), 0),  # overlapping
    ((16,), (2, 1, 1, 2), (1, 7, 7, 1), 0),  # size-1 dimensions with any stride
    ((12,), (4, 3), (2, 1), 3),  # overlapping sliding windows
    ((2, 3), (4, 3), (0, 1), 3),  # a zero stride: one row broadcast
    ((2, 3), (3, 4), (1, 0), 2),  # a zero stride on the last dimension
    ((5,), (2, 3), (0, 0), 4),  # every element the input's last
    ((), (), (), None),  # 0-d to 0-d
    ((2, 3), (), (), 5),  # 0-d result from the last element
    ((1, 8, 1, 1), (1, 8, 1, 1), (8, 1, 8, 8), None),  # adaptive_avg_pool2d's restride
    ((3, 8, 1, 1), (3, 8, 1, 1), (8, 1, 8, 8), 0),
    ((2, 3, 4), (3, 2, 2), (4, 12, 1), 1),
    ((2, 3), (0, 3), (1, 1), 100),  # empty results read nothing: any offset, as in ATen
    ((2, 3), (3, 0), (7, 9), None),
    ((0,), (0,), (1,), 0),
    ((0, 4), (2, 0, 3), (1, 1, 1), 0),
]


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "strided"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape, size, stride, offset", CASES)
def test_as_strided_copy_matches_torch(shape, size, stride, offset, dtype, layout):
    a, t = make_array(shape, dtype, layout, seed=len(shape) + sum(size))
    expected = torch.as_strided(t, size, stride, offset)
    check_kernel(KEY, expected, a, size, stride, offset, tols={})


def test_a_read_only_input_and_the_bound_fast_path():
    a, t = make_array((4, 6), np.float32)
    a.flags.writeable = False  # what a program constant looks like
    out = np.empty((3, 3), np.float32)
    fn, args = KERNELS[KEY].bind((a, (3, 3), (6, 2), 1, out))
    assert fn is np.copyto and args[0] is out  # a bound call is the bare copy
    fn(*args)
    np.testing.assert_array_equal(out, torch.as_strided(t, (3, 3), (6, 2), 1).numpy())


def test_a_non_contiguous_input_binds_the_general_kernel():
    a, t = make_array((4, 6), np.int64, "transposed")
    out = np.empty((2, 5), np.int64)
    fn, args = KERNELS[KEY].bind((a, (2, 5), (3, 4), 2, out))
    assert fn is KERNELS[KEY]  # no view of a copy is kept across calls
    a[...] = a * 3  # the next call reads the input's current values
    fn(*args)
    np.testing.assert_array_equal(out, torch.as_strided(t * 3, (2, 5), (3, 4), 2).numpy())


def _arena_view(count: int) -> tuple[np.ndarray, np.ndarray]:
    """A ``count``-element input in the middle of an arena whose other elements are -1."""
    arena = np.full(count + 64, -1.0, np.float32)
    view = arena[32:32 + count]
    view[...] = np.arange(count)
    return arena, view.reshape(2, count // 2)


def test_the_reach_limit_is_the_inputs_last_element_not_the_arena():
    _, x = _arena_view(12)  # elements 0..11; the arena goes on on both sides
    at_limit = [((2,), (1,), 10), ((3, 4), (4, 1), 0), ((2, 2), (10, 1), 0), ((1,), (1,), 11),
                ((4, 2), (3, 2), 0)]
    for size, stride, offset in at_limit:
        for bound in (False, True):
            out = np.empty(size, np.float32)
            expected = torch.as_strided(torch.arange(12.0), size, stride, offset).numpy()
            args = (x, size, stride, offset, out)
            if bound:
                fn, args = KERNELS[KEY].bind(args)
                fn(*args)
            else:
                KERNELS[KEY](*args)
            np.testing.assert_array_equal(out, expected)
    one_past = [((2,), (1,), 11), ((3, 4), (4, 1), 1), ((2, 2), (11, 1), 0), ((1,), (1,), 12),
                ((4, 2), (3, 3), 0), ((13,), (1,), None)]
    for size, stride, offset in one_past:
        with pytest.raises(RuntimeError):  # ATen refuses the same, one storage past
            torch.as_strided(torch.arange(12.0), size, stride, offset)
        _refused(x, size, stride, offset, np.empty(size, np.float32), "reach element")


def _refused(x, size, stride, offset, out, message):
    for call in (KERNELS[KEY], KERNELS[KEY].bind):
        args = (x, size, stride, offset, out)
        with pytest.raises(KernelError, match=message):
            call(*args) if call is KERNELS[KEY] else call(args)


BAD = [
    ((2,), (-1,), 0, (2,), "non-negative"),
    ((-1,), (1,), 0, (2,), "non-negative"),
    ((2,), (1,), -1, (2,), "non-negative"),
    ((2, 2), (1,), 0, (2, 2), "one stride per size"),
    ((2,), (1, 1), 0, (2,), "one stride per size"),
    ((2, 3), (3, 1), 0, (6,), "out has shape"),  # wrong rank
    ((2, 3), (3, 1), 0, (3, 2), "out has shape"),
    ((2,), (2**62,), 0, (2,), "reach element"),  # byte strides would overflow int64
    ((2**40, 2**40), (0, 0), 0, (2, 2), "out has shape"),
    ((2,), (1,), 2**63, (2,), "reach element"),
    ((2.0,), (1,), 0, (2,), "a list of integers"),
    ((2,), (True,), 0, (2,), "a list of integers"),
    (None, (1,), 0, (2,), "a list of integers"),
    ((2,), "1", 0, (2,), "a list of integers"),
    ((2,), (1,), 1.5, (2,), "an integer"),
]


@pytest.mark.parametrize("size, stride, offset, out_shape, message", BAD)
def test_bad_arguments_are_refused_before_any_read(size, stride, offset, out_shape, message):
    _, x = _arena_view(12)
    _refused(x, size, stride, offset, np.empty(out_shape, np.float32), message)


def test_an_empty_input_has_no_element_to_read():
    _refused(np.empty((0, 3), np.float32), (1,), (1,), 0, np.empty(1, np.float32),
             "reach element 0 of an input of 0 elements")


def test_a_huge_stride_on_a_size_one_dimension_is_accepted_like_aten():
    x = np.arange(6, dtype=np.int64)
    out = np.empty((1, 2), np.int64)
    KERNELS[KEY](x, (1, 2), (2**62, 1), 3, out)
    expected = torch.as_strided(torch.arange(6), (1, 2), (2**62, 1), 3)
    np.testing.assert_array_equal(out, expected.numpy())
