"""``AotOp``: one MindSpore-style custom operator, as the lean runtime needs it (no torch).

An ``AotOp`` is plain data (JSON in a vendor package's ``op_info.json``): the op's name,
its inputs and outputs, the dtype rows of its registration info, where its kernel is (a
library and a symbol, or a Python function for ``func_type="pyfunc"``) and how its outputs
are inferred (``"cpp"``: the library's ``NameInferShape``/``NameInferType``; an importable
``"module:function"``; fixed shapes/dtypes). ``AotKernel`` runs it in opforge's portable
calling convention: ``kernel(*inputs, *outputs)`` on NumPy arrays.

# Design
#
# A program file is untrusted, a library is trusted like code. So before the kernel runs,
# the adapter checks what the program hands it against the op: the argument count, the
# input dtypes against the registration info's rows, the outputs' shapes and dtypes against
# the inference (run on the inputs' shapes), and that outputs are writable. A kernel thus
# never writes past a buffer or into the program's constants. MindSpore kernels assume
# C-contiguous data: strided arrays go through a contiguous copy.
"""

from __future__ import annotations

import ctypes
import keyword
import os
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from opforge.errors import KernelError, ManifestError
from opforge.mindspore.aot import AotLibrary
from opforge.mindspore.attrs import attr_values
from opforge.mindspore.extra import ExtraObject
from opforge.mindspore.dtypes import DTYPES, dtype_name
from opforge.manifest.references import resolve_reference
from opforge.runtime.limits import MAX_MEMORY_ENV, check_memory

__all__ = ["AotOp", "AotKernel", "NAMESPACE", "dtype_of"]

NAMESPACE = "mindspore"  # torch.ops.mindspore.<Name>, registry key "mindspore::<Name>.out"


def dtype_of(value: object) -> str | None:
    """An inference result (``"float32"``, a NumPy/torch/MindSpore dtype) → dtype name."""
    if isinstance(value, str):
        text = value.lower().removeprefix("torch.").removeprefix("mindspore.")
        return text if text in DTYPES else None
    text = str(value).lower()
    for prefix in ("torch.", "mindspore."):
        if text.startswith(prefix) and text[len(prefix):] in DTYPES:
            return text[len(prefix):]
    if text in DTYPES:
        return text
    return dtype_name(value)


@dataclass(frozen=True)
class AotOp:
    """One custom operator of MindSpore's AOT kind (or ``pyfunc``), without torch."""

    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    func_type: str = "aot"
    library: str | None = None  # absolute path of the AOT library
    symbol: str | None = None  # the kernel's exported name
    pyfunc: Callable | str | None = None  # func_type="pyfunc": callable or "module:function"
    dtype_rows: tuple[tuple[str, ...], ...] = ()  # supported dtypes, inputs then outputs
    out_shape: object = "cpp"  # "cpp", "program", callable, "module:function", fixed shapes
    out_dtype: object = "cpp"  # "cpp", "program", callable, "module:function", fixed dtypes
    attrs: tuple[dict, ...] = ()
    source: str = "<python>"
    _functions: list = field(default_factory=list, compare=False, repr=False)

    @property
    def key(self) -> str:
        return f"{NAMESPACE}::{self.name}.out"

    @property
    def schema(self) -> str:
        """The functional schema: ``mindspore::Name(Tensor x1, Tensor x2) -> Tensor``."""
        args = ", ".join(f"Tensor {n}" for n in schema_names(self.inputs))
        returns = "Tensor" if len(self.outputs) == 1 else \
            "(" + ", ".join("Tensor" for _ in self.outputs) + ")"
        return f"{NAMESPACE}::{self.name}({args}) -> {returns}"

    def functions(self):
        """The library's functions of this op (opened once)."""
        if not self._functions:
            _refuse_format_1_package(self)
            self._functions.append(AotLibrary.open(self.library).functions(self.symbol))
        return self._functions[0]

    def make_extra(self) -> ExtraObject:
        """A fresh ``extra`` object holding this op's attribute values."""
        values = attr_values(self.attrs, f"{self.key} ({self.source})")
        abi = self.functions().library.string_abi if self.func_type == "aot" else 0
        return ExtraObject(values, abi, self.key)

    # --- inference ------------------------------------------------------------------------

    def kernel_row(self, dtypes: list[str]) -> tuple[str, ...]:
        """The dtypes the kernel runs with for tensors of ``dtypes`` (inputs then outputs,
        the outputs as the inference gives them): themselves when a reg_info row has them;
        else, as MindSpore inserts Casts, the first row whose inputs they convert to within
        their kind (safely first: float16 → float32, then float64 → float32) and whose
        outputs convert back to them within their kind."""
        n = len(self.inputs)
        if not self.dtype_rows or tuple(dtypes) in self.dtype_rows:
            return tuple(dtypes)

        def fits(d: str, w: str, casting: str) -> bool:
            return (d in DTYPES and w in DTYPES and DTYPES[d].kind == DTYPES[w].kind
                    and np.can_cast(DTYPES[d], DTYPES[w], casting))

        for casting in ("safe", "same_kind"):
            for row in self.dtype_rows:
                if (all(fits(d, w, casting) for d, w in zip(dtypes[:n], row[:n]))
                        and all(fits(d, w, "same_kind") for d, w in zip(dtypes[n:], row[n:]))):
                    return tuple(row)
        rows = list(dict.fromkeys(r[:n] for r in self.dtype_rows))
        valid = "; ".join(", ".join(r) for r in rows)
        raise KernelError(f"`{self.key}` ({self.source}): input dtypes ({', '.join(dtypes[:n])}) "
                          f"— valid (reg_info dtype_format): {valid}, or dtypes that convert to "
                          "one of them within their kind — fix: convert the inputs, or add a "
                          "dtype_format row the kernel supports")

    def infer(self, shapes: list[tuple[int, ...]], dtypes: list[str],
              given: tuple[list, list] | None = None
              ) -> tuple[list[tuple[int, ...]], list[str]]:
        """Output shapes and dtype names for inputs of ``shapes`` and ``dtypes`` (the
        inference sees the inputs' own dtypes, as MindSpore's; a kernel row they convert to
        must exist: ``kernel_row``). ``given``: the output buffers' shapes and dtypes, what
        ``"program"`` inference answers (a packaged Python function)."""
        n = len(self.outputs)
        dtypes = list(dtypes)
        if "program" in (self.out_shape, self.out_dtype) and given is None:
            raise KernelError(
                f"`{self.key}` ({self.source}): its out_shape/out_dtype was a Python function "
                "its package could not store, so only a program (whose output buffers have "
                "the shapes) can run it — fix: define it with Custom(..., out_shape=...) to "
                "trace or call it eagerly, or use an importable function or C++ inference")
        extra = self.make_extra() if "cpp" in (self.out_shape, self.out_dtype) else None
        if self.out_shape == "program":
            out_shapes = [tuple(s) for s in given[0]]
        elif self.out_shape == "cpp":
            out_shapes = self.functions().infer_shape(list(shapes), n, extra)
        else:
            out_shapes = self._shapes(self._call("out_shape", self.out_shape,
                                                 [list(s) for s in shapes]))
        if self.out_dtype == "program":
            out_dtypes = list(given[1])
        elif self.out_dtype == "cpp":
            out_dtypes = self.functions().infer_type(list(dtypes), n, extra)
        else:
            out_dtypes = self._dtypes(self._call("out_dtype", self.out_dtype, list(dtypes)))
        where = f"`{self.key}` inference ({self.source})"
        if len(out_shapes) != n or len(out_dtypes) != n:
            raise KernelError(f"{where}: gave {len(out_shapes)} shape(s) and {len(out_dtypes)} "
                              f"dtype(s) — valid: {n}, one per output ({', '.join(self.outputs)}) "
                              "— fix: return one shape/dtype per output")
        for s in out_shapes:
            if any(type(d) is not int or d < 0 for d in s):
                raise KernelError(f"{where}: shape {list(s)} — valid: non-negative ints — fix: "
                                  "check out_shape / NameInferShape")
        for d in out_dtypes:
            if d not in DTYPES:
                raise KernelError(f"{where}: dtype {d!r} — valid: {', '.join(DTYPES)} — fix: "
                                  "check out_dtype / NameInferType")
        self.kernel_row(dtypes + list(out_dtypes))  # refused here (at trace) if none fits
        return [tuple(s) for s in out_shapes], list(out_dtypes)

    def _call(self, what: str, spec: object, args: list) -> object:
        if callable(spec) or (isinstance(spec, str) and ":" in spec):  # else a fixed dtype
            fn = resolve_reference(spec, what=what, source=self.source)
            return fn(*args)
        return spec  # fixed value

    def _shapes(self, result: object) -> list[tuple[int, ...]]:
        result = list(result) if isinstance(result, (list, tuple)) else result
        if len(self.outputs) == 1 and isinstance(result, list) and \
                all(isinstance(d, (int, np.integer)) for d in result):
            return [tuple(int(d) for d in result)]
        if not isinstance(result, list):
            raise KernelError(f"`{self.key}` out_shape ({self.source}): returned "
                              f"{type(result).__name__} — valid: a list of ints (one output) or "
                              "a list of such lists — fix: return the output shape(s)")
        return [tuple(int(d) if isinstance(d, (int, np.integer)) else d for d in s) for s in result]

    def _dtypes(self, result: object) -> list[str | None]:
        values = list(result) if isinstance(result, (list, tuple)) else [result]
        return [dtype_of(v) for v in values]

    # --- JSON -------------------------------------------------------------------------------

    def to_json(self, base: str | None = None) -> dict:
        """This op as ``op_info.json`` stores it (library relative to ``base`` if given)."""
        if callable(self.pyfunc) and not _importable(self.pyfunc):
            raise ManifestError(
                f"`opforge.mindspore` package of {self.name}: func {self.pyfunc!r} — a function "
                "a program's runtime cannot import (a lambda or a nested function) — valid: a "
                "module-level function — fix: define it at module level")
        # a Python inference a runtime cannot import (a lambda, a nested function) is stored
        # as "program": a static program's output buffers already have the inferred shapes
        # and dtypes (torch ran the function at export), and a program runs without it
        inference = {what: "program" if callable(spec) and not _importable(spec) else spec
                     for what, spec in (("out_shape", self.out_shape),
                                        ("out_dtype", self.out_dtype))}
        library = self.library
        if library and base:
            library = os.path.relpath(library, base)
        return {"name": self.name, "inputs": list(self.inputs), "outputs": list(self.outputs),
                "func_type": self.func_type, "library": library, "symbol": self.symbol,
                "pyfunc": _reference(self.pyfunc), "dtype_rows": [list(r) for r in self.dtype_rows],
                "out_shape": _reference(inference["out_shape"]),
                "out_dtype": _reference(inference["out_dtype"]),
                "attrs": list(self.attrs), "source": self.source}

    @classmethod
    def from_json(cls, data: dict, base: str | None = None) -> "AotOp":
        library = data.get("library")
        if library and base and not os.path.isabs(library):
            library = os.path.normpath(os.path.join(base, library))
        return cls(data["name"], tuple(data["inputs"]), tuple(data["outputs"]),
                   data.get("func_type", "aot"), library, data.get("symbol"), data.get("pyfunc"),
                   tuple(tuple(r) for r in data.get("dtype_rows", ())),
                   _fixed(data.get("out_shape", "cpp")), _fixed(data.get("out_dtype", "cpp")),
                   tuple(data.get("attrs", ())), data.get("source", "<op_info.json>"))


def _refuse_format_1_package(op: AotOp) -> None:
    """A vendor package keeps the header it was built with (include/ beside lib/). One
    built against opforge's first header (a plain struct behind ``extra``, before the
    MindSpore layout) would misread the object its kernels get: refused, with the fix."""
    if not op.library:
        return
    header = os.path.join(os.path.dirname(os.path.dirname(op.library)), "include",
                          "custom_aot_extra.h")
    try:
        with open(header, "rb") as f:
            old = b"OPFORGE_MS_EXTRA_VERSION 1" in f.read(65536)
    except OSError:
        return
    if old:
        raise KernelError(f"`{op.key}` ({op.source}): its library {op.library} was built "
                          f"against opforge's format-1 custom_aot_extra.h ({header}), whose "
                          "AotExtra is a plain struct; this opforge passes MindSpore's "
                          "AotExtra object — fix: rebuild the package (`opforge msop build`, "
                          "or write_package after Custom(...) recompiles the source)")


def schema_names(names) -> list[str]:
    """Input names as schema argument names: MindSpore allows any string ("x-1"); a
    schema needs identifiers, distinct ones ("x_1", then "x_1_2"...)."""
    out: list[str] = []
    for i, name in enumerate(names):
        base = "".join(c if c.isalnum() or c == "_" else "_" for c in str(name)) or f"x{i}"
        if base[0].isdigit() or keyword.iskeyword(base) or base in _RESERVED:
            base = f"x_{base}"
        candidate, k = base, 1
        while candidate in out:
            k += 1
            candidate = f"{base}_{k}"
        out.append(candidate)
    return out


_RESERVED = {"out", "self", "Tensor", "int", "float", "bool", "str", "None"}


def _importable(fn: Callable) -> bool:
    qualname = getattr(fn, "__qualname__", "")
    return bool(getattr(fn, "__module__", None)) and "<" not in qualname and "." not in qualname


def _reference(spec: object) -> object:
    if callable(spec):
        return f"{spec.__module__}:{spec.__qualname__}"
    if isinstance(spec, tuple):
        return [list(s) if isinstance(s, tuple) else s for s in spec]
    return spec


def _fixed(spec: object) -> object:
    if isinstance(spec, list):
        return tuple(tuple(s) if isinstance(s, list) else s for s in spec)
    return spec


# --- the runtime kernel -------------------------------------------------------------------

class AotKernel:
    """An ``AotOp`` in the portable calling convention: ``kernel(*inputs, *outputs)``.

    ``bind(args)`` checks and marshals once (the executor's arena views) and returns
    ``(call, ())``; each run is then one ctypes call. A non-zero return is a
    ``KernelError`` naming the op, the kernel and the status (the executor adds the
    instruction).
    """

    def __init__(self, op: AotOp) -> None:
        self.op = op
        self.key = op.key
        n_in, n_out = len(op.inputs), len(op.outputs)
        self.written = tuple(range(n_in, n_in + n_out))  # the loader refuses constants there
        self.origin = op.library or _reference(op.pyfunc) or op.source
        self.__name__ = self.__qualname__ = op.key

    def __call__(self, *args: object) -> None:
        self._prepare(args)()

    def bind(self, args) -> tuple[Callable[[], None], tuple]:
        return self._prepare(tuple(args)), ()

    def _where(self) -> str:
        what = f"kernel {self.op.symbol} ({os.path.basename(self.op.library)})" \
            if self.op.func_type == "aot" else f"pyfunc {_reference(self.op.pyfunc)}"
        return f"`{self.key}` (MindSpore {self.op.func_type} {what})"

    def _prepare(self, args: tuple) -> Callable[[], None]:
        op, where = self.op, self._where()
        n_in, n_out = len(op.inputs), len(op.outputs)
        names = list(op.inputs) + list(op.outputs)
        if len(args) != n_in + n_out:
            raise KernelError(f"{where}: {len(args)} arguments — valid: {n_in + n_out} "
                              f"({', '.join(names)}) — fix: re-export the program")
        dtypes = []
        for name, a in zip(names, args):
            if type(a) is not np.ndarray:
                raise KernelError(f"{where}: argument {name} — found {type(a).__name__} — "
                                  "valid: a NumPy array — fix: pass arrays")
            d = dtype_name(a.dtype)
            if d is None:
                raise KernelError(f"{where}: argument {name} — dtype {a.dtype} — valid: "
                                  f"{', '.join(DTYPES)} — fix: convert it")
            dtypes.append(d)
        for name, a in zip(op.outputs, args[n_in:]):
            if not a.flags.writeable:
                raise KernelError(f"{where}: output {name} is a read-only array (a constant of "
                                  "the program, or memory the caller owns) — valid: a writable "
                                  "array — fix: re-export the program; it was altered")
        shapes, out_dtypes = op.infer([a.shape for a in args[:n_in]], dtypes[:n_in],
                                      ([a.shape for a in args[n_in:]], dtypes[n_in:]))
        for name, a, shape, d, got in zip(op.outputs, args[n_in:], shapes, out_dtypes,
                                          dtypes[n_in:]):
            if a.shape != shape or got != d:
                raise KernelError(
                    f"{where}: output {name} — found {got}{list(a.shape)} — valid: {d}{list(shape)} "
                    "(the op's inference on these inputs) — fix: re-export the program; its "
                    "output buffers do not fit the op")
        row = list(op.kernel_row(dtypes))  # the kernel's dtypes; converted where they differ
        if op.func_type == "pyfunc":
            return self._pyfunc_call(args, n_in, row)
        converted = {i for i in range(n_in) if row[i] != dtypes[i]}
        return self._aot_call(args, row, where, converted)

    def _pyfunc_call(self, args: tuple, n_in: int, dtypes: list[str]) -> Callable[[], None]:
        fn = resolve_reference(self.op.pyfunc, what="pyfunc", source=self.op.source)
        inputs, outputs, where = args[:n_in], args[n_in:], self._where()
        wanted = [DTYPES[d] for d in dtypes[:n_in]]

        def call() -> None:
            result = fn(*[a if a.dtype == w else a.astype(w) for a, w in zip(inputs, wanted)])
            results = list(result) if isinstance(result, (tuple, list)) else [result]
            if len(results) != len(outputs):
                raise KernelError(f"{where}: returned {len(results)} value(s) — valid: "
                                  f"{len(outputs)} — fix: return one array per output")
            for out, value in zip(outputs, results):
                value = np.asarray(value)
                if value.shape != out.shape:
                    raise KernelError(f"{where}: returned shape {list(value.shape)} — valid: "
                                      f"{list(out.shape)} (out_shape) — fix: the function or "
                                      "out_shape")
                np.copyto(out, value, casting="same_kind")

        return call

    def _aot_call(self, args: tuple, dtypes: list[str], where: str,
                  converted: set[int]) -> Callable[[], None]:
        op = self.op
        functions = op.functions()
        n_in = len(op.inputs)
        extra = op.make_extra()
        before, arrays, guarded = [], [], []
        for i, a in enumerate(args):
            if i >= n_in:  # every output: a zeroed view between guard zones, copied out
                zone = _GuardedBuffer(a.shape, DTYPES[dtypes[i]], f"output {op.outputs[i - n_in]}")
                arrays.append(zone.view)
                guarded.append((zone, a))
            elif a.flags.c_contiguous and i not in converted:
                arrays.append(a)
            else:  # strided, or converted to the reg_info row's dtype (copied each call)
                staged = np.empty(a.shape, DTYPES[dtypes[i]])
                arrays.append(staged)
                before.append((staged, a))
        shapes = [a.shape for a in args]
        workspaces = []
        if functions.init_fn:
            status = functions.init(shapes, dtypes, extra)
            if status != 0:
                raise KernelError(f"{where}: {op.symbol}Init returned {status} — valid: 0 — fix: "
                                  "see the kernel's own log for why it refused these shapes")
            sizes = extra.workspace()
            # sizes a kernel chose: checked like every allocation made for a program
            # (load(max_memory=...), OPFORGE_MAX_MEMORY), before any is made
            check_memory(self.key, f"the workspace {op.symbol}Init asked for with SetWorkSpace "
                         f"({' + '.join(map(str, sizes))} bytes, {os.path.basename(op.library)})",
                         sum(sizes), error=KernelError,
                         fix=f"1. check {op.symbol}Init's SetWorkSpace sizes for these shapes "
                             f"({', '.join(str(list(s)) for s in shapes)}); 2. if the kernel "
                             "really needs it, raise the limit: load(..., max_memory=N) or "
                             f"{MAX_MEMORY_ENV}=N")
            for k, size in enumerate(sizes):
                zone = _GuardedBuffer((size,), np.dtype(np.uint8), f"workspace {k}")
                workspaces.append(zone)
                arrays.append(zone.view)
                shapes.append((size,))
                dtypes = dtypes + ["uint8"]
        launch = functions.bind_launch(arrays, shapes, dtypes, extra)
        copy = np.copyto

        # per call: zero each output, run, compare the guard zones (memcmp), copy out
        zero, move, compare = ctypes.memset, ctypes.memmove, _memcmp()
        pattern = _GuardedBuffer.pattern()
        zones = [z for z, _ in guarded] + workspaces
        checks = [c for z in zones for c in z.checks()]
        zeroed = [(z.body_address, z.nbytes) for z, _ in guarded]
        fast = [d.flags.c_contiguous and d.dtype == z.dtype for z, d in guarded]
        fast_out = [(d.ctypes.data, z.body_address, z.nbytes)
                    for (z, d), f in zip(guarded, fast) if f]
        slow_out = [(d, z.view) for (z, d), f in zip(guarded, fast) if not f]  # or converted

        def call() -> None:
            for dst, src in before:
                copy(dst, src)
            for address, size in zeroed:
                zero(address, 0, size)
            status = launch()
            for address, size in checks:
                if compare(address, pattern, size):
                    for zone in zones:
                        zone.check(where)
            extra.raise_errors(where)
            if status != 0:
                raise KernelError(f"{where}: returned {status} — valid: 0 (success) — fix: check "
                                  "the inputs against what the kernel supports; its own log "
                                  "says why it failed")
            for dst, src, size in fast_out:
                move(dst, src, size)
            for dst, src in slow_out:
                copy(dst, src)

        call.keep = (launch, extra)
        return call


def _memcmp():
    libc = ctypes.CDLL(None)
    memcmp = libc.memcmp
    memcmp.restype, memcmp.argtypes = ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p,
                                                     ctypes.c_size_t]
    return memcmp


class _GuardedBuffer:
    """A C-contiguous array between two guard zones of one byte pattern (``opforge check``
    does the same in a child process; here it is every call). The zone after the array is
    as large as the array (at least 256 bytes, at most 1 MiB), so a kernel writing up to
    twice what the op declares writes into the zone, not into the heap: the call is then a
    KernelError and the process lives on. Cost per call (measured on an add kernel, see
    docs/mindspore.md): zeroing and copying each output, and three short memcmp calls."""

    FILL = 0xA5
    HEAD = 64

    def __init__(self, shape: tuple, dtype: np.dtype, what: str) -> None:
        self.nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        self.tail = max(256, min(self.nbytes, 1 << 20))
        self.tail += -self.tail % 8
        # the array 64-byte aligned, like MindSpore's: up to 63 bytes skipped at the start (8
        # spare bytes were too few: the zone after the array came out up to 55 bytes short,
        # and the checks then compared memory past the buffer and missed writes there)
        self.buffer = np.empty(self.HEAD + self.nbytes + self.tail + 63, np.uint8)
        start = -self.buffer.ctypes.data % 64
        self.buffer = self.buffer[start:start + self.HEAD + self.nbytes + self.tail]
        body = self.buffer[self.HEAD:self.HEAD + self.nbytes]
        self.view = body.view(dtype).reshape(shape)
        self.body = body
        self.head_zone = self.buffer[:self.HEAD]
        self.tail_zone = self.buffer[self.HEAD + self.nbytes:]
        self.what, self.dtype, self.shape = what, dtype, shape
        self.head_zone.fill(self.FILL)
        self.tail_zone.fill(self.FILL)
        self.head_address, self.tail_address = self.head_zone.ctypes.data, self.tail_zone.ctypes.data
        self.body_address = self.body.ctypes.data

    _pattern: list = []

    @classmethod
    def pattern(cls) -> int:
        """The address of 1 MiB + 256 bytes of FILL (what every guard zone holds)."""
        if not cls._pattern:
            cls._pattern.append(np.full((1 << 20) + 256, cls.FILL, np.uint8))
        return cls._pattern[0].ctypes.data

    def checks(self) -> list[tuple[int, int]]:
        """(address, size) of what each call compares: the zone before, and the first 4 KiB
        and the last 64 bytes of the zone after. A kernel writing past its end writes the
        first bytes after it; the whole zone is compared when one of these changed."""
        first = min(self.tail, 4096)
        return [(self.head_address, self.HEAD), (self.tail_address, first),
                (self.tail_address + self.tail - 64, 64)]

    def check(self, where: str) -> None:
        head, tail = self.head_zone, self.tail_zone
        if head.min() == head.max() == self.FILL and tail.min() == tail.max() == self.FILL:
            return
        after = np.flatnonzero(tail != self.FILL)
        before = np.flatnonzero(head != self.FILL)
        head.fill(self.FILL)
        tail.fill(self.FILL)
        if after.size:
            reach = f"wrote at least {int(after[-1]) + 1} byte(s) past its end"
        else:
            reach = f"wrote {self.HEAD - int(before[0])} byte(s) before its start"
        raise KernelError(
            f"{where}: {reach} of {self.what} ({self.dtype.name}{list(self.shape)}, "
            f"{self.nbytes} bytes) — the kernel writes more than the op declares; caught in "
            "a guard zone, its results were discarded — fix: 1. make out_shape / "
            "NameInferShape give the size the kernel writes; 2. make the kernel compute its "
            "loop bounds from the output's own shape (shapes[nin + i])")
