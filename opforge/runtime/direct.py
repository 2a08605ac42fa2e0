"""Direct calls: a static method that is one delegate call runs it on the caller's arrays.

# Design
#
# A direct call: a static method whose one instruction is a delegate call taking exactly the
# method's inputs and writing exactly its outputs, when the backend can run a call on other
# arrays (the cpu backend), skips both copies for large tensors: the delegate reads the
# caller's arrays (C-contiguous, aligned, of the bound dtype and shape) and writes fresh
# output arrays, which are what the call returns (views=True too: they outlive the call).
# Below DIRECT_MIN_BYTES of inputs and outputs the copies cost less than binding pointers.
#
# A backend may offer the same direct call as a native object (``native_call``: the cpu
# backend's ``_fastcall`` extension) that checks the inputs and binds the pointers with no
# Python per argument, so it runs at every size; it hands anything it does not take (other
# layouts or dtypes, a busy instance) back to the Python path, which raises or copies.
#
# Both are decided once, when a ``Method`` instance is made (``direct_calls``); this module
# reads the instance's bound call, its input specs, locks and thread governor.
"""

from __future__ import annotations

import weakref

import numpy as np

from opforge.program import DelegateCall, Free, Method as MethodDef

__all__ = ["DIRECT_MIN_BYTES", "direct_calls", "call_direct"]

# a 1M-float elementwise chain on the cpu backend: its input and output copies were 200 of
# 580 µs a call; under ~64 KiB they cost less than the pointers' rebinding (~1 µs)
DIRECT_MIN_BYTES = 1 << 16
_ndarray = np.ndarray


def _calls_one_delegate(definition: MethodDef) -> bool:
    """The method is one delegate call on exactly its inputs and outputs."""
    steps = [x for x in definition.instructions if type(x) is not Free]
    if len(steps) != 1 or type(steps[0]) is not DelegateCall or definition.state:
        return False
    ins, outs = list(definition.inputs), list(definition.outputs)
    return list(steps[0].args) == ins + outs and len(set(ins + outs)) == len(ins) + len(outs)


def direct_calls(method, definition: MethodDef) -> tuple:
    """``(direct, native)`` for a static ``method`` (a ``Method`` with its calls bound):
    the Python direct call with its output specs (large tensors only), and the backend's
    native call object (any size; not where a thread governor must run around the call,
    nor where native code inside is named by the method's frame for a crash report). Each
    is None where it does not apply."""
    if method._fast_count < 0 or not _calls_one_delegate(definition):
        return None, None
    fn, args = method._bound[0]
    direct = getattr(fn, "direct", None)
    size = sum(int(np.prod(s.shape)) * np.dtype(s.dtype).itemsize
               for s in (*method.inputs, *method.outputs))
    python = None
    if direct is not None and size >= DIRECT_MIN_BYTES:
        python = direct, tuple((np.dtype(s.dtype), s.shape) for s in method.outputs)
    native = getattr(fn, "native_call", None)
    if native is None or method._threads is not None or getattr(fn, "crash_label", None) is not None:
        return python, None
    this = weakref.ref(method)  # the call object holds no reference cycle

    def error(e: Exception) -> Exception:
        owner = this()
        return e if owner is None else owner._kernel_error(fn, args, e)
    return python, native(method._busy, error)


def call_direct(method, inputs: tuple) -> tuple | None:
    """The Python direct call on the caller's arrays, or None when one does not qualify."""
    for a, (_, dtype, shape) in zip(inputs, method._fast_inputs):
        if type(a) is not _ndarray or (a.dtype is not dtype and a.dtype != dtype) \
                or a.shape != shape or not a.flags.c_contiguous or not a.flags.aligned:
            return None
    direct, specs = method._direct
    outputs = [np.empty(shape, dtype) for dtype, shape in specs]
    threads = method._threads
    saved = threads.enter() if threads is not None else None
    try:
        direct(list(inputs), outputs)
    except Exception as e:
        fn, args = method._bound[0]
        raise method._kernel_error(fn, args, e) from e
    finally:
        if saved:
            threads.exit(saved)
    return tuple(outputs)
