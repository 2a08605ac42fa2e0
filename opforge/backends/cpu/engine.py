"""The cpu backend's run-time side: loads the engine library (installed with opforge, or
built on first use in a development checkout: ``engine_build``) and turns a parsed blob
into an engine handle. NumPy and ctypes only: no torch.
"""

from __future__ import annotations

import ctypes
import math
import os
import threading
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from opforge.backends.cpu import engine_build
from opforge.backends.cpu.blob import ITEMSIZE
from opforge.backends.cpu.file_pages import FilePages, PagePlan
from opforge.errors import BackendError
from opforge.runtime.threads import note_library_loaded

ABI_VERSION = 8
_ERR = 1024
_lib = None
_lib_lock = threading.Lock()

# OPFORGE_CPU_SANITIZE=1: build (a separate cache entry) and load the engine with
# AddressSanitizer and UndefinedBehaviorSanitizer; the process must preload libasan
# (tests/backends/test_cpu_sanitized.py shows how)
SANITIZE_ENV = "OPFORGE_CPU_SANITIZE"
SANITIZE_FLAGS = ["-O1", "-g", "-fno-omit-frame-pointer", "-fsanitize=address,undefined",
                  "-fno-sanitize-recover=undefined"]

KERNEL_TAGS = {"none": 0, "tensor": 1, "int": 4, "double": 5, "bool": 6, "int_list": 9,
               "double_list": 10}


def onednn_prefix() -> Path | None:
    """Where the oneDNN wheels put ``lib/libdnnl.so.3`` (all the engine needs at run time;
    building it also needs ``include/oneapi/dnnl``, see ``engine_build.find_onednn``)."""
    return engine_build.find_onednn(headers=False)


def missing() -> str | None:
    """None when the engine can be loaded here (installed, or built on first use); else
    what to install."""
    if os.environ.get("OPFORGE_CPU_BACKEND_DISABLE") == "1":
        return ("disabled by OPFORGE_CPU_BACKEND_DISABLE=1 — fix: unset it")
    if onednn_prefix() is None:
        return ("oneDNN is not installed (libdnnl.so.3 and its headers) — fix: pip install "
                "'opforge[cpu]' (the wheels onednn-cpu-gomp==2023.2.0 and "
                "onednn-devel-cpu-gomp==2023.2.0; not the 'onednn' 2026 wheel, a SYCL build "
                "that cannot create a CPU engine)")
    if installed_library() is not None:
        return None
    if engine_build.find_onednn(headers=True) is None:
        return ("the engine is not installed, and oneDNN's headers to build it are missing — "
                "fix: 1. reinstall opforge with the cpu extra (pip install 'opforge[cpu]'), "
                "which builds the engine; or 2. pip install onednn-devel-cpu-gomp==2023.2.0")
    from opforge.native.toolchain import find_toolchain
    try:
        find_toolchain()
    except Exception as e:  # noqa: BLE001 - the toolchain says what is missing
        stale = _stale_libraries()
        what = (f"the installed engine {stale[0]} was built from other sources than the ones "
                "beside it" if stale else
                f"the engine is not installed ({INSTALL_DIR / engine_build.installed_name()})")
        return (f"{what}, and there is no C++ compiler to build it: {e} — or reinstall opforge "
                "(pip install -e . in a checkout, else pip install 'opforge[cpu]'), which "
                "builds it")
    return None


INSTALL_DIR = Path(__file__).resolve().parent / engine_build.INSTALL_FOLDER
_warned_stale = False


def installed_library() -> Path | None:
    """The engine the package build installed for the sources beside this file, if any."""
    path = INSTALL_DIR / engine_build.installed_name()
    return path if path.is_file() else None


def _stale_libraries() -> list[Path]:
    return sorted(INSTALL_DIR.glob(f"{engine_build.ENGINE_NAME}.*.so"))


def _compile_on_first_use(prefix: Path, *, sanitize: bool = False) -> Path:
    """The development fallback: the engine built into opforge's build cache (once); with
    ``sanitize``, the AddressSanitizer/UBSan build (its own cache entry)."""
    global _warned_stale
    stale = _stale_libraries()
    if stale and not _warned_stale and not sanitize:
        _warned_stale = True
        warnings.warn(
            f"opforge cpu backend: the installed engine {stale[0]} was built from other sources "
            f"than the ones in {engine_build.source_files()[0].parent} (they changed since "
            "opforge was installed); it is not used, the engine is compiled into the build "
            "cache instead — fix: pip install -e . again (or pip install opforge) to rebuild "
            "the installed engine", RuntimeWarning, stacklevel=3)
    from opforge.native.shared_library import compile_shared

    flags = engine_build.compile_flags(prefix)
    if sanitize:
        flags = [f for f in flags if f != "-O3"] + SANITIZE_FLAGS
    return compile_shared(
        [p for p in engine_build.source_files() if p.suffix == ".cpp"], "opforge_cpu",
        flags=flags, include_dirs=engine_build.include_dirs(),
        kind="cpu-backend-engine-sanitized" if sanitize else "cpu-backend-engine",
        api="opforge cpu backend", extra={"onednn": str(prefix)})


def sanitized_library() -> Path:
    """The AddressSanitizer/UBSan build of the engine (``SANITIZE_ENV``), compiled once into
    the build cache and not loaded: a process without libasan preloaded cannot load it. A
    caller that runs it in a child builds it here first, so the child's time limit covers
    its work, not a compile of minutes."""
    problem = missing()
    if problem:
        raise BackendError(f"cpu backend: {problem}")
    return _compile_on_first_use(engine_build.find_onednn(headers=True), sanitize=True)


def library() -> ctypes.CDLL:
    """The engine library: the installed one built from these sources, else (development)
    built on first use into opforge's build cache; loaded once per process."""
    global _lib
    with _lib_lock:
        if _lib is not None:
            return _lib
        problem = missing()
        if problem:
            raise BackendError(f"cpu backend: {problem}")
        prefix = onednn_prefix()
        # the installed engine's rpath covers a standard layout; loading oneDNN first, by
        # its soname, covers any other (an editable checkout, a relocated environment)
        ctypes.CDLL(str(prefix / "lib" / "libdnnl.so.3"), mode=ctypes.RTLD_GLOBAL)
        sanitize = os.environ.get(SANITIZE_ENV) == "1"
        path = None if sanitize else installed_library()
        if path is None:
            path = _compile_on_first_use(engine_build.find_onednn(headers=True), sanitize=sanitize)
        lib = ctypes.CDLL(str(path))
        note_library_loaded(path)  # its OpenMP runtime (runtime/threads.py)
        lib.ofc_abi_version.restype = ctypes.c_int32
        if lib.ofc_abi_version() != ABI_VERSION:
            fix = ("reinstall opforge (pip install 'opforge[cpu]', or pip install -e . in a "
                   "checkout)" if path.parent == INSTALL_DIR else
                   "clear the build cache entry for it")
            raise BackendError(f"cpu backend: engine {path} has ABI {lib.ofc_abi_version()}, "
                               f"expected {ABI_VERSION} — fix: {fix}")
        _declare(lib)
        _lib = lib
        return lib


def _declare(lib) -> None:
    P, I32, I64, D = ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64, ctypes.c_double
    I32P, I64P, DP, S = (ctypes.POINTER(I32), ctypes.POINTER(I64), ctypes.POINTER(D), ctypes.c_char_p)
    lib.ofc_abi_version.restype = I32
    lib.ofc_new.argtypes = [I32, I64, S, I32]
    lib.ofc_new.restype = P
    lib.ofc_destroy.argtypes = [P]
    lib.ofc_weight_cache_new.restype = P
    lib.ofc_weight_cache_free.argtypes = [P]
    lib.ofc_weight_cache_bytes.argtypes = [P]
    lib.ofc_weight_cache_bytes.restype = I64
    lib.ofc_used_bytes.argtypes = [P]
    lib.ofc_used_bytes.restype = I64
    lib.ofc_use_weight_cache.argtypes = [P, P, S, I32]
    lib.ofc_use_weight_cache.restype = I32
    lib.ofc_add_tensor.argtypes = [P, I32, I32, I64P, I64P, P, I64, I32, I64, I32, S, I32]
    lib.ofc_add_tensor.restype = I32
    lib.ofc_tensor_file.argtypes = [P, I32, I32, I64, I32, S, I32]
    lib.ofc_tensor_file.restype = I32
    lib.ofc_post_op.argtypes = [P, I32, I32, D, D, I32, S, I32]
    lib.ofc_post_op.restype = I32
    lib.ofc_add_op.argtypes = [P, S, I32P, I32, I32P, I32, I64P, I32, DP, I32, S, I32]
    lib.ofc_add_op.restype = I32
    lib.ofc_add_external.argtypes = [P, P, P, S, I32P, I32, I32P, I32, S, I32]
    lib.ofc_add_external.restype = I32
    lib.ofc_add_kernel.argtypes = [P, P, S, I32P, I32, I32P, I32, I32, I32P, I64P, I64P, DP,
                                   I64P, I64, DP, I64, S, I32]
    lib.ofc_add_kernel.restype = I32
    lib.ofc_finalize.argtypes = [P, I32P, I32, I32P, I32, S, I32]
    lib.ofc_finalize.restype = I32
    lib.ofc_execute.argtypes = [P, ctypes.POINTER(P), ctypes.POINTER(P), S, I32]
    lib.ofc_execute.restype = I32
    lib.ofc_describe.argtypes = [P, S, I32]
    lib.ofc_describe.restype = I32
    lib.ofc_threads.argtypes = [P]
    lib.ofc_threads.restype = I32
    lib.ofc_memory.argtypes = [P, I64P]
    lib.ofc_memory.restype = None
    lib.ofc_guard_calls.argtypes = [P, I32, I64P]
    lib.ofc_guard_calls.restype = I32
    lib.ofc_winograd_calls.argtypes = [P, I32, I64P]
    lib.ofc_winograd_calls.restype = I32
    lib.ofc_out_bound.argtypes = [P, I32, DP]
    lib.ofc_out_bound.restype = I32
    lib.ofc_op_threads.argtypes = [P, I32]
    lib.ofc_op_threads.restype = I32
    lib.ofc_op_impl.argtypes = [P, I32, S, I32]
    lib.ofc_op_impl.restype = I32


def _arr(ctype, values):
    values = list(values)
    return (ctype * max(len(values), 1))(*values)


def shared_weight_cache(context: Any) -> int | None:
    """The loaded program's cache of reordered weights (``ofc_weight_cache_new``), one for
    all its cpu delegates and freed after them (``context.shared``); None without one (a
    backend initialised outside a program: each engine reorders its own)."""
    shared = getattr(context, "shared", None)
    if shared is None:
        return None
    lib = library()

    def make() -> int:
        cache = lib.ofc_weight_cache_new()
        if not cache:
            raise BackendError("cpu backend: no memory for the program's weight cache")
        return cache
    return shared.get("cpu.weight_cache", make, lib.ofc_weight_cache_free)


class EngineHandle:
    """One initialised delegate: the engine pointer and what must outlive it."""

    def __init__(self, plan: dict, data: memoryview, threads: int, max_memory: int,
                 registry: Any, specs: dict, *, weight_cache: int | None = None,
                 named: Any = None) -> None:
        # constants are used in place in ``data`` or, for a named one, in the program's named
        # data (``named``: a NamedDataMap; both pinned for the engine's life) where 64-byte
        # aligned, else copied; weight_cache: an ofc_weight_cache_new() pointer (outliving
        # the engine) sharing their reordered forms (every delegate of the program)
        self.lib = lib = library()
        self.keep: list[Any] = []
        # ops that call out to a kernel library or an op package (their threads are not ours)
        self.callouts = any(op["kind"] in ("kernel", "package") for op in plan["ops"])
        err = ctypes.create_string_buffer(_ERR)
        self.ptr = lib.ofc_new(threads, max_memory, err, _ERR)
        if not self.ptr:
            raise BackendError(f"cpu backend: {err.value.decode(errors='replace')}")
        self.closed = False
        try:
            if weight_cache is not None:
                self._check(lib.ofc_use_weight_cache(self.ptr, weight_cache, err, _ERR), err,
                            "weight cache")
            self._build(plan, data, named, registry, specs, err)
        except (KeyError, TypeError, ValueError, IndexError, OverflowError) as e:
            self.close()  # a field parse() let through that the builder cannot use
            raise BackendError(f"cpu backend blob: {type(e).__name__}: {e} — fix: re-export the "
                               "program; this one was altered or corrupted") from None
        except BaseException:
            self.close()
            raise
        tensors = plan["tensors"]
        self.inputs = [(tuple(tensors[t]["dims"]), tensors[t]["dtype"]) for t in plan["inputs"]]
        debug = plan.get("debug", [])  # a debug build's node results: the last outputs
        own = len(plan["outputs"]) - len(debug)
        own_outputs = [(tuple(tensors[t]["dims"]), tensors[t]["dtype"]) for t in plan["outputs"][:own]]
        # the DelegateCall's outputs: the engine's own, and at each state position the
        # state input itself (written in place; see blob.py)
        self.state = {output: position for position, output in plan.get("state", [])}
        self.outputs = []
        for position in range(len(own_outputs) + len(self.state)):
            self.outputs.append(self.inputs[self.state[position]] if position in self.state
                                else own_outputs.pop(0))
        # a debug build: the node results, written by every call into these arrays (their
        # sizes come from the untrusted blob: bounded by the memory limit before allocation)
        total = sum(math.prod(tensors[p]["dims"]) * ITEMSIZE[tensors[p]["dtype"]]
                    for p in (plan["outputs"][position] for position, _, _ in debug))
        if total > max_memory:
            self.close()
            raise BackendError(f"cpu backend: the debug build's node results take {total} bytes, "
                               f"over the memory limit of {max_memory} — fix: raise the limit "
                               "(OPFORGE_MAX_MEMORY) or compare a smaller input")
        self.debug_outputs = [
            (name, item, np.zeros(tensors[plan["outputs"][position]]["dims"],
                                  NUMPY[tensors[plan["outputs"][position]]["dtype"]]))
            for position, name, item in debug]

    def _check(self, rc: int, err, what: str) -> None:
        if rc != 0:
            raise BackendError(f"cpu backend: {what}: {err.value.decode(errors='replace')}")

    def _constant(self, t: dict, i: int, blob: np.ndarray, named: Any) -> tuple[int, int, Any]:
        """(address, nbytes, memoryview it lies in) of constant tensor ``t``: in the blob, or
        the program's bytes stored under its key (kept alive for the engine's life)."""
        if "data" in t:
            offset, nbytes = t["data"]  # checked against the data size by blob.parse
            return blob.ctypes.data + offset, nbytes, None
        key, nbytes = t["named"]
        from opforge.backends.cpu.blob import named_layout

        # every reader of a key reads one tensor: the first reader's dtype and dims
        view = named.get(key, named_layout(t["dtype"], t["dims"]), f"(cpu blob tensors[{i}])") \
            if named is not None else None
        if view is None or view.nbytes != nbytes:
            found = "is missing from the program" if view is None else f"holds {view.nbytes} bytes"
            raise BackendError(f"cpu backend blob: tensors[{i}] names constant {key[:80]!r} of "
                               f"{nbytes} bytes, which {found} — fix: re-export the program; "
                               "this one was altered or corrupted")
        raw = np.frombuffer(view, np.uint8)
        self.keep.append(raw)
        return raw.ctypes.data, nbytes, view

    def _build(self, plan, data, named, registry, specs, err) -> None:
        lib = self.lib
        # the engine reads the constants in place (borrowed, never copied): this view of the
        # blob, kept for the engine's life, pins the memory (a mapping cannot be closed and a
        # bytes object cannot be freed under it)
        raw = np.frombuffer(data, np.uint8)
        self.keep.append(raw)
        pages = {id(data): FilePages.of(data)}  # per view: its mapping's pages, or None
        spans: dict[int, tuple[int, int, Any]] = {}  # constant tensor → (address, nbytes, pages)
        borrowed: dict[int, bool] = {}  # constant tensors the engine reads in place
        self._tensors = tensors = plan["tensors"]
        for i, t in enumerate(tensors):
            dims, strides = t["dims"], t["strides"]
            ptr, nbytes = None, 0
            # 1: the engine owns it; 2: a delegate input (read-only: it may be a program
            # constant in a read-only mapping); 3: a constant, read in place; 4: a state
            # input (writable); 0: an output or unbacked, bound per call
            storage = {"temp": 1, "input": 2, "state": 4}.get(t["role"], 0)
            if "data" in t or "named" in t:
                address, nbytes, view = self._constant(t, i, raw, named)
                view = data if view is None else view
                if id(view) not in pages:
                    pages[id(view)] = FilePages.of(view)
                spans[i] = (address, nbytes, pages[id(view)])
                ptr = ctypes.c_void_p(address)
                if ptr.value % 64 == 0:  # (the engine refuses an unaligned borrow: copied)
                    storage = 3
                    borrowed[i] = True
            rid = lib.ofc_add_tensor(self.ptr, t["dtype"], len(dims), _arr(ctypes.c_int64, dims),
                                     _arr(ctypes.c_int64, strides), ptr, nbytes,
                                     t.get("base", -1) if t["role"] == "alias" else -1,
                                     t.get("offset", 0), storage, err, _ERR)
            if rid != i:
                raise BackendError(f"cpu backend: tensors[{i}]: {err.value.decode(errors='replace')}")

        # each tensor's root (the engine took every alias: its base is an earlier tensor)
        roots = list(range(len(tensors)))
        for i, t in enumerate(tensors):
            if t["role"] == "alias":
                roots[i] = roots[t["base"]]

        # which of the file's pages to give back, which tables to read from the file
        pages_plan = PagePlan(plan, roots, spans, borrowed)
        for root, fd, offset, flags in pages_plan.file_sources:
            self._check(lib.ofc_tensor_file(self.ptr, root, fd, offset, flags, err, _ERR), err,
                        f"tensors[{root}] (a constant read from its file)")

        for i, op in enumerate(plan["ops"]):
            for p in op["post"]:
                self._check(lib.ofc_post_op(self.ptr, p[0], p[1], float(p[2]), float(p[3]),
                                            p[4] if p[0] == 1 else -1, err, _ERR), err, f"ops[{i}] post-op")
            ins, outs = op["in"], op["out"]
            if op["kind"] == "kernel":
                self._add_kernel(op, registry, err)
            elif op["kind"] == "package":
                self._add_package(op, specs, err)
            else:
                self._check(lib.ofc_add_op(self.ptr, op["kind"].encode(), _arr(ctypes.c_int32, ins), len(ins),
                                           _arr(ctypes.c_int32, outs), len(outs), _arr(ctypes.c_int64, op["ia"]),
                                           len(op["ia"]), _arr(ctypes.c_double, op["fa"]), len(op["fa"]),
                                           err, _ERR), err, f"ops[{i}] ({op['name'] or op['kind']})")
            pages_plan.give_back(op)
        self._check(lib.ofc_finalize(self.ptr, _arr(ctypes.c_int32, plan["inputs"]), len(plan["inputs"]),
                                     _arr(ctypes.c_int32, plan["outputs"]), len(plan["outputs"]), err, _ERR),
                    err, "finalize")

    def _add_kernel(self, op, registry, err) -> None:
        key = op["name"]
        kernel = None
        if registry is not None:
            kernel = registry.lookup(key, _dtype_key(op, plan_tensors=self._tensors))
        entry_fn = _native_entry(kernel, op, self._tensors)
        if entry_fn is None:
            raise BackendError(
                f"cpu backend: the delegate calls custom op {key} through its native kernel, and "
                f"this runtime has none — fix: load the program with the kernel library built "
                f"for it (opforge run --kernels LIB.so, or load(..., kernels=['LIB.so']))")
        tags, values, lengths, doubles, ints, dbls = [], [], [], [], [], []
        for item in op["args"]:
            if type(item) is not list or len(item) != 2 or item[0] not in KERNEL_TAGS:
                raise BackendError(f"cpu backend blob: kernel argument {str(item)[:40]} — fix: re-export")
            tag, value = item
            tags.append(KERNEL_TAGS[tag])
            if tag in ("int_list", "double_list"):
                pool = ints if tag == "int_list" else dbls
                if type(value) is not list or len(value) > 4096:
                    raise BackendError("cpu backend blob: kernel list argument — fix: re-export")
                values.append(len(pool)); lengths.append(len(value)); doubles.append(0.0)
                pool.extend(int(v) if tag == "int_list" else float(v) for v in value)
            elif tag == "double":
                values.append(0); lengths.append(0); doubles.append(float(value))
            else:
                if type(value) is not int:
                    raise BackendError("cpu backend blob: kernel int argument — fix: re-export")
                values.append(value); lengths.append(0); doubles.append(0.0)
        ins, outs = op["in"], op["out"]
        self._check(self.lib.ofc_add_kernel(
            self.ptr, entry_fn, key.encode(), _arr(ctypes.c_int32, ins), len(ins),
            _arr(ctypes.c_int32, outs), len(outs), len(tags), _arr(ctypes.c_int32, tags),
            _arr(ctypes.c_int64, values), _arr(ctypes.c_int64, lengths),
            _arr(ctypes.c_double, doubles), _arr(ctypes.c_int64, ints), len(ints),
            _arr(ctypes.c_double, dbls), len(dbls), err, _ERR), err, f"kernel {key}")

    def _add_package(self, op, specs, err) -> None:
        try:
            from opforge.backends.oppackage import runtime as packages
        except ImportError as e:
            raise BackendError(f"cpu backend: op packages are not available here ({e})") from None
        try:
            node = bytes.fromhex(op["node"])
        except ValueError:
            raise BackendError("cpu backend blob: a package node that is not hex — fix: re-export") from None
        fn, state, keep = packages.prepare(node, specs.get("op_packages") or [])
        self.keep.append(keep)
        ins, outs = op["in"], op["out"]
        self._check(self.lib.ofc_add_external(self.ptr, fn, state, op["name"].encode(),
                                              _arr(ctypes.c_int32, ins), len(ins),
                                              _arr(ctypes.c_int32, outs), len(outs), err, _ERR),
                    err, f"package op {op['name']}")

    def _live(self, api: str) -> None:
        if self.closed or not self.ptr:
            raise BackendError(f"cpu backend: {api} on a delegate that was closed — valid: a call "
                               "before LoadedProgram.delegates.close() — fix: load the program again")

    def describe(self) -> list[str]:
        """Each op's name, in the engine's order: one entry per op (names hold commas)."""
        self._live("describe()")
        size = 65536
        while True:  # (a program of thousands of ops passes 64 KiB of names)
            buf = ctypes.create_string_buffer(size)
            length = self.lib.ofc_describe(self.ptr, buf, size)
            if length < size:
                return buf.value.decode().split("\n") if length else []
            size = length + 1

    def guard_calls(self) -> dict[int, tuple[int, int]]:
        """Op index → (calls run fused, calls run the exact way) for each op with a NaN
        guard (a convolution or matmul whose NaN-unsafe post-op runs fused when the call's
        bounds prove no NaN reaches it; docs/backend-cpu.md)."""
        return self._call_counts("guard_calls()", self.lib.ofc_guard_calls)

    def winograd_calls(self) -> dict[int, tuple[int, int]]:
        """Op index → (calls run as Winograd F(4×4, 3×3), calls run direct) for each
        convolution built on the Winograd kernel (docs/backend-cpu.md)."""
        return self._call_counts("winograd_calls()", self.lib.ofc_winograd_calls)

    def out_bounds(self) -> dict[int, float]:
        """Op index → its bound on |its output| from the last call (inf when it proved
        none), for each op that sets one: a guarded op, and the engine's own convolution
        kernels (their readers skip their scans for NaN when it is finite)."""
        self._live("out_bounds()")
        out = ctypes.c_double()
        return {i: out.value for i in range(len(self.describe()))
                if self.lib.ofc_out_bound(self.ptr, i, ctypes.byref(out))}

    def _call_counts(self, api: str, count) -> dict[int, tuple[int, int]]:
        """Op index → the two counts ``count(handle, op, out)`` gives, for each op it knows."""
        self._live(api)
        out = (ctypes.c_int64 * 2)()
        calls = {}
        for i in range(len(self.describe())):
            if count(self.ptr, i, out):
                calls[i] = (out[0], out[1])
        return calls

    def impls(self) -> list[str]:
        """Each op's oneDNN implementation, as oneDNN names it (e.g.
        ``brgconv_1x1:avx512_core_vnni``); "" for an op on the engine's own kernels."""
        self._live("impls()")
        buf = ctypes.create_string_buffer(256)
        names = []
        for i in range(len(self.describe())):
            self.lib.ofc_op_impl(self.ptr, i, buf, 256)
            names.append(buf.value.decode())
        return names

    def op_threads(self) -> list[int]:
        """Each op's OpenMP threads: one for a small op (docs/backend-cpu.md, "Threads"),
        else the delegate's."""
        self._live("op_threads()")
        return [self.lib.ofc_op_threads(self.ptr, i) for i in range(len(self.describe()))]

    def memory(self) -> dict[str, int]:
        """The engine's bytes: ``total`` (everything it allocated: constants, reordered
        weights, the arena), ``arena`` (the planned intermediates' memory), ``intermediates``
        (their sum: one buffer each would take this) and ``unplanned`` (intermediates a
        plan reads before writing, each alone and zeroed)."""
        self._live("memory()")
        out = (ctypes.c_int64 * 4)()
        self.lib.ofc_memory(self.ptr, out)
        return dict(zip(("total", "arena", "intermediates", "unplanned"), out))

    def close(self) -> None:
        if not self.closed and self.ptr:
            self.lib.ofc_destroy(self.ptr)
            for k in self.keep:
                close = getattr(k, "close", None)
                if close:
                    close()
        self.closed = True
        self.ptr = None  # the engine is freed: every later call is refused (_live)


# (bfloat16, which NumPy has no dtype for: its raw bits, as the runtime reads them)
NUMPY = {0: np.uint8, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.int64, 5: np.float16,
         6: np.float32, 7: np.float64, 11: np.bool_, 15: np.uint16}
NAMES = {0: "uint8", 1: "int8", 2: "int16", 3: "int32", 4: "int64", 5: "float16", 6: "float32",
         7: "float64", 11: "bool", 15: "bfloat16"}


def _dtype_key(op, plan_tensors) -> str:
    """The runtime's dtype key for a kernel call: its first tensor argument's dtype."""
    first = next((v for tag, v in op["args"] if tag == "tensor"), None)
    ids = op["in"] + op["out"]
    if first is None or not 0 <= first < len(ids):
        return "default"
    return NAMES.get(plan_tensors[ids[first]]["dtype"], "default")


def _native_entry(kernel, op, plan_tensors):
    """The kernel-ABI function address of a registry kernel that is native, else None."""
    fn = getattr(kernel, "fn", None) if kernel is not None else None
    select = getattr(fn, "select", None)
    if select is None:
        return None
    ids = op["in"] + op["out"]
    args = []
    for tag, value in op["args"]:
        if tag == "tensor" and 0 <= value < len(ids):
            t = plan_tensors[ids[value]]
            args.append(np.zeros([0] * len(t["dims"]), NUMPY[t["dtype"]]))
        else:
            args.append(value)
    try:
        return select(args).fn or None
    except Exception:  # noqa: BLE001 - no binding for these dtypes: reported by the caller
        return None


def program_impls(program: Any) -> list[tuple[str, str]]:
    """(op, oneDNN implementation) of every op of a program's cpu delegates, in order, from
    an engine made for each delegate and closed again (``EngineHandle.impls``: "" for an op
    on the engine's own kernels). A dynamic delegate is built at its symbols' lower bounds
    and again at their upper bounds (both engines' ops listed)."""
    from opforge.backends.cpu import blob
    from opforge.backends.cpu.dynamic import check_symbolic, concrete_plan
    from opforge.backends.named_data import NamedDataMap

    seen: list[tuple[str, str]] = []
    for delegate in program.delegates:
        doc, data = blob.parse(program.segments[delegate.segment].data)
        plans = [doc]
        if "symbols" in doc:
            exprs = check_symbolic(doc, data)
            plans = [concrete_plan(doc, exprs, {n: b[end] for n, *b in doc["symbols"]})
                     for end in (0, 1)]
        for plan in plans:
            handle = EngineHandle(plan, data, 1, 1 << 30, None, {}, named=NamedDataMap(program))
            try:
                seen += list(zip(handle.describe(), handle.impls()))
            finally:
                handle.close()
    return seen
