"""``opforge.runtime.load``: a program file → a verified program with every op resolved.

    read (mmap) + verify → check each method's arenas against the memory limit → pick the
    registry (mode) → load native libraries into it → resolve every KernelCall of every
    method → LoadedProgram

Resolution happens once, at load, for every method: a program whose ops are not all
covered fails here with one ``MissingKernelError`` listing all of them, never halfway
through a call; in ATen mode an op off the allow-list (``opforge.kernels.aten_allowlist``)
fails here with one ``ProgramError`` listing every such op, before any kernel runs.
"""

from __future__ import annotations

import importlib
import os
import re
from typing import Iterable

import numpy as np

from opforge.errors import ProgramError, RegistrationError
from opforge.program import (
    ConstantStorage, DelegateCall, KernelCall, Method as MethodDef, OptionalTensorListValue, Program,
    TensorListValue, TensorValue, from_bytes, load as load_file, verify,
)
from opforge.runtime.arena import arena_bytes
from opforge.runtime.limits import MAX_MEMORY_ENV, check_memory, memory_limit
from opforge.runtime.limits import max_memory as memory_limit_of
from opforge.runtime.method import Method
from opforge.runtime.missing import MissingOp, missing_kernel_error
from opforge.runtime.registry import DEFAULT_DTYPE, Kernel, KernelRegistry
from opforge.runtime.state import LiveState
from opforge.runtime.threads import resolve_thread_count

__all__ = ["load", "LoadedProgram", "MODES", "dtype_key", "load_kernel_library"]

MODES = ("lean", "aten")


class LoadedProgram:
    """A verified program whose operators are resolved against a kernel registry.

    ``method(name)`` makes a new ``Method`` instance (its own arenas) each time it is called:
    keep the instance and call it repeatedly; make one per thread.

    >>> from opforge.runtime import load            # doctest: +SKIP
    >>> program = load("model.opf")                  # doctest: +SKIP
    >>> forward = program.method("forward")          # doctest: +SKIP
    >>> (y,) = forward(x)                            # doctest: +SKIP
    """

    def __init__(self, program: Program, registry: KernelRegistry, mode: str,
                 kernels: dict[str, tuple[Kernel | None, ...]], source: str, *,
                 max_memory: int | None = None, delegates=None, num_threads: int = 1) -> None:
        self.program = program
        self.num_threads = num_threads
        self.registry = registry
        self.mode = mode
        self.source = source
        self.max_memory = memory_limit_of(max_memory, api="LoadedProgram(max_memory=...)")
        self._kernels = kernels
        self.delegates = delegates  # opforge.runtime.delegates.DelegateSet, or None
        # one live copy of each state tensor per loaded program, shared by its methods
        self._live = LiveState(f"opforge.runtime.load({source})", program, self.max_memory)
        self._state = self._live.arrays

    @property
    def method_names(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.program.methods)

    def method(self, name: str = "forward") -> Method:
        """A new, bound instance of method ``name`` (ProgramError listing the methods)."""
        if name not in self._kernels:
            names = ", ".join(repr(n) for n in self.method_names) or "(none)"
            raise ProgramError(
                f"`LoadedProgram.method({name!r})`: method {name!r} — not in {self.source} — "
                f"valid: {names} — fix: pass one of those names (`--method NAME`)"
            )
        with memory_limit(self.max_memory):  # arenas and the kernels' bound workspaces
            return Method(self.program, self.program.method(name), self._kernels[name],
                          api=f"opforge.runtime.load({self.source}).method",
                          delegates=self.delegates, num_threads=self.num_threads,
                          mode=self.mode, state=self._state)

    # --- state: the buffers the program's methods update in place, shared by name ------------

    @property
    def state_names(self) -> tuple[str, ...]:
        """The names of the program's state tensors (e.g. ``('cache', 'count')``)."""
        return tuple(self._state)

    def read_state(self, name: str) -> "np.ndarray":
        """A copy of the live state tensor ``name``."""
        return self._state_array(name, "read_state").copy()

    def write_state(self, name: str, value: object) -> None:
        """Overwrite the live state tensor ``name`` with ``value`` (same shape and dtype)."""
        live = self._state_array(name, "write_state")
        array = np.asarray(value)
        if array.shape != live.shape or array.dtype != live.dtype:
            raise ProgramError(
                f"`LoadedProgram.write_state({name!r})`: value — found {array.dtype} of shape "
                f"{array.shape} — valid: {live.dtype} of shape {live.shape} — fix: convert "
                f"it, e.g. numpy.asarray(v, numpy.{live.dtype}).reshape({live.shape})")
        np.copyto(live, array)

    def reset_state(self, name: str | None = None) -> None:
        """Restore state ``name`` (all state without a name) to its initial value."""
        for key in ([name] if name is not None else list(self._state)):
            self._state_array(key, "reset_state")
            self._live.reset(key)

    def state_memory(self) -> dict[str, tuple[int, int | None]]:
        """Per state tensor: ``(logical bytes, resident bytes)``. A state whose initial value
        is zeros (a KV cache) takes memory page by page as calls write it, so its resident
        bytes follow the positions written; None where the system does not say (non-Linux)."""
        return {name: (array.nbytes, self._live.resident(name))
                for name, array in self._state.items()}

    def _state_array(self, name: str, api: str) -> "np.ndarray":
        live = self._state.get(name)
        if live is None:
            names = ", ".join(repr(n) for n in self._state) or "(the program has no state)"
            raise ProgramError(
                f"`LoadedProgram.{api}({name!r})`: state {name!r} — not in {self.source} — "
                f"valid: {names} — fix: pass one of those names")
        return live

    def kernel_for(self, method: str, instruction: int) -> Kernel | None:
        """The kernel resolved for ``instruction`` of ``method`` (None for Move/Free)."""
        return self._kernels[method][instruction]

    def __repr__(self) -> str:
        return f"<LoadedProgram {self.source} mode={self.mode!r} methods={self.method_names}>"


def load(source: str | os.PathLike | bytes | bytearray | memoryview | Program, *,
         mode: str = "lean", registry: KernelRegistry | None = None,
         kernels: Iterable[str | os.PathLike] = (), allow_ops: Iterable[str] = (),
         max_memory: int | None = None, num_threads: int | None = None,
         executor: str = "lean") -> LoadedProgram:
    """Load, verify and resolve a program for running.

    ``source`` is a path (memory-mapped; constants are never copied), the file's bytes, or
    an ``opforge.program.Program``. ``mode`` picks the default registry: ``"lean"``
    (portable NumPy kernels, no torch) or ``"aten"`` (PyTorch's own kernels); ``registry``
    replaces that default. Each of ``kernels`` is added to the registry first: the path of a
    native kernel library, or a Python registrar ``"package.module:function"`` called with
    the registry (see ``load_kernel_library``). Raises ``ProgramError`` for a bad file and
    one ``MissingKernelError`` listing every operator no kernel serves.

    ATen mode runs only operators on its allow-list (``opforge.kernels.aten_allowlist``):
    core ATen out variants, what opforge's export emits, custom ops registered through
    ``opforge.torch_bridge``, and ``allow_ops`` — your own torch ops, as exact
    ``"ns::op.overload"`` keys or ``"ns::op"`` for every overload (added to the registry's
    allow-list; lean mode runs only registered kernels and ignores it). Anything else, and
    always the deny-listed ops that touch files, processes or the network, is a
    ``ProgramError`` at load, before any kernel runs.

    ``max_memory`` bounds, in bytes, what one method instance allocates for the program:
    its arenas (checked here, for every method, and again when an instance is made) and
    the workspaces its kernels allocate when bound. Default: ``OPFORGE_MAX_MEMORY`` (bytes,
    or ``"16G"``-style) or else 8 GiB (``opforge.runtime.limits``). Over it:
    ``ProgramError``, before anything is allocated.

    ``num_threads`` is how many threads a call may use, in every pool it can reach (NumPy's
    BLAS, OpenMP in native kernels, torch's intra-op pool in ATen mode; each set for the
    call and restored after). Default: ``OPFORGE_NUM_THREADS`` (a count or ``auto``), else 1
    (``opforge.runtime.threads``).

    >>> from opforge.program import (Program, Method, TensorValue, ArenaStorage, ScalarType,
    ...                              KernelCall, Operator, MemoryPlan)
    >>> import numpy as np
    >>> x = TensorValue(ScalarType.FLOAT32, (3,), storage=ArenaStorage(0, 0))
    >>> y = TensorValue(ScalarType.FLOAT32, (3,), storage=ArenaStorage(0, 64))
    >>> forward = Method("forward", (x, y), (0,), (1,), (KernelCall(0, (0, 1)),),
    ...                  (Operator("aten::relu", "out"),), MemoryPlan((128,)))
    >>> program = load(Program(methods=(forward,)))
    >>> program.method("forward")(np.array([-1.0, 0.0, 2.0], np.float32))[0].tolist()
    [0.0, 0.0, 2.0]

    ``executor="native"`` runs the program in the native C++ runtime instead (a
    ``opforge.runtime.native_executor.NativeProgram``: same ``method(name)`` and state
    calls; ``kernels`` then names native kernel libraries only); ``"lean"``, the default,
    is this NumPy runtime.
    """
    if executor != "lean":
        return _load_native(source, executor, mode, registry, kernels, allow_ops, max_memory,
                            num_threads)
    api, label, program = _read(source, mode)
    if mode not in MODES:
        raise ProgramError(f"`{api}`: mode {mode!r} — valid: " + ", ".join(map(repr, MODES))
                           + " — fix: mode='lean' (NumPy kernels) or mode='aten' (PyTorch)")
    threads = resolve_thread_count(num_threads, api=api)
    limit = memory_limit_of(max_memory, api=api)
    for method in program.methods:
        check_memory(api, f"method {method.name!r} memory plan "
                     f"({len(method.memory_plan.arena_sizes)} arena(s))",
                     arena_bytes(method), limit=limit,
                     fix="1. check that the file is the program you exported (a corrupt or "
                         "hostile file asks for absurd arenas); 2. if the model really needs "
                         f"it, raise the limit: load(..., max_memory=N) or {MAX_MEMORY_ENV}=N")
    if registry is None:
        registry = KernelRegistry.portable() if mode == "lean" else KernelRegistry.aten()
    if allow_ops and mode == "aten":
        registry.allow_ops(allow_ops)
    for library in kernels:
        load_kernel_library(api, library, registry)
    resolved: dict[str, tuple[Kernel | None, ...]] = {}
    missing: dict[str, MissingOp] = {}
    refused: dict[str, tuple[str, MissingOp]] = {}
    for method in program.methods:
        resolved[method.name] = _resolve(api, method, registry, missing, refused)
    if refused:
        raise _refused_error(api, refused)
    if missing:
        raise missing_kernel_error(api, list(missing.values()), registry, mode)
    delegates = None
    if program.delegates:
        from opforge.backends.base import BackendContext
        from opforge.runtime.delegates import DelegateSet

        delegates = DelegateSet(api, program, BackendContext(registry, limit, mode))
        for method in program.methods:
            for i, instruction in enumerate(method.instructions):
                if type(instruction) is DelegateCall:
                    delegates.check_call(method, i, instruction)
    return LoadedProgram(program, registry, mode, resolved, label, max_memory=limit,
                         delegates=delegates, num_threads=threads)


EXECUTORS = ("lean", "native")


def _load_native(source, executor, mode, registry, kernels, allow_ops, max_memory, num_threads):
    """``load(..., executor="native")``: the native runtime's program, after refusing what
    it does not take (ATen mode, a Python registry)."""
    if executor not in EXECUTORS or mode != "lean" or registry is not None or allow_ops:
        found = (f"executor {executor!r}" if executor not in EXECUTORS else
                 f"mode {mode!r}" if mode != "lean" else
                 "a registry" if registry is not None else "allow_ops")
        raise ProgramError(
            f"`opforge.runtime.load(executor={executor!r})`: {found} — valid: executor 'lean' "
            "(the NumPy runtime, any mode or registry) or 'native' (the C++ runtime: its "
            "portable kernels plus native kernel libraries in kernels=[...]) — fix: drop the "
            "option, or use executor='lean'")
    from opforge.runtime.native_executor import load_native

    return load_native(source, kernels=kernels, max_memory=max_memory, num_threads=num_threads)


def _read(source: object, mode: str) -> tuple[str, str, Program]:
    """``(api for messages, short label, verified program)``."""
    if isinstance(source, Program):
        label = "<Program>"
        api = f"opforge.runtime.load({label}, mode={mode!r})"
        try:
            verify(source)
        except ProgramError as e:
            message = str(e).removeprefix("`opforge.program.verify()`: ")
            raise ProgramError(f"`{api}`: {message}") from None
        return api, label, source
    if isinstance(source, (bytes, bytearray, memoryview)):
        label = f"<{len(source)} bytes>"
        return f"opforge.runtime.load({label}, mode={mode!r})", label, from_bytes(source)
    if isinstance(source, (str, os.PathLike)):
        label = repr(os.fspath(source))
        return f"opforge.runtime.load({label}, mode={mode!r})", label, load_file(source)
    raise ProgramError(
        f"`opforge.runtime.load()`: source — found {type(source).__name__} — valid: a path, "
        "the file's bytes, or an opforge.program.Program — fix: pass the .opf file's path"
    )


_REGISTRAR = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*\Z")


def load_kernel_library(api: str, library: str | os.PathLike, registry: KernelRegistry) -> None:
    """Add one kernel library's kernels to ``registry``.

    ``"package.module:function"`` names a Python registrar called as ``function(registry)``
    (e.g. ``"opforge.examples.my_ops_numpy:register_example_kernels"``); anything else is
    the path of a native library, loaded by ``opforge.runtime.native.load_library``.
    """
    spec = os.fspath(library)
    if _REGISTRAR.match(spec) and not os.path.exists(spec):
        module_name, _, function = spec.partition(":")
        try:
            register = getattr(importlib.import_module(module_name), function)
        except (ImportError, AttributeError) as e:
            raise RegistrationError(
                f"`{api}`: kernel registrar {spec!r} — cannot import it ({e}) — valid: "
                "'package.module:function' taking the registry, or a native library path — "
                "fix: check the spelling and that the module is importable"
            ) from None
        register(registry)
        return
    if not os.path.lexists(spec):
        # a RegistrationError, not the BuildError NativeLibrary raises for a broken file:
        # nothing was built or is wrong with a library here; the user named a path that
        # does not exist (usually a build not run yet, or a path relative to another dir)
        raise RegistrationError(
            f"`{api}`: kernel library {spec!r} — no such file ({os.path.abspath(spec)}) — "
            "valid: a native library built by `opforge build`, or a Python registrar "
            "'package.module:function' — fix: check the path (relative to the current "
            "directory), or build the library first with `opforge build MANIFEST -s ... -o LIB`"
        )
    try:
        native = importlib.import_module("opforge.runtime.native")
    except ModuleNotFoundError as e:
        if e.name != "opforge.runtime.native":
            raise
        raise RegistrationError(
            f"`{api}`: kernel library {spec!r} — native kernel loading is not built into this "
            "opforge yet (no opforge.runtime.native) — valid: a Python registrar "
            "'package.module:function' — fix: 1. register NumPy kernels with "
            "registry.register(...) or a registrar; 2. or run in ATen mode"
        ) from None
    native.load_library(library, registry)


def dtype_key(method: MethodDef, instruction: KernelCall) -> str:
    """The dtype key an instruction is resolved with: the lower-case ScalarType name of its
    first tensor argument (looking into tensor lists), or ``"default"`` without one."""
    values = method.values
    for a in instruction.args:
        value = values[a]
        kind = type(value)
        if kind is TensorValue:
            return value.dtype.name.lower()
        if kind in (TensorListValue, OptionalTensorListValue):
            for item in value.items:
                if item is not None:
                    return values[item].dtype.name.lower()
    return DEFAULT_DTYPE


def _resolve(api: str, method: MethodDef, registry: KernelRegistry,
             missing: dict[str, MissingOp],
             refused: dict[str, tuple[str, MissingOp]]) -> tuple[Kernel | None, ...]:
    kernels: list[Kernel | None] = []
    cache: dict[tuple[int, str], Kernel | None] = {}
    for i, instruction in enumerate(method.instructions):
        kind = type(instruction)
        if kind is not KernelCall:  # Move, Free; a DelegateCall is bound to its delegate
            kernels.append(None)
            continue
        dtype = dtype_key(method, instruction)
        slot = (instruction.op, dtype)
        if slot not in cache:
            cache[slot] = registry.lookup(method.operators[instruction.op].key, dtype)
        kernel = cache[slot]
        if kernel is None:
            key = method.operators[instruction.op].key
            reason = registry.refusal(key)
            if reason is not None:
                refused.setdefault(key, (reason, MissingOp(key)))[1].add(method.name, i, dtype)
            else:
                missing.setdefault(key, MissingOp(key)).add(method.name, i, dtype)
        else:
            _check_written(api, method, i, instruction, kernel)
        kernels.append(kernel)
    return tuple(kernels)


def _refused_error(api: str, refused: dict[str, tuple[str, MissingOp]]) -> ProgramError:
    """One error naming every operator ATen mode refuses, why, and how to allow it."""
    lines = [f"  {key} ({op.where()}): {reason}" for key, (reason, op) in refused.items()]
    denied = all(reason.startswith("deny-listed") for reason, _ in refused.values())
    fix = ("none: deny-listed operators touch files, processes or the network and never run "
           "from a program file; re-export the model without them" if denied else
           "1. re-export the model with opforge.export (it emits only allowed operators); "
           "2. for your own torch operator, register it through opforge.torch_bridge "
           "(register / register_manifest), or allow it explicitly: "
           "load(..., allow_ops=['ns::op.overload']) or registry.allow_ops([...]) "
           "(deny-listed operators cannot be allowed)")
    return ProgramError(
        f"`{api}`: {len(refused)} operator(s) refused in ATen mode —\n" + "\n".join(lines)
        + "\n— valid: core ATen out variants, the operators opforge's export emits, custom "
        "operators registered through opforge.torch_bridge or allowed with allow_ops — fix: "
        + fix)


def _check_written(api: str, method: MethodDef, i: int, instruction: KernelCall,
                   kernel: Kernel) -> None:
    """Refuse a constant in an argument the kernel writes (its schema's ``Tensor(a!)``).

    Constants are read-only views of the file (or of the caller's bytes): a native kernel
    writing one would fault on the mapping or corrupt the caller's memory. Kernels that
    declare no ``written`` positions (portable NumPy ones) are refused by NumPy itself.
    """
    values = method.values
    state = {slot.value for slot in method.state}
    for position in getattr(kernel.fn, "written", ()):
        if position >= len(instruction.args):
            continue  # the argument count is the kernel's own check, at bind
        index = instruction.args[position]
        value = values[index]
        items = value.items if type(value) in (TensorListValue, OptionalTensorListValue) \
            else (index,)
        for item in items:
            if item is None:
                continue
            tensor = values[item]
            if type(tensor) is TensorValue and type(tensor.storage) is ConstantStorage and \
                    item not in state:  # a state's value is its live copy, written in place
                raise ProgramError(
                    f"`{api}`: method {method.name!r} instruction {i} ({kernel.key}) argument "
                    f"{position} — value {item}, a constant tensor, where the kernel writes "
                    "its output — valid: an arena tensor — fix: re-export the model; a "
                    "program whose outputs are constants was altered or corrupted")
