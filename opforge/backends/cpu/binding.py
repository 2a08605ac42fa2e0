"""A cpu engine bound to a call's arrays: the ctypes call of ``ofc_execute``, its direct
form on other arrays (``Method``'s direct calls, runtime/direct.py) and, where the
``_fastcall`` extension is in use, the same call without Python per argument (fastcall.py).
"""

from __future__ import annotations

import ctypes

import numpy as np

from opforge.backends.cpu.engine import _ERR, NAMES, NUMPY, EngineHandle
from opforge.errors import BackendError

__all__ = ["Binding"]


class Binding:
    """A handle bound to fixed input/output arrays: one native call per execution."""

    def __init__(self, handle: EngineHandle, inputs, outputs) -> None:
        for kind, arrays, want in (("input", inputs, handle.inputs), ("output", outputs, handle.outputs)):
            if len(arrays) != len(want):
                raise BackendError(f"cpu backend: {len(arrays)} {kind}(s), the delegate has {len(want)}")
            for k, (a, (dims, dtype)) in enumerate(zip(arrays, want)):
                if not isinstance(a, np.ndarray) or tuple(a.shape) != dims or not a.flags.c_contiguous \
                        or a.dtype != NUMPY[dtype] or (kind == "output" and not a.flags.writeable):
                    raise BackendError(f"cpu backend: {kind} {k} is {getattr(a, 'dtype', type(a))}"
                                       f"{list(getattr(a, 'shape', ()))}, the delegate was compiled "
                                       f"for {NAMES[dtype]}{list(dims)} (C-contiguous"
                                       f"{', writable' if kind == 'output' else ''})")
        for position, k in handle.state.items():
            if outputs[position].ctypes.data != inputs[k].ctypes.data or \
                    not inputs[k].flags.writeable:
                raise BackendError(f"cpu backend: output {position} is the new value of state "
                                   f"input {k}, which the delegate writes in place: it must be "
                                   "that input's (writable) array — fix: re-export the program; this one "
                                   "was altered or corrupted")
        handle._live("bind()")
        self.handle = handle
        outputs = [a for position, a in enumerate(outputs) if position not in handle.state]
        outputs = [*outputs, *(array for _, _, array in handle.debug_outputs)]
        self.keep = (inputs, outputs)
        P = ctypes.c_void_p
        self.ins = (P * max(len(inputs), 1))(*[a.ctypes.data for a in inputs])
        self.outs = (P * max(len(outputs), 1))(*[a.ctypes.data for a in outputs])
        self.err = ctypes.create_string_buffer(_ERR)
        # a function object of its own with no argtypes, called with ready ctypes objects
        # (the handle, the pointer tables, the error buffer, its size): ctypes converts no
        # argument per call, which is a third of a small model's call cost
        self.execute = handle.lib["ofc_execute"]
        self.execute.restype = ctypes.c_int32
        self.ptr = ctypes.c_void_p(handle.ptr)
        self.err_size = ctypes.c_int32(_ERR)
        # other arrays per call (the runtime's direct calls: the caller's inputs, fresh
        # outputs); not for a delegate writing state in place or keeping debug outputs
        self.direct = self._direct if not handle.state and not handle.debug_outputs else None
        self._bound_pointers = (list(self.ins), list(self.outs))

    def __call__(self) -> None:
        if self.handle.closed:
            self.handle._live("a call")
        if self.execute(self.ptr, self.ins, self.outs, self.err, self.err_size):
            raise BackendError(f"cpu backend: {self.err.value.decode(errors='replace')}")

    def native_call(self, busy, lock, error):
        """This binding's call as the ``_fastcall`` extension's ``Call`` (``fastcall.py``):
        ``call(inputs)`` runs the engine on the caller's arrays and returns fresh outputs,
        or None for inputs it does not take. ``busy`` is the calling method's lock (taken
        without waiting), ``lock`` the delegate's, ``error(exception)`` raises an engine
        failure. None without the extension, or when direct calls do not apply."""
        from opforge.backends.cpu import fastcall

        module = fastcall.module() if self.direct is not None else None
        if module is None:
            return None
        inputs, outputs = self.keep
        entry = ctypes.cast(self.execute, ctypes.c_void_p).value

        def failed(message: str):
            raise error(BackendError(f"cpu backend: {message}"))
        return module.Call(entry, self.handle.ptr, ctypes.addressof(self.ins),
                           ctypes.addressof(self.outs), *self._bound_pointers,
                           [(a.dtype, a.shape) for a in inputs],
                           [(a.dtype, a.shape) for a in outputs], ctypes.addressof(self.err),
                           _ERR, busy, lock, self.handle, failed, self)

    def _direct(self, inputs, outputs) -> None:
        """One call on other arrays of the bound shapes and dtypes, C-contiguous and aligned
        (the caller checks: ``Method``'s direct path), outputs writable; the bound arrays
        are the call's again afterwards."""
        ins, outs = self.ins, self.outs
        for k, a in enumerate(inputs):
            ins[k] = a.ctypes.data
        for k, a in enumerate(outputs):
            outs[k] = a.ctypes.data
        try:
            self()
        finally:
            ins[:], outs[:] = self._bound_pointers
