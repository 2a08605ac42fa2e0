"""``executor="native"``: a program run by the native C++ runtime (libopforge_runtime).

    build_runtime() (or $OPFORGE_RUNTIME_LIBRARY) → ctypes over the C API
    (opforge/native_runtime/include/opforge/runtime.h) → NativeProgram (registry + loaded,
    verified program; state) → NativeMethod (one method instance: set inputs, execute,
    read outputs)

A thin binding: one ctypes call per input, one ``opf_method_execute`` for the whole
instruction loop, one per output; nothing per instruction runs in Python. The NumPy lean
runtime stays the reference and the default (``opforge.runtime.load(..., executor="lean")``);
``opforge.runtime.load(source, executor="native")`` returns a ``NativeProgram`` shaped like
``LoadedProgram`` (``method(name)``, ``read_state``/``write_state``/``reset_state``), whose
methods are called like ``opforge.runtime.Method``: NumPy inputs in, NumPy outputs out
(copies, or with ``views=True`` arrays over the instance's memory, valid until its next call).

Not here yet: capturing intermediates by debug handle (``opforge compare`` compares the
native run's outputs only), Python kernel registrars (only native kernel libraries load
into the native registry), ATen mode.

>>> import numpy as np                                                 # doctest: +SKIP
>>> from opforge.runtime import load                                   # doctest: +SKIP
>>> forward = load("model.opf", executor="native").method("forward")   # doctest: +SKIP
>>> (y,) = forward(np.ones((1, 4), np.float32))                        # doctest: +SKIP
"""

from __future__ import annotations

import ctypes
import os
import re
import threading
import time
import weakref
from typing import Iterable, Sequence

import numpy as np

from opforge.errors import ConcurrentCallError, ProgramError, RegistrationError
from opforge.program import Program, to_bytes
from opforge.runtime.method import IOSpec
from opforge.runtime.native_capi import (
    LIBRARY_ENV, _IOInfo, _LoadOptions, _MethodOptions, _OK, _PI64, _SCALARS, _TensorView,
    _UNSUPPORTED, _VALUE_BOOL, _VALUE_DOUBLE, _VALUE_INT, _VALUE_TENSOR, _address,
    _aligned_stage, _check, _raw_dtype, _raw_function, _trust_python_packages, _use_installed_cpu_engine,
    runtime_library,
)

__all__ = ["NativeProgram", "NativeMethod", "load_native", "runtime_library", "LIBRARY_ENV"]

_REGISTRAR = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*\Z")
_ndarray = np.ndarray


class NativeProgram:
    """A program loaded and verified by the native runtime, with its kernel registry.

    ``source`` is a path (memory-mapped by the runtime), the file's bytes (copied) or an
    ``opforge.program.Program`` (serialized, then copied). ``kernels`` are native kernel
    library paths added to the portable kernels. Raises ``ProgramError`` for a bad file and
    ``MissingKernelError`` listing every operator without a kernel.
    """

    mode = "native"

    def __init__(self, source, *, kernels: Iterable[str | os.PathLike] = (),
                 max_memory: int | None = None, num_threads: int | None = None) -> None:
        from opforge.runtime.limits import max_memory as memory_limit_of
        from opforge.runtime.threads import resolve_thread_count

        lib = self._lib = runtime_library()
        self._source = source
        self.source = (f"<{len(source)} bytes>" if isinstance(source, (bytes, bytearray, memoryview))
                       else "<Program>" if isinstance(source, Program) else repr(os.fspath(source)))
        api = self._api = f"opforge.runtime.load({self.source}, executor='native')"
        self.num_threads = resolve_thread_count(num_threads, api=api)
        registry = ctypes.c_void_p()
        _check(lib, lib.opf_registry_new(ctypes.byref(registry)), api)
        self._registry = registry
        self._registry_finalizer = weakref.finalize(self, lib.opf_registry_free, registry)
        for library in kernels:
            self._load_library(os.fspath(library))
        # checked as the lean loader checks it (a positive int); None: the runtime's default
        limit = 0 if max_memory is None else memory_limit_of(max_memory, api=api)
        options = _LoadOptions(ctypes.sizeof(_LoadOptions), 0, limit)
        handle = ctypes.c_void_p()
        if isinstance(source, Program):
            source = to_bytes(source)
        _trust_python_packages(lib)  # op packages inside cpu delegates
        status = self._load(source, registry, options, handle)
        if status == _UNSUPPORTED and _use_installed_cpu_engine(lib):
            status = self._load(source, registry, options, handle)  # cpu delegates: retry
        _check(lib, status, api)
        self._handle = handle
        self._finalizer = weakref.finalize(self, lib.opf_program_free, handle)
        self._program = None

    def _load(self, source, registry, options, handle) -> int:
        lib = self._lib
        if isinstance(source, (bytes, bytearray, memoryview)):
            data = bytes(source)
            return lib.opf_program_load_buffer(data, len(data), 1, registry, ctypes.byref(options),
                                               ctypes.byref(handle))
        if isinstance(source, (str, os.PathLike)):
            return lib.opf_program_load_path(os.fsencode(source), registry, ctypes.byref(options),
                                             ctypes.byref(handle))
        raise ProgramError(f"`opforge.runtime.load()`: source — found {type(source).__name__} — "
                           "valid: a path, the file's bytes, or an opforge.program.Program — "
                           "fix: pass the .opf file's path")

    def _load_library(self, spec: str) -> None:
        if _REGISTRAR.match(spec) and not os.path.exists(spec):
            raise RegistrationError(
                f"`{self._api}`: kernel registrar {spec!r} — Python kernels cannot run in the "
                "native runtime — valid: native kernel libraries (`opforge build`) — fix: "
                "1. build the kernels as a native library; 2. or use executor='lean'")
        if not os.path.lexists(spec):
            raise RegistrationError(f"`{self._api}`: kernel library {spec!r} — no such file "
                                    f"({os.path.abspath(spec)}) — fix: check the path")
        _check(self._lib, self._lib.opf_registry_load_library(self._registry, os.fsencode(spec), 0),
               self._api)

    @property
    def method_names(self) -> tuple[str, ...]:
        lib, handle = self._lib, self._handle
        return tuple(lib.opf_program_method_name(handle, i).decode()
                     for i in range(lib.opf_program_num_methods(handle)))

    @property
    def program(self) -> Program:
        """The program as ``opforge.program`` reads it (parsed on first use, in Python), for
        what reads the program's data: ``Generator``'s decoder signature, the debug table."""
        if self._program is None:
            from opforge.program import from_bytes, load as load_file

            source = self._source
            self._program = (source if isinstance(source, Program) else
                             from_bytes(bytes(source)) if isinstance(source, (bytes, bytearray, memoryview))
                             else load_file(source))
        return self._program

    @property
    def operators(self) -> tuple[str, ...]:
        """The operator keys the registry serves (portable kernels and loaded libraries)."""
        lib, registry = self._lib, self._registry
        return tuple(lib.opf_registry_operator(registry, i).decode()
                     for i in range(lib.opf_registry_num_operators(registry)))

    def method(self, name: str = "forward") -> "NativeMethod":
        """A new instance of method ``name`` with its own arenas (one per thread)."""
        return NativeMethod(self, name)

    # --- state: shared by name across the program's methods ---------------------------------

    @property
    def state_names(self) -> tuple[str, ...]:
        lib, handle = self._lib, self._handle
        return tuple(lib.opf_program_state_name(handle, i).decode()
                     for i in range(lib.opf_program_num_states(handle)))

    def _state_info(self, name: str, api: str) -> tuple[np.dtype, tuple[int, ...], int]:
        dtype, rank, sizes, nbytes = ctypes.c_int32(), ctypes.c_int32(), _PI64(), ctypes.c_int64()
        _check(self._lib, self._lib.opf_program_state_info(
            self._handle, name.encode(), ctypes.byref(dtype), ctypes.byref(rank),
            ctypes.byref(sizes), ctypes.byref(nbytes)), f"NativeProgram.{api}({name!r})")
        return _raw_dtype(dtype.value), tuple(sizes[i] for i in range(rank.value)), nbytes.value

    def read_state(self, name: str) -> np.ndarray:
        """A copy of the live state tensor ``name``."""
        dtype, shape, nbytes = self._state_info(name, "read_state")
        out = np.empty(shape, dtype)
        _check(self._lib, self._lib.opf_program_state_read(self._handle, name.encode(),
                                                           out.ctypes.data, nbytes),
               f"NativeProgram.read_state({name!r})")
        return out

    def write_state(self, name: str, value: object) -> None:
        """Overwrite the live state tensor ``name`` (same shape and dtype)."""
        dtype, shape, nbytes = self._state_info(name, "write_state")
        array = np.asarray(value)
        if array.shape != shape or array.dtype != dtype:
            raise ProgramError(
                f"`NativeProgram.write_state({name!r})`: value — found {array.dtype} of shape "
                f"{array.shape} — valid: {dtype} of shape {shape} — fix: convert it, e.g. "
                f"numpy.asarray(v, numpy.{dtype}).reshape({shape})")
        array = np.ascontiguousarray(array)
        _check(self._lib, self._lib.opf_program_state_write(self._handle, name.encode(),
                                                            array.ctypes.data, nbytes),
               f"NativeProgram.write_state({name!r})")

    def reset_state(self, name: str | None = None) -> None:
        """Restore state ``name`` (every state without a name) to its initial value."""
        _check(self._lib, self._lib.opf_program_state_reset(
            self._handle, None if name is None else name.encode()),
            f"NativeProgram.reset_state({name!r})")

    def __repr__(self) -> str:
        return f"<NativeProgram {self.source} methods={self.method_names}>"


class NativeMethod:
    """One instance of a method in the native runtime: its own arenas, one call at a time
    (a second thread entering gets ``ConcurrentCallError`` at once, as the lean runtime's).

    ``method(*inputs)`` checks each input's dtype here (the runtime checks ranks and sizes
    against the method's bounds), copies the inputs in, runs every instruction natively and
    returns the outputs as new arrays (``views=True``: arrays over the instance's memory,
    valid until its next call). A bfloat16 output comes back as its raw uint16 bits.
    """

    # Inputs up to this size are copied into a 64-byte aligned staging array the runtime
    # reads in place (zero_copy=1, given once per shape): a call then costs one NumPy copy
    # per input instead of a seven-argument ctypes call (~2 µs each). Larger inputs are
    # handed over per call (zero_copy=0: the runtime's one copy, no staging memory).
    STAGE_LIMIT = 1 << 16
    SHAPE_CACHE = 8  # shapes whose staging arrays and output views are kept per input/output

    def __init__(self, program: NativeProgram, name: str) -> None:
        lib = self._lib = program._lib
        self._program = program  # keeps the program (and its registry) alive
        self.name = name
        self._api = f"{program._api}.method({name!r})"
        self._busy = threading.Lock()
        key = self._key = name.encode()
        options = _MethodOptions(ctypes.sizeof(_MethodOptions), program.num_threads, 0, None, None)
        handle = ctypes.c_void_p()
        _check(lib, lib.opf_method_new(program._handle, key, ctypes.byref(options),
                                       ctypes.byref(handle)), self._api)
        self._handle = handle.value
        self._finalizer = weakref.finalize(self, lib.opf_method_free, handle)
        n_in, n_out = ctypes.c_int64(), ctypes.c_int64()
        _check(lib, lib.opf_program_method_io(program._handle, key, ctypes.byref(n_in),
                                              ctypes.byref(n_out)), self._api)
        self.inputs = tuple(self._spec(lib.opf_program_input_info, i) for i in range(n_in.value))
        self.outputs = tuple(self._spec(lib.opf_program_output_info, i) for i in range(n_out.value))
        # per input: (kind, NumPy dtype, c10 code); the staging array of the current shape
        self._input_plan = tuple(self._plan(lib.opf_program_input_info, i) for i in range(n_in.value))
        self._stages: list = [None] * n_in.value
        # per input: the staging arrays of the last SHAPE_CACHE shapes, so that calls
        # alternating between shapes (a decoder's prefill and decode) stage nothing new
        self._staged: list = [{} for _ in range(n_in.value)]
        self._tensor_dtypes = tuple(dtype for kind, dtype, _ in self._input_plan) if all(
            kind == _VALUE_TENSOR for kind, _, _ in self._input_plan) else None
        self._dim_orders = tuple(self._dim_order(lib.opf_program_input_info, i)
                                 for i in range(n_in.value))
        self._output_orders = tuple(self._dim_order(lib.opf_program_output_info, i)
                                    for i in range(n_out.value))
        # per output: the shape when static (no sizes to read per call), and the last
        # (data address, NumPy view over the instance's memory) seen
        self._static_shapes = tuple(self._static_shape(i) for i in range(n_out.value))
        self._output_views: list = [None] * n_out.value
        self._dynamic_views: list = [{} for _ in range(n_out.value)]  # (address, shape) -> view
        self._view = _TensorView()
        # the per-call functions without argtypes, called with ctypes objects made once:
        # ctypes' argument conversion costs more than the call itself (~1 µs of ~1.4)
        self._execute, self._output = _raw_function(lib, "opf_method_execute"), \
            _raw_function(lib, "opf_method_output")
        self._handle_arg = ctypes.c_void_p(self._handle)
        self._view_arg = ctypes.c_void_p(ctypes.addressof(self._view))
        self._index_args = tuple(ctypes.c_int64(i) for i in range(n_out.value))
        self._scalar = (ctypes.c_int32(), ctypes.c_int64(), ctypes.c_double())

    def _info(self, read, index: int) -> _IOInfo:
        info = _IOInfo()
        _check(self._lib, read(self._program._handle, self._key, index, ctypes.byref(info)), self._api)
        return info

    def _spec(self, read, index: int) -> IOSpec:
        info = self._info(read, index)
        if info.kind != _VALUE_TENSOR:
            return IOSpec(index, _SCALARS[info.kind], None)
        return IOSpec(index, _raw_dtype(info.dtype), tuple(info.sizes[d] for d in range(info.rank)))

    def _dim_order(self, read, index: int) -> tuple[int, ...] | None:
        """The dim order (outermost first) the runtime lays a tensor's bytes out in; None
        for a scalar."""
        info = self._info(read, index)
        if info.kind != _VALUE_TENSOR:
            return None
        return tuple(info.dim_order[d] for d in range(info.rank))

    def _static_shape(self, index: int) -> tuple[int, ...] | None | bool:
        """Output ``index``'s shape when static, None when dynamic, False for a scalar."""
        info = self._info(self._lib.opf_program_output_info, index)
        if info.kind != _VALUE_TENSOR:
            return False
        if any(info.min_sizes[d] != info.max_sizes[d] for d in range(info.rank)):
            return None
        # the bounds, not ``sizes``: a dim whose symbol's range is one value has that size,
        # whatever the export example (``sizes``) was
        return tuple(info.min_sizes[d] for d in range(info.rank))

    def _plan(self, read, index: int) -> tuple:
        info = self._info(read, index)
        return info.kind, (_raw_dtype(info.dtype) if info.kind == _VALUE_TENSOR else None), info.dtype

    def __call__(self, *inputs: object, views: bool = False) -> tuple:
        """Run the method on ``inputs`` (in order); return its outputs as a tuple."""
        if not self._busy.acquire(False):
            raise self._concurrent()
        try:
            # the fast path: every input an ndarray of its dtype at its staged shape
            dtypes = self._tensor_dtypes
            if dtypes is not None and len(inputs) == len(dtypes):
                for given, dtype, stage in zip(inputs, dtypes, self._stages):
                    if type(given) is not _ndarray or stage is None or given.shape != stage.shape \
                            or (given.dtype is not dtype and given.dtype != dtype):
                        break
                    stage[...] = given
                else:
                    status = self._execute(self._handle_arg)
                    if status:
                        _check(self._lib, status, f"{self._api}(...)")
                    return self._read_outputs(views)
            return self._call(inputs, views)
        finally:
            self._busy.release()

    def _call(self, inputs: tuple, views: bool) -> tuple:
        lib = self._lib
        plan, stages = self._input_plan, self._stages
        if len(inputs) != len(plan):
            expected = ", ".join(s.describe() for s in self.inputs) or "none"
            raise ProgramError(f"`{self._api}(...)`: inputs — found {len(inputs)} input(s) — valid: "
                               f"exactly {len(plan)} ({expected}) — fix: pass the inputs in order")
        keep = []  # arrays handed over with zero_copy=0, alive until execute has copied them
        for index, given in enumerate(inputs):
            kind, dtype, code = plan[index]
            if kind != _VALUE_TENSOR:
                status = self._set_scalar(index, kind, given)
                if status:
                    _check(lib, status, f"{self._api}(...)")
                continue
            array = given if type(given) is np.ndarray else np.asarray(given)
            if array.dtype is not dtype and array.dtype != dtype:
                raise ProgramError(
                    f"`{self._api}(...)`: input {index} — found dtype {array.dtype} — valid: "
                    f"{self.inputs[index].describe()} — fix: convert it, e.g. "
                    f"a.astype(numpy.{dtype})")
            stage = stages[index]
            if stage is not None and stage.shape == array.shape:
                stage[...] = array  # the runtime reads the stage in place
            else:
                keep.append(self._set_tensor(index, array, code))
        status = self._execute(self._handle_arg)
        if status:
            _check(lib, status, f"{self._api}(...)")
        return self._read_outputs(views)

    def _set_tensor(self, index: int, array: np.ndarray, code: int) -> np.ndarray:
        """Hand input ``index`` to the runtime at a new shape (or a large one, every call):
        staged (zero_copy=1) when small and its dim order is known, else copied."""
        lib, handle = self._lib, self._handle
        shape = array.shape
        staged = self._staged[index]
        known = staged.get(shape)
        self._stages[index] = None
        if known is not None:  # a shape staged before: its array, address and sizes again
            stage, address, sizes = known
            stage[...] = array
            if lib.opf_method_set_input(handle, index, address, code, len(shape), sizes, 1) == _OK:
                self._stages[index] = stage
                return stage
        sizes = (ctypes.c_int64 * max(len(shape), 1))(*shape)
        order = self._dim_orders[index]
        if order is not None and len(order) == len(shape) and array.nbytes <= self.STAGE_LIMIT:
            stage, base = _aligned_stage(shape, array.dtype, order)
            stage[...] = array
            status = lib.opf_method_set_input(handle, index, base.ctypes.data, code, len(shape),
                                              sizes, 1)
            if status == _OK:
                self._stages[index] = stage
                if len(staged) >= self.SHAPE_CACHE:
                    del staged[next(iter(staged))]
                staged[shape] = (stage, base.ctypes.data, sizes)
                return stage
        if order is not None and len(order) == len(shape) and order != tuple(range(len(shape))):
            array = array.transpose(order)  # the runtime copies bytes dense in the dim order
        array = np.ascontiguousarray(array)
        status = lib.opf_method_set_input(handle, index, _address(array), code, len(shape), sizes, 0)
        if status:
            _check(lib, status, f"{self._api}(...)")
        return array

    def _concurrent(self) -> ConcurrentCallError:
        return ConcurrentCallError(
            f"`{self._api}(...)`: method instance {id(self):#x} — entered by thread "
            f"{threading.current_thread().name!r} while another call of it is running — valid: "
            "one call at a time per instance (its memory holds the call's tensors) — fix: make "
            "one instance per thread with NativeProgram.method(name), or guard it with a lock")

    def _set_scalar(self, index: int, kind: int, given: object) -> int:
        lib, handle = self._lib, self._handle
        python = _SCALARS[kind]
        if type(given) is not python and not (python is float and type(given) is int) and not (
                isinstance(given, np.generic) and np.ndim(given) == 0):
            raise ProgramError(f"`{self._api}(...)`: input {index} — found {type(given).__name__} "
                               f"{given!r} — valid: a Python {python.__name__} — fix: pass a "
                               f"{python.__name__}")
        if kind == _VALUE_INT:
            return lib.opf_method_set_input_int(handle, index, int(given))
        if kind == _VALUE_DOUBLE:
            return lib.opf_method_set_input_double(handle, index, float(given))
        return lib.opf_method_set_input_bool(handle, index, int(bool(given)))

    def _read_outputs(self, views: bool) -> tuple:
        output, handle, view, ref = self._output, self._handle_arg, self._view, self._view_arg
        indices = self._index_args
        cache = self._output_views
        outputs = []
        for index, static in enumerate(self._static_shapes):
            if static is False:  # a scalar output
                outputs.append(self._scalar_output(index))
                continue
            status = output(handle, indices[index], ref)
            if status:
                _check(self._lib, status, f"{self._api}(...)")
            cached = cache[index]
            if static is not None:
                if cached is not None and cached[0] == view.data:
                    array = cached[1]  # a static output: same address, same size
                else:
                    array = self._output_view(index, static)
            else:  # a dynamic output: the view made at this address and shape before
                sizes = view.sizes
                shape = tuple([sizes[d] for d in range(view.rank)])
                known = self._dynamic_views[index]
                array = known.get((view.data, shape))
                if array is None:
                    array = self._output_view(index, shape)
                    if len(known) >= self.SHAPE_CACHE:
                        del known[next(iter(known))]
                    known[(view.data, shape)] = array
            outputs.append(array if views else array.copy())
        return tuple(outputs)

    def _output_view(self, index: int, shape: tuple[int, ...] | None) -> np.ndarray:
        """A NumPy view of output ``index`` (the view struct just filled), kept for the
        next call while its address and size stay the same."""
        view = self._view
        if shape is None:
            sizes = view.sizes
            shape = tuple([sizes[d] for d in range(view.rank)])
        dtype, nbytes = self.outputs[index].dtype, view.nbytes
        order = self._output_orders[index]
        if order is None or len(order) != len(shape):
            order = tuple(range(len(shape)))
        dense = tuple(shape[d] for d in order)  # the bytes are dense in the dim order
        array = np.empty(shape, dtype) if nbytes == 0 else np.frombuffer(
            (ctypes.c_char * nbytes).from_address(view.data), dtype).reshape(dense).transpose(
            np.argsort(order))
        self._output_views[index] = (view.data, array)
        return array

    def _scalar_output(self, index: int) -> object:
        kind, i, d = self._scalar
        _check(self._lib, self._lib.opf_method_output_scalar(
            self._handle, index, ctypes.byref(kind), ctypes.byref(i), ctypes.byref(d)),
            f"{self._api}(...)")
        return (d.value if kind.value == _VALUE_DOUBLE else
                bool(i.value) if kind.value == _VALUE_BOOL else i.value)

    def run(self, inputs: Sequence[object], *, views: bool = False, tracer=None) -> tuple:
        """``self(*inputs, views=views)``; with ``tracer`` (an ``opforge.runtime.Tracer``),
        the runtime times every instruction and each one is recorded (laid end to end from
        the call's start: the C API gives durations)."""
        if tracer is None:
            return self(*inputs, views=views)
        lib, handle = self._lib, self._handle
        _check(lib, lib.opf_method_set_profiling(handle, 1), self._api)
        try:
            start = time.perf_counter_ns()
            outputs = self(*inputs, views=views)
            duration = time.perf_counter_ns() - start
        finally:
            lib.opf_method_set_profiling(handle, 0)
        at = start
        for index, label, node, ns in self._profile():
            tracer.record(self.name, index, label, at, ns)
            at += ns
        tracer.record(self.name, -1, f"method {self.name}", start, duration)
        return outputs

    def _profile(self) -> list[tuple[int, str, str, int]]:
        lib, handle = self._lib, self._handle
        label, node, ns = ctypes.c_char_p(), ctypes.c_char_p(), ctypes.c_int64()
        rows = []
        for index in range(lib.opf_method_num_instructions(handle)):
            _check(lib, lib.opf_method_instruction_profile(handle, index, ctypes.byref(label),
                                                           ctypes.byref(node), ctypes.byref(ns)),
                   self._api)
            if ns.value >= 0:
                rows.append((index, (label.value or b"").decode(), (node.value or b"").decode(),
                             ns.value))
        return rows

    @property
    def instructions(self) -> list[tuple[int, str]]:
        """``(instruction index, label)`` of every instruction, in execution order."""
        lib, handle = self._lib, self._handle
        label, node, ns = ctypes.c_char_p(), ctypes.c_char_p(), ctypes.c_int64()
        rows = []
        for index in range(lib.opf_method_num_instructions(handle)):
            _check(lib, lib.opf_method_instruction_profile(handle, index, ctypes.byref(label),
                                                           ctypes.byref(node), ctypes.byref(ns)),
                   self._api)
            rows.append((index, (label.value or b"").decode()))
        return rows

    memory_growths = 0  # what `opforge run` reports for the lean runtime's growing tensors
    growing_bytes = 0

    def __repr__(self) -> str:
        return (f"<NativeMethod {self.name!r}: {len(self.inputs)} input(s), "
                f"{len(self.outputs)} output(s)>")


def load_native(source, *, kernels: Iterable[str | os.PathLike] = (), max_memory: int | None = None,
                num_threads: int | None = None) -> NativeProgram:
    """``opforge.runtime.load(source, executor="native", ...)``."""
    return NativeProgram(source, kernels=kernels, max_memory=max_memory, num_threads=num_threads)

