"""The executor: one ``Method`` instance = one arena set + its instructions bound once.

# Design
#
# Everything that can be decided before the first call is decided when the instance is
# made: each arena is allocated, each value becomes its run-time object (a NumPy view into
# the arena, a read-only constant view, a Python scalar, a tuple, a dtype), and each
# instruction becomes a ``(callable, args tuple)`` pair. A call is then
#
#     check and copy the inputs into their arena slots
#     for fn, args in bound: fn(*args)
#     copy the outputs out (or hand out the views)
#
# with no dict lookups, no isinstance chains and no allocation in between (the portable
# kernels write into their out views). A kernel that raises is found after the fact: the
# loop variables still hold the failing pair, so the happy path pays nothing to know which
# instruction it was. Tracing is a second loop (``_execute_traced``), not an ``if`` per
# instruction.
#
# Instances do not share mutable state: two instances of the same method run safely in two
# threads. One instance owns one arena set, so two threads inside it at once would write
# each other's intermediates and return wrong results silently (68 of 2,400 MLP calls
# from 8 threads did). A call therefore holds a non-blocking lock and a second thread that
# enters meanwhile gets ConcurrentCallError at once, instead of waiting or corrupting:
# serialising silently would hide a design error (views=True outputs would be overwritten
# by the other thread right after return). Cost: one uncontended acquire/release per call.
#
# Two exceptions to "nothing shared": program state (the buffers a method updates, one live
# copy per LoadedProgram, shared by every instance by design, as a KV cache must be), and
# nothing else. A dynamic method (symbolic sizes) keeps one bound list per input shape
# (``ShapeBinding``, runtime/rebinding.py) and swaps the current one in before the same
# call loop; a static method never touches that code.
#
# Direct calls (one delegate call on the caller's arrays, no copies): runtime/direct.py.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from time import perf_counter_ns
from typing import Sequence

import numpy as np

from opforge.errors import BackendError, ConcurrentCallError, KernelError, ProgramError
from opforge.program import (
    BoolValue, DoubleValue, Free, IntValue, KernelCall, Method as MethodDef, Move,
    Program, TensorValue,
)
from opforge.program.file_guard import watch_of
from opforge.program.symbolic import growing_values
from opforge.runtime.arena import ValueTable, allocate_arenas, tensor_dtype
from opforge.runtime.direct import call_direct, direct_calls
from opforge.runtime.growth import GrowingMemory
from opforge.runtime.limits import max_memory, memory_limit
from opforge.runtime.registry import Kernel
from opforge.runtime.rebinding import RebindPlan, ShapeBinding, bind_error, output_copier
from opforge.runtime.shapes import ShapeBinder
from opforge.runtime.threads import ThreadGovernor, resolve_thread_count

__all__ = ["Method", "IOSpec"]

_SCALAR_INPUT_TYPES = {IntValue: int, DoubleValue: float, BoolValue: bool}
_ndarray = np.ndarray


@dataclass(frozen=True, slots=True)
class IOSpec:
    """One input or output of a method: a tensor (NumPy ``dtype`` and ``shape``) or a
    scalar (``dtype`` is ``int``, ``float`` or ``bool`` and ``shape`` is None)."""

    index: int
    dtype: np.dtype | type
    shape: tuple[int, ...] | None

    @property
    def is_tensor(self) -> bool:
        return self.shape is not None

    def describe(self) -> str:
        if self.shape is None:
            return f"a Python {self.dtype.__name__}"
        return f"{np.dtype(self.dtype)} of shape {self.shape}"


class Method:
    """A bound, runnable method of a loaded program, with its own arenas.

    Get one from ``LoadedProgram.method(name)``; call it with the inputs in order.

    >>> import numpy as np
    >>> from opforge.program import (Program, Method as MethodDef, TensorValue, ArenaStorage,
    ...                              ScalarType, KernelCall, Operator, MemoryPlan)
    >>> from opforge.runtime import load
    >>> x = TensorValue(ScalarType.FLOAT32, (3,), storage=ArenaStorage(0, 0))
    >>> y = TensorValue(ScalarType.FLOAT32, (3,), storage=ArenaStorage(0, 64))
    >>> abs_ = MethodDef("forward", (x, y), (0,), (1,), (KernelCall(0, (0, 1)),),
    ...                  (Operator("aten::abs", "out"),), MemoryPlan((128,)))
    >>> program = Program(methods=(abs_,))
    >>> forward = load(program).method("forward")
    >>> forward.inputs[0].describe()
    'float32 of shape (3,)'
    >>> forward(np.array([-1.0, 2.0, -3.0], np.float32))[0].tolist()
    [1.0, 2.0, 3.0]
    """

    def __init__(self, program: Program, method: MethodDef, kernels: Sequence[Kernel | None],
                 *, api: str = "opforge.runtime.Method", delegates=None,
                 num_threads: int | None = None, mode: str = "lean",
                 state: dict[str, np.ndarray] | None = None) -> None:
        self.name = method.name
        self._api = api
        self._busy = threading.Lock()
        self._max_memory = max_memory()  # the load's limit, for re-binding on scalar inputs
        self._delegates = delegates  # keeps the delegate handles alive as long as this method
        self._def = method
        self._arenas = allocate_arenas(method)
        self._state = state or {}
        self._kernel_table = kernels
        self._dynamic = bool(method.symbols)
        self._binder = ShapeBinder(api, method) if self._dynamic else None
        # tensors outside the arenas that grow with their sizes (export(grow=...))
        self._growing = (GrowingMemory(api, method, self._max_memory)
                         if self._dynamic and growing_values(method) else None)
        self._values = self._base_values = self._value_table(program, method)
        self._program = program
        # the file the constants are read from, if any: a call refuses it once it changed
        # (opforge/program/file_guard.py); _fault_flag: the guard's flag, read per call
        self._file = watch_of(program)
        self._fault_flag = None
        self._call_api = f"{api}({self.name!r})(...)"  # (what a call's errors name)
        if self._file is not None:
            self._file.guard()
            self._file.check(f"{api}({self.name!r})")
            self._fault_flag = self._file._flag
        # a dynamic method binds per input shape (``_select``); a static one once, here
        self._instruction_index, self._op_names, self._kernels = [], [], []
        self._bound = [] if self._dynamic else self._bind_all(method)
        get = self._values.get
        # every thread pool a call can reach, held at the program's thread count per call
        self.num_threads = resolve_thread_count(num_threads, api=api)
        pools = any(k is not None and _reaches_pools(k)
                    for k in (self._kernels if not self._dynamic else kernels))
        self._threads = (ThreadGovernor(self.num_threads, pools=pools or mode == "aten",
                                        torch_intraop=mode == "aten")
                         if pools or mode == "aten" else None)

        # --- inputs: (arena slot, dtype, shape) for the fast check; scalars rebind
        self.inputs = tuple(self._io_spec(i) for i in method.inputs)
        self.outputs = tuple(self._io_spec(i) for i in method.outputs)
        self._input_shapes = tuple(s.shape for s in self.inputs)
        self._fast_inputs = () if self._dynamic else tuple(
            (get(s.index), s.dtype, s.shape) for s in self.inputs if s.is_tensor)
        # the fast path takes calls with this many inputs; -1 (never) with scalar inputs
        self._fast_count = len(self.inputs) if all(s.is_tensor for s in self.inputs) else -1
        self._scalar_users = self._scalar_input_users(method)

        # --- outputs: views (valid until the next call) and how to copy each
        self._output_views, self._copy_outputs = (), tuple
        self._direct = self._native = self._produced = None
        if not self._dynamic:
            self._output_views = tuple(get(i) for i in method.outputs)
            self._copy_outputs = output_copier(self._output_views)
            self._direct, self._native = direct_calls(self, method)
        else:  # the per-shape bindings, most recently used last (runtime/rebinding.py)
            self._shapes: OrderedDict = OrderedDict()
            self._current = None
            self._call = self._call_dynamic
            self._rebind = RebindPlan(self)
            # names until the first call binds (``instructions``, __repr__)
            self._instruction_index = self._rebind.instruction_index
            self._op_names = self._rebind.op_names
            self._kernels = self._rebind.kernels
            self._scalar_users = self._scalar_input_users(method)
            if self._binder.produced:  # data-dependent sizes: bound mid-call
                from opforge.runtime.produced import ProducedSizes

                self._produced = ProducedSizes(self)
                self._call = self._produced.call

    # --- values and binding ---------------------------------------------------------------

    def _value_table(self, program: Program, method: MethodDef) -> ValueTable:
        values = ValueTable(self._api, program, method, self._arenas)
        for slot in method.state:  # every method of a loaded program shares its live state
            values.set(slot.value, self._state[slot.name])
        return values

    def _bind_all(self, method: MethodDef) -> list[tuple]:
        """Bind every instruction of a static ``method`` against ``self._values``."""
        kernels, delegates, api = self._kernel_table, self._delegates, self._api
        get = self._values.get
        bound: list[tuple] = []
        self._instruction_index = []
        self._op_names = []
        self._kernels = []
        for i, instruction in enumerate(method.instructions):
            kind = type(instruction)
            if kind is Free:
                continue  # arenas are planned: nothing to release
            if kind is Move:
                bound.append((np.copyto, (get(instruction.dst), get(instruction.src))))
                self._op_names.append("move")
                self._kernels.append(None)
            elif kind is KernelCall:
                kernel = kernels[i]
                bound.append(self._bind(i, kernel, instruction))
                self._op_names.append(kernel.key)
                self._kernels.append(kernel)
            elif delegates is not None:  # DelegateCall: one call into its backend
                bound.append((self._bind_delegate(i, delegates, instruction), ()))
                kernel = delegates.kernel(instruction.delegate)
                self._op_names.append(kernel.key)
                self._kernels.append(kernel)
            else:
                raise ProgramError(f"`{api}`: instruction {i} — {kind.__name__} without the "
                                   "program's delegates — fix: load the program with "
                                   "opforge.runtime.load")
            self._instruction_index.append(i)
        return bound

    # --- dynamic shapes -------------------------------------------------------------------
    #
    # One binding per input shape (``ShapeBinding``, made by ``rebinding.RebindPlan``):
    # the value table at the actual sizes, the bound instruction list, the inputs'
    # fast-check triples and the output views. A call looks its shape up; a hit that is
    # not the current binding swaps it in (a few attribute stores), a miss binds (the
    # ``ShapeBinder``'s checks, then the plan) and evicts the least recently used binding
    # beyond ``SHAPE_CACHE_SIZE``. Then the static call path runs unchanged.

    SHAPE_CACHE_SIZE = 16

    def _call_dynamic(self, inputs: tuple, views: bool) -> tuple:
        try:
            key = self._shape_key(inputs)
            binding = self._shapes.get(key)
        except TypeError:  # an unhashable input (a nested list): convert, then key it
            inputs = tuple(_as_array(self._api, p, a, s) if s.is_tensor else a
                           for p, (a, s) in enumerate(zip(inputs, self.inputs)))
            key = self._shape_key(inputs)
            binding = self._shapes.get(key)
        if binding is None:
            binding = self._bind_shape(key, inputs)
        if binding is not self._current:
            self._use(binding)
            self._shapes.move_to_end(key)
        return Method._call(self, inputs, views)

    def _shape_key(self, inputs: tuple) -> tuple:
        """The input shapes (the cache key). Scalar inputs are not part of it: they are
        written into the current binding and rebind their users, as in a static method."""
        if self._fast_count >= 0:
            return tuple([getattr(a, "shape", a) for a in inputs])
        return tuple([getattr(a, "shape", a) if s.is_tensor else None
                      for a, s in zip(inputs, self.inputs)])

    def _select(self, inputs: tuple) -> None:
        """Make the binding for ``inputs``' shapes current (the traced path)."""
        key = self._shape_key(inputs)
        binding = self._shapes.get(key) or self._bind_shape(key, inputs)
        self._use(binding)

    def _use(self, binding: ShapeBinding) -> None:
        self._current = binding
        (self._values, self._bound, self._instruction_index, self._op_names, self._kernels,
         self._fast_inputs, self._input_shapes, self._output_views,
         self._copy_outputs) = binding

    def _bind_shape(self, key: tuple | None, inputs: tuple,
                    produced: dict[str, int] | None = None) -> ShapeBinding:
        """Bind at ``inputs``' shapes and the ``produced`` symbols' values (runtime/produced.py);
        cache the binding under ``key`` (None: not cached)."""
        api = self._call_api
        if len(inputs) != len(self.inputs):
            self._load_inputs_slow(inputs)  # raises the count error
        self._binder.api = api
        shapes = {}
        for position, (spec, given) in enumerate(zip(self.inputs, inputs)):
            if spec.is_tensor:
                shape = getattr(given, "shape", None)
                shapes[position] = tuple(shape) if shape is not None else \
                    _as_array(api, position, given, spec).shape
        binding = self._rebind.bind(shapes, inputs, produced=produced)
        if key is None:
            return binding
        if len(self._shapes) >= self.SHAPE_CACHE_SIZE:
            evicted = self._shapes.popitem(last=False)[1]
            if evicted is self._current:
                self._current = None
        self._shapes[key] = binding
        return binding

    # --- public API -------------------------------------------------------------------------

    def __call__(self, *inputs: object, views: bool = False) -> tuple:
        """Run the method on ``inputs`` (in order); return its outputs as a tuple.

        Inputs are checked (count, dtype, shape) and copied into their arena slots, so any
        array works (non-contiguous, read-only, a CPU torch tensor). Outputs are fresh
        copies, or with ``views=True`` the arena views themselves: no copy, but valid only
        until the next call of this instance.

        One instance runs one call at a time: a call entered while another thread is inside
        raises ``ConcurrentCallError`` (make one instance per thread with
        ``LoadedProgram.method(name)``; instances share only the read-only constants).
        """
        native = self._native
        if native is not None:
            outputs = native(inputs)  # None: inputs it does not take, or a busy instance
            if outputs is not None:
                if self._fault_flag is not None and self._fault_flag.value:
                    self._file.check_faulted(self._call_api)
                return outputs
        if not self._busy.acquire(False):
            raise self._concurrent()
        try:
            return self._call(inputs, views)
        finally:
            self._busy.release()

    def _call(self, inputs: tuple, views: bool) -> tuple:
        file = self._file
        if file is not None:
            file.check(self._call_api, now=False)
        if self._direct is not None and len(inputs) == self._fast_count:
            result = call_direct(self, inputs)
            if result is not None:
                if file is not None:
                    file.check_faulted(self._call_api)
                return result
        if len(inputs) == self._fast_count:
            for a, (slot, dtype, shape) in zip(inputs, self._fast_inputs):
                if type(a) is not _ndarray or (a.dtype is not dtype and a.dtype != dtype) \
                        or a.shape != shape:
                    self._load_inputs_slow(inputs)  # converts, or raises naming the input
                    break
                slot[...] = a  # dtype and shape checked: np.copyto's checks cost more
        else:
            self._load_inputs_slow(inputs)
        threads = self._threads
        saved = threads.enter() if threads is not None else None
        try:
            for fn, args in self._bound:
                fn(*args)
        except Exception as e:
            if file is not None:  # a kernel failing on the zeros a truncated file reads as
                file.check_faulted(self._call_api)
            raise self._kernel_error(fn, args, e) from e  # noqa: F821 (bound in the loop)
        finally:
            if saved:
                threads.exit(saved)
        if self._fault_flag is not None and self._fault_flag.value:
            file.check_faulted(self._call_api)
        if views:
            return self._output_views
        return self._copy_outputs()

    def run(self, inputs: Sequence[object], *, views: bool = False, tracer=None) -> tuple:
        """``self(*inputs, views=views)``, recording each instruction into ``tracer``
        (an ``opforge.runtime.Tracer``) when one is given."""
        if tracer is None:
            return self(*inputs, views=views)
        if not self._busy.acquire(False):
            raise self._concurrent()
        try:
            file = self._file
            if file is not None:
                file.check(self._call_api)
            if self._produced is not None:
                return self._produced.call(tuple(inputs), views, tracer)
            if self._dynamic:
                self._select(tuple(inputs))
            self._load_inputs_slow(tuple(inputs))
            threads = self._threads
            saved = threads.enter() if threads is not None else None
            try:
                self._execute_traced(tracer)
            finally:
                if saved:
                    threads.exit(saved)
            return self._finish(views)
        finally:
            self._busy.release()

    def _finish(self, views: bool) -> tuple:
        """The end of a traced or produced-size call: refuse a file that faulted during it,
        then the outputs (the views, or copies)."""
        if self._file is not None:
            self._file.check_faulted(self._call_api)
        return self._output_views if views else self._copy_outputs()

    @property
    def memory_growths(self) -> int:
        """How many times this instance grew a growing tensor's memory (``export(grow=...)``);
        0 for a method without growing tensors."""
        return self._growing.growths if self._growing is not None else 0

    @property
    def growing_bytes(self) -> int:
        """Bytes this instance holds outside its arenas for growing tensors now."""
        return self._growing.nbytes if self._growing is not None else 0

    def value(self, index: int) -> object:
        """Value ``index``'s run-time object now (an arena view, valid until the next call):
        what a tracer reads after an instruction (``opforge.runtime.capture``)."""
        return self._values.get(index)

    @property
    def instructions(self) -> list[tuple[int, str]]:
        """``(instruction index, op key)`` of every bound instruction, in execution order."""
        return list(zip(self._instruction_index, self._op_names))

    def __repr__(self) -> str:
        return (f"<Method {self.name!r}: {len(self.inputs)} input(s), {len(self.outputs)} "
                f"output(s), {len(self._bound)} instruction(s)>")

    def _concurrent(self) -> ConcurrentCallError:
        return ConcurrentCallError(
            f"`{self._api}({self.name!r})(...)`: method instance {id(self):#x} — entered by "
            f"thread {threading.current_thread().name!r} while another call of it is running "
            "— valid: one call at a time per instance (its arenas hold the call's tensors) — "
            "fix: make one instance per thread with LoadedProgram.method(name), or guard the "
            "instance with a lock")

    # --- binding ------------------------------------------------------------------------

    def _bind(self, i: int, kernel: Kernel, instruction: KernelCall) -> tuple:
        args = tuple(self._values.get(a) for a in instruction.args)
        bind = getattr(kernel.fn, "bind", None)
        if bind is None:
            return kernel.fn, args
        try:
            fn, bound_args = bind(args)
        except Exception as e:
            raise bind_error(self, i, kernel, e) from e
        if getattr(fn, "crash_label", None) is not None:  # a native call: name it for a crash
            from opforge.runtime.native import label_crash_frame

            fn = label_crash_frame(fn, f"instruction {i} of method {self.name!r}",
                                   kernel.origin)
        return fn, bound_args

    def _bind_delegate(self, i: int, delegates, instruction) -> object:
        try:
            call = delegates.bind(instruction, self._values.get)
        except BackendError as e:
            raise BackendError(f"`{self._api}({self.name!r})`: instruction {i} (DelegateCall "
                               f"{instruction.delegate}) — {e}") from None
        label = getattr(call, "crash_label", None)
        if label is not None:  # native code inside the delegate: name the frame for a crash
            from opforge.runtime.native import _named

            call = _named(call, f"instruction {i} of method {self.name!r}, {label}")
        return call

    def _scalar_input_users(self, method: MethodDef) -> dict[int, list[int]]:
        """Scalar inputs → positions in ``_bound`` of the instructions that read them."""
        scalars = {s.index for s in self.inputs if not s.is_tensor}
        users: dict[int, list[int]] = {}
        for position, i in enumerate(self._instruction_index):
            instruction = method.instructions[i]
            if type(instruction) is KernelCall:
                for a in set(instruction.args) & scalars:
                    users.setdefault(a, []).append(position)
        return users

    def _io_spec(self, index: int) -> IOSpec:
        value = self._def.values[index]
        if type(value) is TensorValue:
            where = f"method {self.name!r} values[{index}]"
            return IOSpec(index, tensor_dtype(self._api, where, value), value.sizes)
        return IOSpec(index, _SCALAR_INPUT_TYPES[type(value)], None)

    # --- inputs -------------------------------------------------------------------------

    def _describe_input(self, position: int) -> str:
        """Input ``position`` as the program declares it: a dynamic one by its symbols and
        their ranges (``int64 of shape (seq,) with seq in [1, 24]``), not by the upper
        bound its arena is planned for."""
        spec = self.inputs[position]
        if self._binder is None or not spec.is_tensor:
            return spec.describe()
        return f"{np.dtype(spec.dtype)} of shape {self._binder.describe_input(position)}"

    def _load_inputs_slow(self, inputs: tuple) -> None:
        api = f"{self._api}({self.name!r})(...)"
        if len(inputs) != len(self.inputs):
            expected = ", ".join(map(self._describe_input, range(len(self.inputs)))) or "none"
            raise ProgramError(
                f"`{api}`: inputs — found {len(inputs)} input(s) — valid: exactly "
                f"{len(self.inputs)} ({expected}) — fix: pass the inputs in order, as exported"
            )
        get = self._values.get
        rebind = False
        for position, (spec, given) in enumerate(zip(self.inputs, inputs)):
            if not spec.is_tensor:
                if type(given) is not spec.dtype and not (
                        spec.dtype is float and type(given) is int):
                    raise ProgramError(
                        f"`{api}`: input {position} — found {type(given).__name__} "
                        f"{given!r} — valid: {spec.describe()} — "
                        f"fix: pass a {spec.dtype.__name__}"
                    )
                self._values.set(spec.index, spec.dtype(given))
                rebind = True
                continue
            array = given if type(given) is np.ndarray else _as_array(api, position, given, spec)
            if array.dtype != spec.dtype:
                raise ProgramError(
                    f"`{api}`: input {position} — found dtype {array.dtype} — valid: "
                    f"{self._describe_input(position)} — fix: convert it, e.g. "
                    f"a.astype(numpy.{spec.dtype})"
                )
            if array.shape != self._input_shapes[position]:
                raise ProgramError(
                    f"`{api}`: input {position} — found shape {array.shape} — valid: "
                    f"{spec.describe()} (the program was exported with static shapes) — fix: "
                    "reshape the input, or re-export with the shape you need"
                )
            np.copyto(get(spec.index), array)
        if rebind:
            self._rebind_scalar_users()

    def _rebind_scalar_users(self) -> None:
        with memory_limit(self._max_memory):
            self._rebind_scalar_users_within_limit()

    def _rebind_scalar_users_within_limit(self) -> None:
        for positions in self._scalar_users.values():
            for position in positions:
                i = self._instruction_index[position]
                self._bound[position] = self._bind(i, self._kernels[position],
                                                   self._def.instructions[i])

    # --- execution and errors -----------------------------------------------------------

    def _execute_traced(self, tracer) -> None:
        clock = perf_counter_ns
        record = tracer.record
        name, indices, ops = self.name, self._instruction_index, self._op_names
        begin = clock()
        try:
            for position, (fn, args) in enumerate(self._bound):
                start = clock()
                fn(*args)
                record(name, indices[position], ops[position], start, clock() - start)
        except Exception as e:
            raise self._kernel_error(fn, args, e) from e  # noqa: F821
        tracer.record(name, -1, f"method {name}", begin, clock() - begin)

    def _kernel_error(self, fn, args, error: Exception) -> KernelError:
        position = next(p for p, pair in enumerate(self._bound)
                        if pair[0] is fn and pair[1] is args)
        i, key, kernel = self._instruction_index[position], self._op_names[position], \
            self._kernels[position]
        source = f"{kernel.target} kernel from {kernel.origin}" if kernel else "a Move"
        shapes = ", ".join(_describe_arg(a) for a in args)
        return KernelError(
            f"`{self._api}({self.name!r})`: instruction {i} ({key}, {source}) — raised "
            f"{type(error).__name__}: {error} — "
            + (f"arguments: ({shapes}) — " if shapes else "") +
            "fix: check the inputs' values; if they are valid, the kernel has a bug (compare "
            "with --mode aten)"
        )


def _as_array(api: str, position: int, given: object, spec: IOSpec) -> np.ndarray:
    try:
        return np.asarray(given)
    except Exception as e:
        raise ProgramError(
            f"`{api}`: input {position} — found {type(given).__name__} — valid: "
            f"{spec.describe()} as a NumPy array — fix: pass numpy.asarray(...) of it"
        ) from e


def _describe_arg(arg: object) -> str:
    if type(arg) is np.ndarray:
        return f"{arg.dtype}{list(arg.shape)}"
    if type(arg) is list:
        return "[" + ", ".join(_describe_arg(a) for a in arg) + "]"
    return repr(arg)


# portable kernels that call BLAS (matmul, einsum, tensordot): their thread pool is NumPy's
_BLAS_MODULES = frozenset({"opforge.kernels.portable.linalg", "opforge.kernels.portable.convolution",
                           "opforge.kernels.portable.normalization", "opforge.kernels.portable.pooling"})


def _reaches_pools(kernel: Kernel) -> bool:
    """Whether a kernel may run on a BLAS or OpenMP pool: native code and delegates may;
    portable kernels only where they call BLAS."""
    if kernel.target == "delegate":
        return not kernel.own_threads
    if kernel.target != "portable":
        return True
    return getattr(kernel.fn, "__module__", None) in _BLAS_MODULES
