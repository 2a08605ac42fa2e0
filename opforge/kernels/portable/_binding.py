"""Bind-time specialisation of the portable kernels: the protocol and its shared tools.

# Design
#
# The executor binds each instruction once at load (``opforge/runtime/method.py``): when a
# kernel has a ``bind`` attribute, ``kernel.bind(args)`` returns the ``(callable, args)``
# pair that runs on every call. A binder decides once what depends only on the arguments'
# dtypes, shapes and scalar values, and on the *values of read-only tensors* (program
# constants: arena tensors are writable, constants are not): the compute dtype, the ufunc,
# scalars as 0-d arrays of the compute dtype, folded constants (batch norm's scale and
# shift), views (a transposed weight, the sliding windows of a padded buffer). Scratch
# buffers are allocated by the binder, i.e. per bound instruction and so per ``Method``
# instance: two instances never share one, and a call allocates nothing.
#
# A binder returns ``(kernel, args)`` — the general kernel, unchanged — when no fast path
# applies (odd dtypes, aliasing outputs, shapes it does not specialise). Every fast path
# computes what the general kernel computes; ``tests/torch/test_kernels_*.py`` run both.
#
# Steps. Most fast paths are a short list of ufunc calls writing into preallocated arrays.
# ``steps()`` turns such a list into the cheapest pair: the ufunc itself when there is one
# step (``(np.add, (a, b, out))`` costs what ``np.add`` costs), else one closure call.
# Arrays are passed positionally (``out`` included) so that a step list can be sliced.
#
# Shape-generic binders. A dynamic method binds each instruction once per input shape
# (``opforge/runtime/rebinding.py``). A binder marked ``shape_generic`` promises: for
# arguments that differ from ones it bound only in the sizes of their tensors (same
# dtypes, same ranks, the same non-tensor values), it returns the same callable, and every
# bound argument is either one of the call's own arguments (the same one) or an object
# that does not depend on the sizes (a folded scalar, a dtype). Where its pair is one
# ufunc (or ``np.copyto``) call of that form, the runtime takes it as a template and
# rebinds the instruction at a new shape by substituting the new arguments, without
# calling the binder. With the elementwise threads on (``NUM_THREADS`` > 1) a pair
# depends on the output's size (``steps`` cuts large ones into chunks): no binder is
# shape-generic then.
#
# Prepared binders. A binder may also come with ``prepare`` (``@prepares(binder)``): the
# runtime calls ``binder.prepare(bound)`` once per instruction of a dynamic method, with
# its arguments at the method's upper bound (each tensor at its planned size), and gets
# ``rebind(args) -> (callable, args) | None`` or None. At every new shape it then calls
# ``rebind`` instead of the binder: the arguments differ from ``bound`` only in their
# tensors' sizes and in the values of symbolic ints and ``int[]``s (same dtypes, ranks and
# lengths), and each tensor starts where its upper-bound counterpart does and lies within
# it. So what ``prepare`` found about dtypes, ranks and memory (no output overlaps an
# input at the upper bound, hence at no size: ``separate``) holds at every shape;
# ``rebind`` does what depends on the sizes and values, and returns what the binder
# would, or None where they do not fit its steps (the runtime then calls the binder).
#
# Floating-point errors. The general kernels run inside ``np.errstate(all="ignore")``
# where ATen is silent about inf and nan; entering it costs 1-2 µs, more than a small add.
# Bound paths run under the caller's NumPy error state instead: where ATen silently
# produces inf or nan, NumPy may add a RuntimeWarning (the values are the same). Only step
# lists whose *ordinary* results come from an overflow (sigmoid's exp of large negative
# inputs) pass ``quiet=True`` and run inside ``np.errstate``.
#
# Threads (opt-in: OPFORGE_NUM_THREADS, see NUM_THREADS below). Ufuncs run on one core
# but release the GIL. A step list whose arrays are all C-contiguous with the output's
# shape (or 0-d), with an output of at least ``PARALLEL_MIN`` elements, is cut at bind
# into ``NUM_THREADS`` contiguous chunks (multiples of 4096 elements); a call runs the
# first chunk itself and the others on a shared pool, each chunk running every step on
# its slice. The chunks are fixed at bind: a call allocates nothing but the futures.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable, Sequence
from functools import partial

import numpy as np

__all__ = [
    "NUM_THREADS",
    "PARALLEL_MIN",
    "Step",
    "constant_operand",
    "fold_scalar",
    "prepares",
    "read_only",
    "separate",
    "shape_generic",
    "steps",
    "ufunc_step",
]

Step = tuple[Callable, tuple]


def _num_threads() -> int:
    value = os.environ.get("OPFORGE_NUM_THREADS", "").strip()
    if value.lower() == "auto":
        try:
            return max(1, min(len(os.sched_getaffinity(0)), 4))
        except AttributeError:  # not on Linux
            return max(1, min(os.cpu_count() or 1, 4))
    return int(value) if value.isdigit() and int(value) > 0 else 1


# Off unless OPFORGE_NUM_THREADS asks for it (a count, or "auto": the usable cores, at
# most 4). Measured on the 2-core benchmark machine, shared with other jobs: splitting a
# 1M-element tanh, exp or add over 2 threads gained nothing (2.78 vs 2.81 ms, 1.51 vs
# 1.54 ms, 131 vs 164 µs) because the second core was never free — the process got ~1.2
# cores even for GIL-free hashing. On a dedicated multi-core machine, try it.
NUM_THREADS = _num_threads()
# The smallest output worth splitting: below ~256K float32 elements (~100 µs of a
# memory-bound ufunc) handing a chunk to a thread costs more than it saves.
PARALLEL_MIN = int(os.environ.get("OPFORGE_PARALLEL_MIN", str(1 << 18)))
_CHUNK_ALIGN = 4096

_pool = None  # a concurrent.futures.ThreadPoolExecutor, made on first use
_pool_pid = -1
_pool_lock = threading.Lock()


def _get_pool():
    global _pool, _pool_pid
    if _pool_pid != os.getpid():  # none yet, or inherited through fork (threads are gone)
        # imported only when threads are asked for: the lean runtime's import stays small
        from concurrent.futures import ThreadPoolExecutor

        with _pool_lock:
            if _pool_pid != os.getpid():
                _pool = ThreadPoolExecutor(NUM_THREADS - 1, thread_name_prefix="opforge")
                _pool_pid = os.getpid()
    return _pool


def shape_generic(binder: Callable) -> Callable:
    """Mark ``binder`` shape-generic (see the design note above); unmarked with threads."""
    binder.shape_generic = NUM_THREADS < 2
    return binder


def prepares(binder: Callable) -> Callable[[Callable], Callable]:
    """Attach the decorated ``prepare(bound) -> rebind | None`` to ``binder`` (see the
    design note above)."""

    def attach(prepare: Callable) -> Callable:
        binder.prepare = prepare
        return prepare

    return attach


def read_only(*arrays) -> bool:
    """True when every array is None or read-only: a constant whose values may be folded."""
    return all(a is None or (type(a) is np.ndarray and not a.flags.writeable) for a in arrays)


def separate(outs: Sequence[np.ndarray], *inputs) -> bool:
    """True when no output shares memory with an input or another output: multi-step fast
    paths write an output before they finish reading the inputs."""
    arrays = [a for a in inputs if type(a) is np.ndarray]
    for i, out in enumerate(outs):
        for a in arrays + list(outs[i + 1:]):
            if np.may_share_memory(out, a):
                return False
    return True


def fold_scalar(value, dtype: np.dtype) -> np.ndarray:
    """A Python scalar as a 0-d array of ``dtype`` (wrapping like ATen); arrays unchanged."""
    if isinstance(value, np.ndarray):
        return value
    return np.asarray(value).astype(dtype)


# np.maximum / np.minimum against a 0-d operand run NumPy's generic broadcasting loop,
# 3-4x slower than the SIMD loop two same-shape operands get (NumPy 2.4, AVX2, float32:
# 1M elements 0.87 vs 0.28 ms, 4096 elements 3.4 vs 1.2 µs). Binders of relu and clamp
# therefore pass a full-shape, read-only view of one buffer per (dtype, value) shared by
# every bound instruction; zeros come from calloc, so their pages stay the kernel's shared
# zero page however large the buffer grows.
_constants: dict[tuple[str, bytes], np.ndarray] = {}
_constants_lock = threading.Lock()


def constant_operand(value, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """A read-only array of ``shape`` whose every element is ``value`` cast to ``dtype``
    (wrapping like ATen), viewing a buffer shared by every caller asking for that value."""
    fill = fold_scalar(value, dtype)
    key = (fill.dtype.str, fill.tobytes())
    size = math.prod(shape)
    with _constants_lock:
        buffer = _constants.get(key)
        if buffer is None or buffer.size < size:
            if key[1] == bytes(fill.nbytes):  # all bits zero (not -0.0)
                buffer = np.zeros(max(size, 1), fill.dtype)
            else:
                buffer = np.full(max(size, 1), fill, fill.dtype)
            buffer.flags.writeable = False
            _constants[key] = buffer
    return buffer[:size].reshape(shape)


def _maximum(a, b, out, **kwargs) -> None:
    np.maximum(a, b, out=out, **kwargs)


def _minimum(a, b, out, **kwargs) -> None:
    np.minimum(a, b, out=out, **kwargs)


# NumPy 2.4 deprecates a positional out for np.maximum / np.minimum (only): these take it
# positionally (so that step lists stay sliceable) and pass it by keyword.
_KEYWORD_OUT = {np.maximum: _maximum, np.minimum: _minimum}


def _run(pairs: tuple) -> None:
    for fn, args in pairs:
        fn(*args)


def _run_quiet(pairs: tuple) -> None:
    with np.errstate(all="ignore"):
        for fn, args in pairs:
            fn(*args)


def _run_chunks(runner: Callable, chunks: tuple) -> None:
    pool = _get_pool()
    futures = [pool.submit(runner, chunk) for chunk in chunks[1:]]
    try:
        runner(chunks[0])
    finally:
        for future in futures:
            future.result()


def _chunkable(pairs: Sequence[Step], out: np.ndarray) -> bool:
    if NUM_THREADS < 2 or out.size < PARALLEL_MIN:
        return False
    for _, args in pairs:
        for a in args:
            if type(a) is np.ndarray and a.ndim and (
                    a.shape != out.shape or not a.flags.c_contiguous):
                return False
    return True


def _slice(a, lo: int, hi: int):
    return a.reshape(-1)[lo:hi] if type(a) is np.ndarray and a.ndim else a


def _chunks(pairs: Sequence[Step], size: int) -> tuple:
    per = -(-size // NUM_THREADS)
    per = -(-per // _CHUNK_ALIGN) * _CHUNK_ALIGN
    return tuple(
        tuple((fn, tuple(_slice(a, lo, min(lo + per, size)) for a in args)) for fn, args in pairs)
        for lo in range(0, size, per)
    )


def steps(pairs: Sequence[Step], out: np.ndarray | None = None, *,
          quiet: bool = False) -> Step:
    """The cheapest ``(callable, args)`` running ``pairs`` in order.

    ``out`` (the op's output) enables the threaded path when every array in ``pairs`` is
    elementwise with it; pass None for steps that reduce, gather or multiply matrices.
    """
    for fn, _ in pairs:
        if fn in _KEYWORD_OUT:
            pairs = tuple((_KEYWORD_OUT.get(fn, fn), args) for fn, args in pairs)
            break
    else:
        pairs = tuple(pairs)
    runner = _run_quiet if quiet else _run
    if out is not None and _chunkable(pairs, out):
        return partial(_run_chunks, runner), (_chunks(pairs, out.size),)
    if len(pairs) == 1 and not quiet:
        return pairs[0]
    return runner, (pairs,)


def ufunc_step(ufunc: np.ufunc, *args, dtype: np.dtype | None = None) -> Step:
    """One ufunc call ``ufunc(*args)`` (the last arg is out), computing in ``dtype`` and
    casting into out when the operands' dtypes alone would not give that."""
    out = args[-1]
    if dtype is None or (out.dtype == dtype and all(
            a.dtype == dtype for a in args[:-1] if type(a) is np.ndarray)):
        return ufunc, args
    return partial(_KEYWORD_OUT.get(ufunc, ufunc), dtype=dtype, casting="unsafe"), args
