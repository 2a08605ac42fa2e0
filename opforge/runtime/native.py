"""Native kernel libraries in the lean runtime: load, check, and call them from NumPy.

    NativeLibrary(path)          dlopen + ``opforge_register_kernels()`` + ABI check
      .kernel("my_ops::mul3.out") → NativeKernel: a portable-convention callable
    load_library(path, registry) every op of the library into a ``KernelRegistry``

NumPy and ctypes only (no torch, no compiler). The structs below mirror
``opforge/kernel_abi.h`` field for field; ``docs/kernel-abi.md`` documents them.

# Design
#
# A library is refused before any of its code runs unless the file is a complete ELF
# shared object (every loadable segment and the section table inside the file), and
# before any entry is read unless the table's first field, abi_version, equals ours.
#
# A NativeKernel serves one out overload and dispatches between the library's bindings of
# it (ExecuTorch arg_meta): the first dtype-specific binding whose tensors' dtypes match
# the actual arrays wins, else the fallback (arg_meta: null). Calling it marshals each
# argument into an ``opforge_arg`` by the parameter kind the library declared, so a kernel
# never sees a value of the wrong kind. ``bind(args)`` does the marshalling and the
# dispatch once for arguments that stay the same (the executor's arena views) and returns
# a call that only resets the context and jumps into C: this is the runtime's fast path.
"""

from __future__ import annotations

import ctypes
import os
import struct
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from opforge.native.abi import ABI_VERSION, KIND_OPTIONAL, KIND_SCALAR, MESSAGE_SIZE, \
    REGISTER_SYMBOL, ArgTag
from opforge._user_files import require_regular_file
from opforge.errors import BuildError, KernelError, SchemaError
from opforge.schema import FunctionSchema
from opforge.runtime.threads import note_library_loaded

__all__ = ["NativeLibrary", "NativeKernel", "NativeEntry", "load_library", "kernel_table",
           "enable_crash_reports", "label_crash_frame", "ABI_VERSION"]


# --- the ABI's structs (kernel_abi.h) -------------------------------------------------

class CTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("sizes", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("dtype", ctypes.c_int32),
                ("rank", ctypes.c_int32)]


class _CList(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("size", ctypes.c_int64)]


class _CValue(ctypes.Union):
    _fields_ = [("i", ctypes.c_int64), ("d", ctypes.c_double), ("tensor", CTensor),
                ("list", _CList)]


class CArg(ctypes.Structure):
    _fields_ = [("tag", ctypes.c_int32), ("reserved", ctypes.c_int32), ("v", _CValue)]


class CContext(ctypes.Structure):
    _fields_ = [("status", ctypes.c_int32), ("reserved", ctypes.c_int32),
                ("runtime", ctypes.c_void_p), ("message", ctypes.c_char * MESSAGE_SIZE)]


KernelFn = ctypes.CFUNCTYPE(None, ctypes.POINTER(CContext), ctypes.POINTER(CArg), ctypes.c_int64)


class CKernelEntry(ctypes.Structure):
    _fields_ = [("op", ctypes.c_char_p), ("overload", ctypes.c_char_p),
                ("schema", ctypes.c_char_p), ("kernel_name", ctypes.c_char_p),
                ("dtype_key", ctypes.c_char_p), ("source", ctypes.c_char_p),
                ("fn", ctypes.c_void_p), ("arg_kinds", ctypes.POINTER(ctypes.c_int32)),
                ("meta_args", ctypes.POINTER(ctypes.c_int32)), ("num_args", ctypes.c_int32),
                ("num_meta", ctypes.c_int32)]


class CLibrary(ctypes.Structure):
    _fields_ = [("abi_version", ctypes.c_uint32), ("entry_size", ctypes.c_uint32),
                ("name", ctypes.c_char_p), ("built_by", ctypes.c_char_p),
                ("num_kernels", ctypes.c_int64), ("kernels", ctypes.POINTER(CKernelEntry))]


# NumPy dtype -> c10::ScalarType number (the numbers opforge.program.ScalarType uses).
_DTYPE_NUMBERS = {np.dtype(k): v for k, v in [
    ("uint8", 0), ("int8", 1), ("int16", 2), ("int32", 3), ("int64", 4), ("float16", 5),
    ("float32", 6), ("float64", 7), ("complex64", 9), ("complex128", 10), ("bool", 11),
    ("uint16", 27), ("uint32", 28), ("uint64", 29)]}
_DTYPE_NAMES = {v: str(k) for k, v in _DTYPE_NUMBERS.items()}


# --- entries ----------------------------------------------------------------------------

@dataclass(frozen=True)
class NativeEntry:
    """One row of a library's kernel table (one binding of one out overload)."""

    key: str  # "my_ops::mul3.out"
    schema: str
    kernel_name: str  # "custom::native::mul3_out_impl"
    dtype_key: str  # "default" or "v1/6|6"
    source: str  # the manifest entry, "my_ops.yaml:8"
    fn: int  # the boxed kernel's address (0: not defined)
    arg_kinds: tuple[int, ...]
    meta: tuple[tuple[int, int, tuple[int, ...] | None], ...]  # (arg index, dtype, dim order)

    def matches(self, args: Sequence[object]) -> bool:
        """Do the actual arrays' dtypes (and dim orders) fit this binding's arg_meta?"""
        for index, dtype, order in self.meta:
            a = args[index]
            if not isinstance(a, np.ndarray) or _DTYPE_NUMBERS.get(a.dtype) != dtype:
                return False
            if order is not None and _dim_order(a) != order:
                return False
        return True


def _dim_order(a: np.ndarray) -> tuple[int, ...]:
    return tuple(sorted(range(a.ndim), key=lambda d: (-abs(a.strides[d]), d)))


def _parse_meta(dtype_key: str, indices: list[int]) -> tuple:
    if dtype_key == "default":
        return ()
    parts = dtype_key.removeprefix("v1/").split("|")
    meta = []
    for index, part in zip(indices, parts):
        dtype, _, order = part.partition(";")
        meta.append((index, int(dtype), tuple(int(x) for x in order.split(",")) if order else None))
    return tuple(meta)


# --- the library ------------------------------------------------------------------------

def _refuse(path: str, found: str, fix: str = "rebuild it with `opforge build`") -> BuildError:
    return BuildError(f"`opforge.runtime.native.NativeLibrary({path!r})`: {found} — valid: a "
                      f"shared library built by `opforge build` for kernel ABI version "
                      f"{ABI_VERSION} — fix: {fix}")


def _mindspore_kernels(path: str) -> list[str]:
    """The kernels a MindSpore AOT library exports (a name beside NameInferShape,
    NameInferType, NameInit or NameOpProto), found with ``nm``; [] when none or no nm."""
    import subprocess

    try:
        out = subprocess.run(["nm", "-D", "--defined-only", path], capture_output=True,
                             text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    names = {line.split()[-1] for line in out.splitlines() if len(line.split()) == 3}
    found = set()
    for name in names:
        for suffix in ("InferShape", "InferType", "Init", "OpProto"):
            if name.endswith(suffix) and name[:-len(suffix)] in names:
                found.add(name[:-len(suffix)])
    if "opforge_ms_string_abi" in names and not found:
        found = {n for n in names if n[:1].isupper()}
    return sorted(found)[:5]


def _check_elf(path: str) -> None:
    """Refuse files that are not complete ELF shared objects, before dlopen sees them."""
    try:
        kind = require_regular_file(path)  # opening a FIFO would block until a writer came
        if kind is not None:
            raise _refuse(path, f"it is {kind}, not a regular file", "pass the library's path")
        with open(path, "rb") as f:
            data = f.read(64)
            size = os.fstat(f.fileno()).st_size
            if len(data) < 64 or data[:4] != b"\x7fELF":
                raise _refuse(path, "the file is not a shared object (no ELF header)"
                              if data[:4] != b"\x7fELF" else "the file is truncated (short ELF header)")
            is64, little = data[4] == 2, data[5] == 1
            if not is64 or not little:
                return  # 32-bit or big-endian: let the dynamic loader judge it
            e_type, = struct.unpack_from("<H", data, 16)
            if e_type != 3:  # ET_DYN
                raise _refuse(path, f"the file is an ELF file of type {e_type}, not a shared "
                              "object (ET_DYN = 3)")
            phoff, shoff = struct.unpack_from("<QQ", data, 32)
            phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", data, 54)
            if phoff + phentsize * phnum > size or shoff + shentsize * shnum > size:
                raise _refuse(path, f"the file is truncated ({size} bytes; its ELF tables "
                              "reach past the end)")
            f.seek(phoff)
            table = f.read(phentsize * phnum)
            for i in range(phnum):
                p_type, _, p_offset = struct.unpack_from("<IIQ", table, i * phentsize)
                p_filesz, = struct.unpack_from("<Q", table, i * phentsize + 32)
                if p_type == 1 and p_offset + p_filesz > size:  # PT_LOAD
                    raise _refuse(path, f"the file is truncated ({size} bytes; a loadable "
                                  f"segment ends at byte {p_offset + p_filesz})")
    except OSError as e:
        raise _refuse(path, f"cannot read it ({e.strerror or e})", "check the path") from None


def _entry(raw: CKernelEntry) -> NativeEntry:
    kinds = tuple(raw.arg_kinds[i] for i in range(raw.num_args))
    meta_indices = [raw.meta_args[i] for i in range(raw.num_meta)]
    dtype_key = raw.dtype_key.decode()
    return NativeEntry(f"{raw.op.decode()}.{raw.overload.decode()}", raw.schema.decode(),
                       raw.kernel_name.decode(), dtype_key, raw.source.decode(),
                       raw.fn or 0, kinds, _parse_meta(dtype_key, meta_indices))


def _open(path: str) -> tuple[ctypes.CDLL, CLibrary, tuple[NativeEntry, ...]]:
    """dlopen a checked ELF file, call its registration function, check the ABI version."""
    _check_elf(path)
    try:
        dll = ctypes.CDLL(path, mode=getattr(os, "RTLD_LOCAL", 0) | os.RTLD_NOW)
        note_library_loaded(path)  # it may bring an OpenMP or BLAS pool (runtime/threads.py)
    except OSError as e:
        raise _refuse(path, f"the dynamic loader refused it ({e})") from None
    register = getattr(dll, REGISTER_SYMBOL, None)
    if register is None:
        kernels = _mindspore_kernels(path)
        if kernels:  # MindSpore's AOT signature: it runs from a vendor package
            raise _refuse(
                path, f"it is a MindSpore AOT kernel library (kernel(s) {', '.join(kernels)}), "
                f"not an opforge kernel library (no `{REGISTER_SYMBOL}`)",
                "load it as a MindSpore vendor package: 1. package the ops the program uses: "
                "in Python, opforge.mindspore.write_package([Custom('lib.so:Name', ...).op], "
                "'opp/vendors/mine') (or from sources: opforge msop build -o op_host -k "
                "op_kernel -i --install_path opp); 2. run with OPFORGE_CUSTOM_OPP_PATH=opp and "
                "--kernels opforge.mindspore:register_vendor_ops")
        raise _refuse(path, f"it exports no `{REGISTER_SYMBOL}` (not an opforge kernel library)")
    register.restype = ctypes.c_void_p
    register.argtypes = []
    address = register()
    if not address:
        raise _refuse(path, f"`{REGISTER_SYMBOL}()` returned NULL")
    version = ctypes.c_uint32.from_address(address).value  # first field in every version
    if version != ABI_VERSION:
        raise _refuse(path, f"it was built for kernel ABI version {version}, and this runtime "
                      f"implements version {ABI_VERSION}",
                      "rebuild the library with this opforge (`opforge build`), or run it with "
                      f"an opforge whose kernel ABI version is {version}")
    table = CLibrary.from_address(address)
    if table.entry_size != ctypes.sizeof(CKernelEntry):
        raise _refuse(path, f"its kernel entries are {table.entry_size} bytes; ABI version "
                      f"{ABI_VERSION} has {ctypes.sizeof(CKernelEntry)}")
    return dll, table, tuple(_entry(table.kernels[i]) for i in range(table.num_kernels))


def kernel_table(path: str | os.PathLike) -> tuple[NativeEntry, ...]:
    """The rows of a library's kernel table, undefined kernels included (fn == 0)."""
    return _open(os.path.abspath(os.fspath(path)))[2]


class NativeLibrary:
    """A loaded kernel library: its ABI-checked kernel table, callable kernel by kernel.

    >>> lib = NativeLibrary("libmy_ops.so")                       # doctest: +SKIP
    >>> lib.keys()                                                 # doctest: +SKIP
    ['my_ops::mul3.out', 'my_ops::mul4.out', 'my_ops::minmax.out', 'my_ops::scaled_sum.out']
    >>> x = np.arange(3, dtype=np.float32); out = np.empty_like(x)  # doctest: +SKIP
    >>> lib.kernel("my_ops::mul3.out")(x, out); out.tolist()       # doctest: +SKIP
    [0.0, 3.0, 6.0]
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = os.path.abspath(os.fspath(path))
        enable_crash_reports()
        self._dll, table, self.entries = _open(self.path)
        self.name = (table.name or b"").decode()
        self.built_by = (table.built_by or b"").decode()
        undefined = [e for e in self.entries if not e.fn]
        if undefined:
            listing = "; ".join(f"{e.kernel_name} for {e.key} ({e.source})" for e in undefined)
            raise _refuse(self.path, f"kernel(s) not defined in the library: {listing}",
                          "define them in the sources (see `opforge build`'s message for the "
                          "expected declaration) and rebuild")
        self._kernels: dict[str, NativeKernel] = {}

    def keys(self) -> list[str]:
        """The out overloads the library has kernels for, in table order."""
        return list(dict.fromkeys(e.key for e in self.entries))

    def kernel(self, key: str) -> NativeKernel:
        """The callable kernel of out overload ``key`` (e.g. ``"my_ops::mul3.out"``)."""
        if key not in self._kernels:
            entries = [e for e in self.entries if e.key == key]
            if not entries:
                raise KernelError(
                    f"`NativeLibrary({self.path!r}).kernel({key!r})`: no kernel for {key} — "
                    f"valid: {', '.join(self.keys()) or '(none)'} — fix: build the library with "
                    "that op selected")
            self._kernels[key] = NativeKernel(self, key, entries)
        return self._kernels[key]

    def __repr__(self) -> str:
        return f"<NativeLibrary {self.name!r} {self.path} ({len(self.entries)} kernels)>"


# --- calling a kernel ---------------------------------------------------------------------

def _tensor_into(slot: CTensor, a: object, keep: list, where: str) -> None:
    if not isinstance(a, np.ndarray):
        raise KernelError(f"{where}: expects a numpy array, got {type(a).__name__}")
    dtype = _DTYPE_NUMBERS.get(a.dtype)
    if dtype is None:
        raise KernelError(f"{where}: dtype {a.dtype} has no kernel ABI number (valid: "
                          f"{', '.join(sorted(_DTYPE_NAMES.values()))})")
    itemsize = a.itemsize
    if any(s % itemsize for s in a.strides):
        raise KernelError(f"{where}: strides {a.strides} are not whole elements; pass a copy")
    rank = a.ndim
    shape = (ctypes.c_int64 * max(rank, 1))(*a.shape)
    strides = (ctypes.c_int64 * max(rank, 1))(*[s // itemsize for s in a.strides])
    keep.append((shape, strides, a))
    slot.data = a.__array_interface__["data"][0]
    slot.sizes = shape
    slot.strides = strides
    slot.dtype = dtype
    slot.rank = rank


def _list_into(arg: CArg, tag: int, ctype, values: Sequence, keep: list) -> None:
    buffer = (ctype * max(len(values), 1))(*values)
    keep.append(buffer)
    arg.tag = tag
    arg.v.list.data = ctypes.cast(buffer, ctypes.c_void_p)
    arg.v.list.size = len(values)


def _fill(arg: CArg, kind: int, value: object, keep: list, where: str) -> None:
    """Marshal one Python value into ``arg`` by the parameter's kind."""
    base = kind & 0xFF
    if value is None:
        if kind & KIND_OPTIONAL:
            arg.tag = ArgTag.NONE
            return
        raise KernelError(f"{where}: got None for a non-optional argument")
    if base == ArgTag.TENSOR and isinstance(value, (bool, int, float, np.bool_, np.integer,
                                                   np.floating)):
        # a Python number where the schema has a Tensor (ATen's wrapped number, as
        # torch.export leaves `x * 0.5` in aten::mul.Tensor): passed as a scalar value
        _fill(arg, KIND_SCALAR, value, keep, where)
    elif base == ArgTag.TENSOR:
        arg.tag = ArgTag.TENSOR
        _tensor_into(arg.v.tensor, value, keep, where)
    elif base in (ArgTag.TENSOR_LIST, ArgTag.OPT_TENSOR_LIST):
        items = (CTensor * max(len(value), 1))()
        for i, item in enumerate(value):
            if item is None and base == ArgTag.OPT_TENSOR_LIST:
                items[i].dtype = -1
            else:
                _tensor_into(items[i], item, keep, f"{where}[{i}]")
        keep.append(items)
        arg.tag = base
        arg.v.list.data = ctypes.cast(items, ctypes.c_void_p)
        arg.v.list.size = len(value)
    elif base == ArgTag.INT:
        arg.tag, arg.v.i = ArgTag.INT, int(value)
    elif base == ArgTag.DOUBLE:
        arg.tag, arg.v.d = ArgTag.DOUBLE, float(value)
    elif base == ArgTag.BOOL:
        arg.tag, arg.v.i = ArgTag.BOOL, bool(value)
    elif base == KIND_SCALAR:
        if isinstance(value, (bool, np.bool_)):
            arg.tag, arg.v.i = ArgTag.BOOL, bool(value)
        elif isinstance(value, (int, np.integer)):
            arg.tag, arg.v.i = ArgTag.INT, int(value)
        else:
            arg.tag, arg.v.d = ArgTag.DOUBLE, float(value)
    elif base == ArgTag.SCALAR_TYPE:
        number = value if isinstance(value, int) else _DTYPE_NUMBERS.get(np.dtype(value))
        if number is None:
            raise KernelError(f"{where}: dtype {value} has no kernel ABI number")
        arg.tag, arg.v.i = ArgTag.SCALAR_TYPE, number
    elif base == ArgTag.INT_LIST:
        _list_into(arg, ArgTag.INT_LIST, ctypes.c_int64, [int(v) for v in value], keep)
    elif base == ArgTag.DOUBLE_LIST:
        _list_into(arg, ArgTag.DOUBLE_LIST, ctypes.c_double, [float(v) for v in value], keep)
    elif base == ArgTag.BOOL_LIST:
        _list_into(arg, ArgTag.BOOL_LIST, ctypes.c_uint8, [bool(v) for v in value], keep)
    elif base == ArgTag.STRING:
        data = str(value).encode()
        _list_into(arg, ArgTag.STRING, ctypes.c_char, list(data), keep)
        arg.v.list.size = len(data)
    else:
        raise KernelError(f"{where}: parameter kind {kind:#x} is not part of kernel ABI "
                          f"version {ABI_VERSION}")


# out overloads whose result size depends on the inputs' values (opforge/program/produced.py)
_SIZED_BY_DATA = frozenset({"aten::nonzero.out", "aten::masked_select.out", "aten::bincount.out"})


class NativeKernel:
    """One out overload of a native library, following the portable calling convention.

    ``kernel(*args)``: positional arguments of the out overload in schema order, outs
    included; tensors are NumPy arrays (any strides), written in place; returns None. A
    failure the kernel reports becomes ``KernelError`` naming the op and the message.

    ``kernel.bind(args) -> (call, ())``: marshal ``args`` once (they must stay alive and
    keep their shapes: the executor's arena views) and get a zero-argument call.
    """

    def __init__(self, library: NativeLibrary, key: str, entries: list[NativeEntry]) -> None:
        self.library, self.key = library, key
        self.specific = tuple(e for e in entries if e.meta)
        self.fallback = next((e for e in entries if not e.meta), None)
        first = entries[0]
        self.schema, self.kinds = first.schema, first.arg_kinds
        self.written = _written_arguments(library.path, key, first.schema)
        self.origin = library.path
        self.__name__ = self.__qualname__ = key  # for tracers and error messages
        self._functions = {e.fn: _named(_invoker(KernelFn(e.fn)), _frame_name(self, e))
                           for e in entries}

    def select(self, args: Sequence[object]) -> NativeEntry:
        """The binding that serves these arguments (arg_meta match, else the fallback)."""
        for entry in self.specific:
            if entry.matches(args):
                return entry
        if self.fallback is not None:
            return self.fallback
        found = ", ".join(str(a.dtype) for a in args if isinstance(a, np.ndarray))
        wanted = "; ".join(e.dtype_key for e in self.specific)
        raise KernelError(
            f"`{self.key}` (native, {self.library.path}): no kernel for these dtypes — found "
            f"{found} — valid: {wanted} — fix: add a fallback kernel (arg_meta: null) to the "
            "manifest, or convert the inputs")

    def _marshal(self, args: Sequence[object]) -> tuple[NativeEntry, ctypes.Array, list]:
        if len(args) != len(self.kinds):
            raise KernelError(f"`{self.key}` (native): expected {len(self.kinds)} arguments "
                              f"({self.schema}), got {len(args)}")
        for i in self.written:
            if _read_only(args[i]):
                raise KernelError(
                    f"`{self.key}` (native) argument {i}: the kernel writes it, and it is a "
                    "read-only array (a constant of the program, or memory the caller owns) "
                    "— valid: a writable array — fix: re-export the program; a program whose "
                    "outputs are constants was altered")
        entry = self.select(args)
        boxed = (CArg * len(args))()
        keep: list = []
        for i, (kind, value) in enumerate(zip(self.kinds, args)):
            _fill(boxed[i], kind, value, keep, f"`{self.key}` (native) argument {i}")
        return entry, boxed, keep

    def _failed(self, entry: NativeEntry, context: CContext) -> KernelError:
        message = context.message.decode("utf-8", "replace") or "(no message)"
        return KernelError(f"`{self.key}`: native kernel {entry.kernel_name} "
                           f"({os.path.basename(self.library.path)}) reported failure: {message}")

    def __call__(self, *args: object) -> object:
        entry, boxed, keep = self._marshal(args)
        context = CContext()
        self._functions[entry.fn](ctypes.byref(context), boxed, len(args))
        if context.status:
            raise self._failed(entry, context)
        return self._result(args, keep)

    def _result(self, args: Sequence[object], keep: list) -> object:
        """A kernel with a data-dependent result (``nonzero.out``) sets its out's leading
        size; the view of the result it wrote, as the portable kernel returns (else None)."""
        if self.key not in _SIZED_BY_DATA:
            return None
        out = args[-1]
        shape = next(s for s, _, a in (k for k in keep if type(k) is tuple) if a is out)
        count = int(shape[0])
        return out.reshape(-1)[:count * (out.size // max(out.shape[0], 1))].reshape(
            (count, *out.shape[1:]))

    def bind(self, args: Sequence[object]) -> tuple[Callable[[], None], tuple]:
        """Marshal ``args`` once; return ``(call, ())`` for the executor to run repeatedly."""
        entry, boxed, keep = self._marshal(tuple(args))
        context = CContext()
        function, context_ref, n = self._functions[entry.fn], ctypes.byref(context), len(args)
        failed = self._failed

        # a kernel with a data-dependent size returns its result's view, others None
        result = self._result if self.key in _SIZED_BY_DATA else None
        marshalled = tuple(args)

        def call() -> object:
            context.status = 0
            function(context_ref, boxed, n)
            if context.status:
                raise failed(entry, context)
            return result(marshalled, keep) if result is not None else None

        call.keep = (boxed, keep, context)  # the marshalled views live as long as the call
        call.crash_label = _frame_name(self, entry)
        return _named(call, call.crash_label), ()

    def __repr__(self) -> str:
        return f"<NativeKernel {self.key} from {self.library.path}>"


# --- naming the kernel in a crash report ---------------------------------------------
#
# A native kernel that faults kills the process; nothing in Python runs after a SIGSEGV.
# Python's faulthandler (enabled when a library loads, see ``enable_crash_reports``) still
# prints every thread's stack, one line per frame: the file and the code object's name.
# So the frame that jumps into C is given a code object whose name says which kernel it is
# (op, kernel symbol) and whose file is the library: the report names them at no run-time
# cost. The executor renames a bound call once more to add the method and instruction.

def _frame_name(kernel: "NativeKernel", entry: NativeEntry) -> str:
    return f"native kernel {entry.kernel_name} for {kernel.key} [{entry.source}]"


def _invoker(function):
    def invoke(context, boxed, n):
        return function(context, boxed, n)
    return invoke


def _named(function, name: str, filename: str | None = None):
    """A copy of ``function`` whose frames read ``name`` (and ``filename``) in tracebacks
    and in faulthandler's crash reports."""
    code = function.__code__.replace(co_name=name, co_qualname=name,
                                     co_filename=filename or function.__code__.co_filename)
    named = type(function)(code, function.__globals__, name, function.__defaults__,
                           function.__closure__)
    named.__dict__.update(function.__dict__)
    return named


def label_crash_frame(call, label: str, filename: str):
    """``call`` renamed for crash reports (the executor adds the instruction); a call
    without ``crash_label`` (not native) is returned as it is."""
    if getattr(call, "crash_label", None) is None:
        return call
    return _named(call, f"{call.crash_label}, {label}", filename)


def enable_crash_reports() -> None:
    """Turn on Python's faulthandler (stderr) unless it is on or ``OPFORGE_FAULTHANDLER=0``:
    a kernel that crashes the process then leaves a report naming itself."""
    import faulthandler

    if os.environ.get("OPFORGE_FAULTHANDLER", "1") != "0" and not faulthandler.is_enabled():
        try:
            faulthandler.enable()
        except (RuntimeError, ValueError, OSError):  # no usable stderr (embedded, closed)
            pass


def _written_arguments(path: str, key: str, schema: str) -> tuple[int, ...]:
    """Positions of the arguments the out overload writes (``Tensor(a!)``)."""
    try:
        parsed = FunctionSchema.parse(schema)
    except SchemaError as e:
        raise _refuse(path, f"the schema of {key} does not parse ({e})") from None
    return tuple(i for i, a in enumerate(parsed.arguments.flat) if a.is_write)


def _read_only(arg: object) -> bool:
    if isinstance(arg, np.ndarray):
        return not arg.flags.writeable
    if isinstance(arg, (list, tuple)):
        return any(_read_only(a) for a in arg)
    return False


# --- into a registry --------------------------------------------------------------------

def load_library(path: str | os.PathLike, registry, *, override: bool | None = None) -> NativeLibrary:
    """Load a kernel library and register each of its out overloads into ``registry``.

    ``override=None`` (the default) registers a kernel as *overriding* when ``registry``
    already serves its key with a kernel that is not native (a portable ``aten::add.out``,
    a NumPy ``my_ops`` kernel, ATen mode's torch fallback), so the library's kernel takes
    precedence; otherwise as a base kernel. ``True``/``False`` force
    one level. Two libraries serving the same key at the same level is a
    ``RegistrationError`` naming both files (the registry's duplicate rule).

    >>> from opforge.runtime import KernelRegistry                       # doctest: +SKIP
    >>> registry = KernelRegistry.portable()                             # doctest: +SKIP
    >>> lib = load_library("libmy_ops.so", registry)                     # doctest: +SKIP
    >>> registry.lookup("my_ops::mul3.out").target                       # doctest: +SKIP
    'native'
    """
    library = NativeLibrary(path)
    for key in library.keys():
        level = _overrides(registry, key) if override is None else override
        registry.register(key, library.kernel(key), origin=library.path, target="native",
                          override=level)
    return library


def _overrides(registry, key: str) -> bool:
    """Does a native kernel for ``key`` replace a built-in one (see ``load_library``)?"""
    present = registry.kernels(key)
    if present:
        return any(k.target != "native" for k in present if not k.override)
    return key in registry  # served by the registry's fallback (ATen mode)
