"""Delegates at run time: one backend handle per delegate blob, made at load.

    load → for each DelegateBlob: find the backend by id → unavailable()? → its compile
    specs decoded (typed, strict) → init(blob, specs, context) → handle
    Method → each DelegateCall bound once to its arena views (backend.bind)
    LoadedProgram gone → destroy(handle) for each → the shared resources closed

Every handle of one program gets the same context: the program's named data (bytes blobs
refer to by key) and one ``SharedResources`` (what the delegates share, e.g. reordered
weights), which outlives every handle.

A handle is shared by every Method instance of the loaded program; calls through it are
serialised by a lock per handle (a backend keeps per-handle scratch memory), while
kernel instructions of different instances still run in parallel.

# Closing while a call runs
#
# A call runs native code without the GIL, so another thread may destroy the handle it is
# using: ``LoadedProgram.delegates.close()``, or the finalizer at interpreter exit while a
# daemon thread is still calling (the engine freed under ``ofc_execute`` was a SIGSEGV).
# Destroying therefore takes the delegate's lock first, the one every call holds:
#
#   close()  marks the set closing, then per delegate waits for the call in flight (up to
#            CLOSE_WAIT_S) and destroys the handle; a later call is refused by the backend
#            (its handle is closed)
#   exit     the same, waiting up to EXIT_WAIT_S; a daemon thread's later call, refused
#            (its handle is closed), waits for the end of the process instead of raising
#            (``_park_at_exit``), and the main thread's (an atexit function's) raises
#   timeout  a call still running (a daemon thread stuck in a long call): its handle, the
#            shared resources and everything they reference are leaked on purpose (a
#            reference never dropped), so the running call keeps valid memory until the
#            process ends
"""

from __future__ import annotations

import atexit
import sys
import threading
import warnings
import weakref
from dataclasses import dataclass
from typing import Any, Callable

from opforge.errors import BackendError, ProgramError
from opforge.program import ConstantStorage, DelegateCall, Program, TensorValue
from opforge.program.file_guard import watch_of
from opforge.program.verify_symbolic import state_values

__all__ = ["DelegateSet", "DelegateKernel", "IO_INPUTS", "IO_OUTPUTS"]

IO_INPUTS, IO_OUTPUTS = "opforge.inputs", "opforge.outputs"  # see opforge.export.delegation

CLOSE_WAIT_S = 30.0  # close(): how long to wait for a call in flight (see the module's design)
EXIT_WAIT_S = 2.0  # at interpreter exit


_exit = threading.Event()


def _exiting() -> bool:
    """The interpreter is shutting down: finalizers run from ``atexit`` or later, during
    finalization."""
    return _exit.is_set() or sys.is_finalizing()


# weakref.finalize runs the finalizers left at exit from an atexit function it registers
# with its first instance; atexit runs the last registered first, so ``_exit`` is set before
# they run once that one is registered before this one (the throwaway instance ensures it)
weakref.finalize(_exit, lambda: None)
atexit.register(_exit.set)


def _park_at_exit() -> None:
    """A daemon thread whose call failed once the interpreter is exiting (its delegate was
    destroyed at exit) waits for the end of the process instead of raising: the error would
    only print a traceback from a thread that is about to be ended anyway. Any other caller
    (the main thread in an atexit function, any thread before exit) gets the error."""
    if _exiting() and threading.current_thread().daemon:
        threading.Event().wait()


def _leak(*objects: Any) -> None:
    """Keep ``objects`` (and all they reference) alive until the process ends: one more
    reference that is never dropped, which module teardown at exit cannot clear either."""
    import ctypes

    for obj in objects:
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))


@dataclass(frozen=True)
class DelegateKernel:
    """What error messages and traces show for a delegate instruction."""

    key: str
    origin: str
    target: str = "delegate"
    own_threads: bool = False  # the backend sizes every thread its calls start (no pool of ours)


def _io_count(api: str, index: int, backend: str, specs: dict[str, bytes], key: str) -> int:
    raw = specs.get(key)
    try:
        if raw is None or not raw.startswith(b"i:"):
            raise ValueError
        count = int(raw[2:].decode("ascii"), 10)
        if not 0 <= count <= 1 << 20:
            raise ValueError
        return count
    except ValueError:
        raise ProgramError(
            f"`{api}`: delegates[{index}] ({backend!r}) — compile spec {key!r} is "
            f"{'missing' if raw is None else repr(raw[:40])} — valid: 'i:<count>' as export "
            "writes it — fix: re-export the program; this one was altered or corrupted") from None


class DelegateSet:
    """The initialised delegates of one loaded program."""

    def __init__(self, api: str, program: Program, context: Any) -> None:
        import dataclasses

        from opforge.backends import decode_specs, get_backend
        from opforge.backends.named_data import NamedDataMap, SharedResources

        self._api = api
        self.shared, self.named_data = SharedResources(), NamedDataMap(program)
        context = dataclasses.replace(context, named_data=self.named_data, shared=self.shared)
        self._program = program
        self.backends: list[Any] = []
        self.handles: list[Any] = []
        self.io: list[tuple[int, int]] = []
        self.locks: list[threading.Lock] = []
        used = {ins.delegate for m in program.methods for ins in m.instructions
                if type(ins) is DelegateCall}
        # the backends read the program's file at init: guarded, and checked after
        # (opforge/program/file_guard.py)
        watch = watch_of(program)
        if watch is not None:
            watch.guard()
        try:
            for index, blob in enumerate(program.delegates):
                if index not in used:
                    self.backends.append(None)
                    self.handles.append(None)
                    self.io.append((0, 0))
                    self.locks.append(threading.Lock())
                    continue
                try:
                    backend = get_backend(blob.id)
                except BackendError as e:
                    raise BackendError(f"`{api}`: delegates[{index}] needs backend {blob.id!r}: {e}") from None
                problem = backend.unavailable()
                if problem:
                    raise BackendError(f"`{api}`: delegates[{index}] needs backend {blob.id!r}, "
                                       f"which cannot run here: {problem}")
                raw = dict(blob.compile_specs)
                io = (_io_count(api, index, blob.id, raw, IO_INPUTS),
                      _io_count(api, index, blob.id, raw, IO_OUTPUTS))
                own = [(k, v) for k, v in blob.compile_specs if not k.startswith("opforge.")]
                specs = decode_specs(blob.id, backend.compile_spec_defs, own)
                data = program.segments[blob.segment].data
                reader = dataclasses.replace(context, named_data=self.named_data.for_reader(
                    f"delegates[{index}] ({blob.id!r})"))
                try:
                    handle = backend.init(data, specs, reader)
                except BackendError as e:
                    raise BackendError(f"`{api}`: delegates[{index}] ({blob.id!r}, "
                                       f"{data.nbytes} bytes) refused: {e}") from None
                self.backends.append(backend)
                self.handles.append(handle)
                self.io.append(io)
                self.locks.append(threading.Lock())
            if watch is not None:
                watch.check(api, "its delegates cannot be initialised from it")
        except BaseException:
            self.close()
            raise
        self._finalizer = weakref.finalize(self, DelegateSet._destroy, list(self.backends),
                                           list(self.handles), self.shared, list(self.locks))

    @staticmethod
    def _destroy(backends: list, handles: list, shared: Any, locks: list) -> None:
        """Destroy each handle once no call is inside it (the module's design: "Closing
        while a call runs"); the shared resources after every handle that may use them."""
        exiting = _exiting()
        wait = EXIT_WAIT_S if exiting else CLOSE_WAIT_S
        leaked = []
        try:
            for backend, handle, lock in zip(backends, handles, locks):
                if backend is None or handle is None:
                    continue
                if not lock.acquire(timeout=wait):
                    leaked.append(handle)  # a call is still running in it: never freed
                    continue
                try:
                    backend.destroy(handle)
                finally:
                    lock.release()
        finally:
            if leaked:
                _leak(shared, *leaked)
                if not exiting:
                    warnings.warn(f"opforge: {len(leaked)} delegate(s) still running a call "
                                  f"after {wait:g} s were not destroyed (their memory stays "
                                  "allocated until the process ends)", ResourceWarning,
                                  stacklevel=3)
            else:
                shared.close()

    def close(self) -> None:
        """Destroy every handle now (also done when the set is garbage collected, and at
        interpreter exit). A call in flight in another thread is waited for; a later call
        is refused."""
        finalizer = getattr(self, "_finalizer", None)
        if finalizer is not None:
            finalizer()
        else:
            DelegateSet._destroy(self.backends, self.handles, self.shared, self.locks)
            self.handles = [None] * len(self.handles)

    def check_call(self, method: Any, i: int, instruction: DelegateCall) -> None:
        """Args of a DelegateCall: the stored input/output counts, tensors only, outputs in
        an arena (a constant is a read-only view of the file)."""
        n_in, n_out = self.io[instruction.delegate]
        where = f"`{self._api}`: method {method.name!r} instruction {i} (DelegateCall " \
                f"{instruction.delegate})"
        if len(instruction.args) != n_in + n_out:
            raise ProgramError(f"{where} — {len(instruction.args)} arguments — valid: {n_in} "
                               f"input(s) + {n_out} output(s), as its delegate stores — fix: "
                               "re-export the program; this one was altered or corrupted")
        for position, index in enumerate(instruction.args):
            value = method.values[index]
            if type(value) is not TensorValue:
                raise ProgramError(f"{where} — argument {position} is value {index}, "
                                   f"a {type(value).__name__} — valid: tensors only — fix: re-export")
            if position >= n_in and type(value.storage) is ConstantStorage and \
                    index not in state_values(method):  # state: written in place
                raise ProgramError(f"{where} — output {position - n_in} is value {index}, a "
                                   "constant tensor — valid: an arena tensor — fix: re-export")

    def bind(self, instruction: DelegateCall, get: Callable[[int], Any]) -> Callable[[], None]:
        index = instruction.delegate
        n_in = self.io[index][0]
        arrays = [get(a) for a in instruction.args]
        backend, handle, lock = self.backends[index], self.handles[index], self.locks[index]
        run = backend.bind(handle, arrays[:n_in], arrays[n_in:])

        def call() -> None:
            try:
                with lock:
                    run()
            except BackendError:
                _park_at_exit()
                raise
        call.delegate_run = run  # the unlocked call, for a backend's own benchmarks
        direct = getattr(run, "direct", None)
        if direct is not None:  # the backend runs a call on other arrays (Method's direct path)
            def call_direct(inputs: list, outputs: list) -> None:
                try:
                    with lock:
                        direct(inputs, outputs)
                except BackendError:
                    _park_at_exit()
                    raise
            call.direct = call_direct
        native = getattr(run, "native_call", None)
        if native is not None:  # the same on an extension's call object: no Python per call
            call.native_call = lambda busy, error: native(busy, lock, error)
        label = getattr(run, "crash_label", None)
        if label is not None:  # native code inside: name this frame for a crash report
            from opforge.runtime.native import _named

            blob_id = self._program.delegates[index].id
            name = f"delegate {index} (backend {blob_id!r}) calling {label}"
            call = _named(call, name, f"<{blob_id} delegate {index}>")
            call.crash_label = name
        return call

    def kernel(self, index: int) -> DelegateKernel:
        blob = self._program.delegates[index]
        backend, handle = self.backends[index], self.handles[index]
        own = backend is not None and handle is not None and backend.own_threads(handle)
        return DelegateKernel(f"delegate {index} ({blob.id})", f"backend {blob.id!r}", own_threads=own)
