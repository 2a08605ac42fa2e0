"""The binders' shared tools in ``opforge/kernels/portable/_binding.py``, unit by unit:
``read_only``, ``separate``, ``constant_operand``, ``ufunc_step`` and the thread
chunking of ``steps``. NumPy only.

Kernel tests reach these through whole binders, where a wrong answer often only picks the
general kernel (the same values, slower) or happens not to matter for that kernel (a
missed alias between two outs); mutants of them survived. Here each answer is pinned.
"""

from __future__ import annotations

import numpy as np
import pytest

from opforge.kernels.portable import _binding
from opforge.kernels.portable._binding import (
    constant_operand, read_only, separate, steps, ufunc_step,
)


def frozen(a):
    a = np.array(a)
    a.flags.writeable = False
    return a


def test_read_only():
    assert read_only() and read_only(None) and read_only(frozen([1.0]), None)
    assert not read_only(np.ones(2))
    assert not read_only(frozen([1.0]), np.ones(2))
    assert not read_only(np.ones(2), frozen([1.0]))
    assert not read_only(3.0)  # a Python scalar is a value, not a constant array
    view = np.ones((2, 2)).view(np.matrix)
    view.flags.writeable = False
    assert not read_only(view)  # only plain ndarrays


def test_separate():
    x, out = np.ones(8), np.empty(8)
    assert separate([out], x, 2.0, None)
    assert not separate([x], x)
    assert not separate([x[::2]], x)
    base = np.empty(8)
    assert not separate([base[:4], base[2:6]], x)  # two outs overlapping each other
    assert not separate([base[:4], np.empty(2), base[3:5]], x)  # first and last overlap
    assert separate([base[:4], base[4:]], x)
    assert separate([], x)


def test_constant_operand_is_shared_and_grows():
    a = constant_operand(0.5, np.dtype(np.float32), (4,))
    b = constant_operand(0.5, np.dtype(np.float32), (4,))
    assert np.shares_memory(a, b) and not a.flags.writeable
    np.testing.assert_array_equal(a, np.full(4, 0.5, np.float32))
    c = constant_operand(0.5, np.dtype(np.float32), (3, 5))  # larger: a new buffer
    np.testing.assert_array_equal(c, np.full((3, 5), 0.5, np.float32))
    assert np.shares_memory(c, constant_operand(0.5, np.dtype(np.float32), (2,)))
    assert constant_operand(0.5, np.dtype(np.float32), (0, 3)).shape == (0, 3)
    assert np.signbit(constant_operand(-0.0, np.dtype(np.float32), (2,))).all()


# --- ufunc_step -------------------------------------------------------------------------------

F32, F64 = np.dtype(np.float32), np.dtype(np.float64)


def test_ufunc_step_is_the_bare_ufunc_when_the_dtypes_already_agree():
    a, b, out = np.ones(3, F32), np.ones(3, F32), np.empty(3, F32)
    assert ufunc_step(np.add, a, b, out) == (np.add, (a, b, out))
    assert ufunc_step(np.add, a, b, out, dtype=F32) == (np.add, (a, b, out))
    assert ufunc_step(np.add, a, 2.0, out, dtype=F32) == (np.add, (a, 2.0, out))  # scalar


@pytest.mark.parametrize("a_dtype, out_dtype", [(np.int32, np.float32), (np.float32, np.float64)])
def test_ufunc_step_computes_in_the_asked_dtype(a_dtype, out_dtype):
    a = np.array([1, 2, 3], a_dtype)
    b = np.full(3, 1.5, np.float32)
    out = np.empty(3, out_dtype)
    fn, args = ufunc_step(np.maximum, a, b, out, dtype=np.dtype(out_dtype))
    assert fn is not np.maximum
    fn(*args)
    np.testing.assert_array_equal(out, [1.5, 2.0, 3.0])


def test_ufunc_step_reads_the_out_dtype_from_the_last_argument():
    # b already has the compute dtype, out does not: the step still needs the dtype.
    a, b, out = np.ones(3, F64), np.ones(3, F64), np.empty(3, F32)
    fn, _ = ufunc_step(np.add, a, b, out, dtype=F64)
    assert fn is not np.add


# --- steps: one pair, and the thread chunks ---------------------------------------------------

def test_one_step_is_returned_as_it_is():
    a, out = np.ones(4), np.empty(4)
    assert steps([(np.negative, (a, out))]) == (np.negative, (a, out))


@pytest.fixture
def threads(monkeypatch):
    monkeypatch.setattr(_binding, "NUM_THREADS", 3)
    monkeypatch.setattr(_binding, "PARALLEL_MIN", 1000)


def _chunks(fn, args):
    return args[0] if "chunks" in repr(fn) else None


@pytest.mark.parametrize("shape", [(3 * 4096,), (3, 4096), (6, 2048)], ids=str)
def test_elementwise_steps_split_into_one_chunk_per_thread(threads, shape):
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(shape), rng.standard_normal(shape)
    out = np.empty(shape)
    fn, args = steps([(np.add, (a, b, out)), (np.multiply, (out, a, out))], out)
    chunks = _chunks(fn, args)
    assert chunks is not None and len(chunks) == 3
    fn(*args)
    np.testing.assert_array_equal(out, (a + b) * a)


def test_two_threads_split_too(threads, monkeypatch):
    monkeypatch.setattr(_binding, "NUM_THREADS", 2)
    a, out = np.ones(8192), np.empty(8192)
    fn, args = steps([(np.negative, (a, out))], out)
    assert len(_chunks(fn, args)) == 2
    fn(*args)
    assert (out == -1).all()


def test_one_thread_never_splits(threads, monkeypatch):
    monkeypatch.setattr(_binding, "NUM_THREADS", 1)
    a, out = np.ones(8192), np.empty(8192)
    assert steps([(np.negative, (a, out))], out) == (np.negative, (a, out))


@pytest.mark.parametrize("make", [lambda: np.ones((4096, 3)).T, lambda: np.ones((64, 96))[:, ::2]],
                         ids=["transposed", "strided"])
def test_non_contiguous_operands_are_not_split(threads, make):
    a = make()
    out = np.empty(a.shape)
    fn, args = steps([(np.negative, (a, out))], out)
    assert _chunks(fn, args) is None
    fn(*args)
    assert (out == -1).all()


def test_ufunc_step_checks_every_operand():
    # the second operand alone has another dtype: the step must still compute in float32
    # (bare, NumPy would promote float32 with int64 to float64)
    a, b, out = np.ones(3, F32), np.array([2**40, 1, 2], np.int64), np.empty(3, F32)
    fn, args = ufunc_step(np.add, a, b, out, dtype=F32)
    assert fn is not np.add
    fn(*args)
    np.testing.assert_array_equal(out, np.add(a, b.astype(F32)))
    fn, _ = ufunc_step(np.add, a, a, b, out, dtype=F32)  # a three-operand form, b in the middle
    assert fn is not np.add
