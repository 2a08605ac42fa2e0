"""Loading compiled op packages and preparing their ops for a backend (NumPy and ctypes
only: no torch, so the lean runtime can run package ops).

The contract with the cpu backend (its engine's call-out ABI, ``opforge/cpu_external.h``)::

    fn, state, keepalive = prepare(node_info, packages=None)

- ``node_info``: the bytes of a :class:`~opforge.backends.oppackage.node.PackageNode`
  (``PackageNode.to_bytes()``, stored in the blob at export; untrusted, checked here) or a
  ``PackageNode``.
- ``packages``: the delegate's ``op_packages`` compile spec (its list of dicts, or the
  ``OpPackageInfo``s parsed from it; optional). When given, the library is the one registered there for the node's package
  and this machine's platform (the path on the device); otherwise the path recorded at export.
- ``fn``: the address of the package op's ``execute``, an ``opforge_ext_fn``; ``state``: the
  address of the op instance ``create`` made for this node (its parameters bound). The
  engine calls ``fn(state, inputs, n_in, outputs, n_out, error, error_size)`` with the
  node's tensors in ``node.inputs`` / ``node.outputs`` order (C-contiguous, the dtypes and
  shapes recorded in the node).
- ``keepalive``: a :class:`PreparedNode`; hold it as long as ``fn``/``state`` are used. Its
  ``close()`` (or garbage collection) calls the op's ``destroy``; the library stays loaded
  for the process (packages are loaded once each, by real path).

Trust. A program file is untrusted data (docs/security.md), and so are the library paths
its nodes and compile specs name, while loading a library runs its code. ``prepare`` loads
a library only when the user allowed it: a path given to ``trust_packages`` (export does it
for the registrations it was given; ``opforge run --op-packages`` would do it for a file's),
or listed in ``$OPFORGE_OP_PACKAGES`` (libraries or folders, separated by ``os.pathsep``).
Anything else is a ``BackendError`` that says how to allow it. ``load_package`` and
``load_packages``, which a user calls with registrations of their own, are not gated.

Each library is checked once when loaded: it can be opened, exports the interface provider
asked for, and reports this opforge's ABI version, the package name it was registered
under, target ``cpu`` and this machine's platform; its op type names are unique.
"""

from __future__ import annotations

import ctypes
import os
import threading
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from opforge._library_paths import OpenedLibrary, open_library, world_writable_problem
from opforge.backends.oppackage.info import OpPackageInfo, parse_op_package_infos
from opforge.backends.oppackage.node import PackageNode
from opforge.backends.oppackage.platforms import host_platform
from opforge.errors import BackendError, shown
from opforge.runtime.threads import note_library_loaded

__all__ = ["ABI_VERSION", "LoadedPackage", "PreparedNode", "load_package", "load_packages",
           "prepare", "host_platform", "trust_packages", "is_trusted", "TRUST_ENV"]

ABI_VERSION = 1  # OPFORGE_OPPACKAGE_ABI_VERSION in include/opforge/oppackage.h
ERROR_SIZE = 1024
TRUST_ENV = "OPFORGE_OP_PACKAGES"
MAX_OPS = 4096
_PARAM_KIND = {"int": 1, "float": 2, "bool": 3}


class _Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int32), ("ndim", ctypes.c_int32),
                ("sizes", ctypes.POINTER(ctypes.c_int64))]


class _Param(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("kind", ctypes.c_int32), ("is_list", ctypes.c_int32),
                ("count", ctypes.c_int64), ("ints", ctypes.POINTER(ctypes.c_int64)),
                ("floats", ctypes.POINTER(ctypes.c_double))]


_CREATE = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.POINTER(_Param), ctypes.c_int32,
                           ctypes.POINTER(_Tensor), ctypes.POINTER(ctypes.c_int32), ctypes.c_int32,
                           ctypes.POINTER(_Tensor), ctypes.c_int32,
                           ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p, ctypes.c_int32)
_EXECUTE = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.POINTER(_Tensor),
                            ctypes.c_int32, ctypes.POINTER(_Tensor), ctypes.c_int32,
                            ctypes.c_char_p, ctypes.c_int32)
_DESTROY = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class _Op(ctypes.Structure):
    _fields_ = [("type_name", ctypes.c_char_p), ("create", ctypes.c_void_p),
                ("execute", ctypes.c_void_p), ("destroy", ctypes.c_void_p)]


class _Interface(ctypes.Structure):
    _fields_ = [("abi_version", ctypes.c_uint32), ("package_name", ctypes.c_char_p),
                ("package_version", ctypes.c_char_p), ("target", ctypes.c_char_p),
                ("platform", ctypes.c_char_p), ("n_ops", ctypes.c_int32),
                ("ops", ctypes.POINTER(_Op)), ("opdef", ctypes.c_char_p)]


_PROVIDER = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_uint32, ctypes.POINTER(ctypes.POINTER(_Interface)))


@dataclass(frozen=True)
class PackageOp:
    type_name: str
    create: int
    execute: int
    destroy: int


@dataclass
class LoadedPackage:
    """A package library, loaded and checked (one per real path per process)."""

    path: str
    name: str
    version: str
    target: str
    platform: str
    interface_provider: str
    ops: dict[str, PackageOp]
    opdef_xml: str
    library: ctypes.CDLL = field(repr=False)
    file: OpenedLibrary | None = field(default=None, repr=False)  # open while loaded

    def opdef(self):
        """The OpDef the package was built from (``OpPackage``, its CPU supplements applied)."""
        from opforge.backends.oppackage.xml_reader import parse_opdef_xml

        return parse_opdef_xml(self.opdef_xml, f"{self.path} (its built-in OpDef)").for_backend("CPU")


_loaded: dict[str, LoadedPackage] = {}
_trusted: set[str] = set()
_lock = threading.Lock()


def trust_packages(paths: Iterable[str | os.PathLike]) -> None:
    """Allow ``prepare`` to load these package libraries (or any library under these
    folders) when a program names them."""
    with _lock:
        _trusted.update(os.path.realpath(p) for p in paths)


def is_trusted(path: str | os.PathLike) -> bool:
    """Whether ``prepare`` may load the library at ``path`` (see the module docstring)."""
    return _trust_entry(os.path.realpath(path)) is not None


def _trust_entry(real: str) -> str | None:
    """The (real) trusted library or folder that allows ``real``, the innermost one."""
    entries = set(_trusted)
    entries.update(os.path.realpath(e) for e in os.environ.get(TRUST_ENV, "").split(os.pathsep) if e)
    allowing = [e for e in entries if real == e or real.startswith(e.rstrip(os.sep) + os.sep)]
    return max(allowing, key=len) if allowing else None


def _text(value: bytes | None) -> str:
    return (value or b"").decode("utf-8", errors="replace")


def load_package(path: str | os.PathLike, *, package_name: str,
                 interface_provider: str | None = None, target: str = "cpu",
                 platform: str | None = None, _gate=None) -> LoadedPackage:
    """Load the package library at ``path`` (once per process) and check it was built for
    ``package_name``, this opforge's ABI, ``target`` and ``platform`` (default: this
    machine's); ``BackendError`` saying what differs and how to fix it."""
    provider_name = interface_provider or f"{package_name}InterfaceProvider"
    where = f"op package {package_name!r} ({path})"
    if target.lower() != "cpu":
        raise BackendError(f"{where}: target {target!r} — only cpu packages run in opforge — "
                           "fix: build it with `opforge oppackage build DIR --target cpu`")
    want_platform = (platform or host_platform()).lower()
    if want_platform != host_platform():
        raise BackendError(f"{where}: registered for platform {want_platform}, this machine is "
                           f"{host_platform()} — fix: register the package built for "
                           f"{host_platform()} (packages for other platforms are skipped by "
                           "load_packages)")
    pkg = _load_once(path, package_name, provider_name, where, gate=_gate)
    if pkg.name != package_name:
        raise BackendError(f"{where}: the library is package {pkg.name!r}, registered as "
                           f"{package_name!r} — fix: set op_package_name to {pkg.name!r}")
    if pkg.interface_provider != provider_name:
        _ = _provider(pkg.library, provider_name, package_name, where)
    return pkg


def _provider(lib: ctypes.CDLL, name: str, package_name: str, where: str):
    try:
        return _PROVIDER(getattr(lib, name))
    except AttributeError:
        default = f"{package_name}InterfaceProvider"
        hint = ""
        if name != default and hasattr(lib, default):
            hint = f" (it does export {default!r})"
        raise BackendError(f"{where}: interface provider {name!r} — the library exports no such "
                           f"symbol{hint} — valid: the package's <PackageName>InterfaceProvider, "
                           f"here {default!r} — fix: set interface_provider to {default!r}, or "
                           "leave it out") from None


def _load_once(path, package_name: str, provider_name: str, where: str, gate) -> LoadedPackage:
    """Open ``path`` once, let ``gate(real_path)`` refuse it, and load that open file (see
    ``opforge._library_paths``: no second lookup of the name between check and load)."""
    try:
        opened = open_library(path)
    except FileNotFoundError:
        raise BackendError(f"{where}: no such file — fix: build it with `opforge oppackage build`"
                           " and register the path of the library it writes") from None
    except OSError as e:
        raise BackendError(f"{where}: cannot be opened ({e.strerror or e}) — valid: a regular "
                           "file, the library `opforge oppackage build` writes — fix: register "
                           "the path of that library") from None
    try:
        if gate is not None:
            gate(opened.real)
        with _lock:
            pkg = _loaded.get(opened.real)
            if pkg is None:
                pkg = _open(opened, package_name, provider_name, where)
                _loaded[opened.real] = pkg
        return pkg
    finally:
        opened.close()  # unless dlopen took it: refused by the gate, or a cache hit


def _open(opened: OpenedLibrary, package_name: str, provider_name: str, where: str) -> LoadedPackage:
    try:
        lib = ctypes.CDLL(opened.load_path, mode=os.RTLD_NOW | os.RTLD_LOCAL)
        note_library_loaded(opened.load_path)  # it may bring an OpenMP or BLAS pool (runtime/threads.py)
    except OSError as e:
        message = str(e).replace(opened.load_path, opened.real)
        if "cannot open shared object file" in message and opened.real not in message:
            raise BackendError(  # a dependency: $ORIGIN is /proc/self/fd for the descriptor
                f"{where}: a library it depends on was not found ({message}) — valid: "
                "dependencies on the loader's path or an absolute rpath (opforge loads a "
                "package from the descriptor it checked, so an rpath of $ORIGIN does not "
                "point beside the package) — fix: link the dependency with -Wl,-rpath,<its "
                "folder>, or add the folder to LD_LIBRARY_PATH") from None
        raise BackendError(f"{where}: cannot be loaded ({message}) — valid: a shared library "
                           f"built by `opforge oppackage build` for {host_platform()} — fix: "
                           "rebuild it on this machine") from None
    real = opened.real
    if not opened.loaded():
        raise BackendError(f"{where}: the dynamic loader returned another library than the "
                           f"file opened ({real}) — fix: load it in a fresh process")
    provider = _provider(lib, provider_name, package_name, where)
    iface_ptr = ctypes.POINTER(_Interface)()
    rc = provider(ABI_VERSION, ctypes.byref(iface_ptr))
    if rc != 0 or not iface_ptr:
        raise BackendError(f"{where}: {provider_name} returned {rc} and no interface — fix: "
                           "rebuild the package with `opforge oppackage build`")
    iface = iface_ptr.contents
    if iface.abi_version != ABI_VERSION:
        raise BackendError(f"{where}: built for op-package ABI version {iface.abi_version}; this "
                           f"opforge speaks version {ABI_VERSION} — fix: rebuild it with this "
                           "opforge (`opforge oppackage build DIR --target cpu`)")
    name, target, plat = _text(iface.package_name), _text(iface.target), _text(iface.platform)
    if target != "cpu":
        raise BackendError(f"{where}: built for target {shown(target)} — valid: cpu — fix: "
                           "`opforge oppackage build DIR --target cpu`")
    if plat != host_platform():
        raise BackendError(f"{where}: built for platform {shown(plat)}, this machine is "
                           f"{host_platform()} — fix: build it here (`opforge oppackage build`)")
    if not 0 <= iface.n_ops <= MAX_OPS:
        raise BackendError(f"{where}: reports {iface.n_ops} ops — valid: 0..{MAX_OPS}")
    if iface.n_ops and not iface.ops:
        raise BackendError(f"{where}: {provider_name} reports {iface.n_ops} ops and a NULL op "
                           "table — valid: an ops pointer to n_ops opforge_pkg_op entries — "
                           "fix: rebuild the package with `opforge oppackage build` (the "
                           "generated interface fills the table)")
    ops: dict[str, PackageOp] = {}
    for i in range(iface.n_ops):
        op = iface.ops[i]
        type_name = _text(op.type_name)
        if not (op.create and op.execute and op.destroy):
            raise BackendError(f"{where}: op {type_name!r} lacks create/execute/destroy")
        if type_name in ops:
            raise BackendError(f"{where}: op type {type_name!r} listed twice by the package")
        ops[type_name] = PackageOp(type_name, op.create, op.execute, op.destroy)
    return LoadedPackage(real, name, _text(iface.package_version), target, plat, provider_name,
                         ops, _text(iface.opdef), lib, opened)


def load_packages(infos: Iterable[OpPackageInfo]) -> dict[str, LoadedPackage]:
    """Load every package of ``infos`` whose platform is this machine's, once per path;
    ``{op_package_name: LoadedPackage}``. Two packages that define the same op type, or
    two libraries registered under one package name, are errors."""
    by_name: dict[str, LoadedPackage] = {}
    owner: dict[str, str] = {}
    for info in infos:
        if info.platform != host_platform():
            continue  # registered for another machine (ExecuTorch skips those the same way)
        pkg = load_package(info.op_package_path, package_name=info.op_package_name,
                           interface_provider=info.interface_provider, target=info.target,
                           platform=info.platform)
        first = by_name.get(pkg.name)
        if first is not None:
            if first.path != pkg.path:
                raise BackendError(f"op package {pkg.name!r}: registered with two libraries, "
                                   f"{first.path} and {pkg.path} — fix: register one path")
            continue
        for type_name in pkg.ops:
            if type_name in owner:
                raise BackendError(
                    f"op type {type_name!r}: defined by package {owner[type_name]!r} and by "
                    f"package {pkg.name!r} ({pkg.path}) — valid: each op type in one registered "
                    "package — fix: rename the op type in one package's OpDef, or register "
                    "only one of them")
            owner[type_name] = pkg.name
        by_name[pkg.name] = pkg
    return by_name


class PreparedNode:
    """One node's op instance (what ``create`` made); ``close()`` destroys it.

    Calling it runs the op from Python on NumPy arrays (tests, and backends without a
    native engine): ``node([x], [out])``.
    """

    def __init__(self, package: LoadedPackage, op: PackageOp, node: PackageNode, impl: int,
                 kept: list) -> None:
        self.package, self.op, self.node, self.impl = package, op, node, impl
        self._kept = kept
        self._execute = _EXECUTE(op.execute)
        self._destroy = _DESTROY(op.destroy)
        self._closed = False

    @property
    def fn(self) -> int:
        return self.op.execute

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._destroy(self.impl)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __call__(self, inputs: Sequence, outputs: Sequence) -> None:
        import numpy as np

        if self._closed:
            raise BackendError(f"{self.node.describe()}: called after close()")
        specs = (*self.node.inputs, *self.node.outputs)
        arrays = (*inputs, *outputs)
        if len(inputs) != len(self.node.inputs) or len(outputs) != len(self.node.outputs):
            raise BackendError(f"{self.node.describe()}: {len(inputs)} inputs and {len(outputs)} "
                               f"outputs — valid: {len(self.node.inputs)} and {len(self.node.outputs)}")
        for a, spec in zip(arrays, specs):
            if (not isinstance(a, np.ndarray) or not a.flags.c_contiguous
                    or tuple(a.shape) != spec.shape or a.dtype != _numpy_dtype(spec.dtype)):
                raise BackendError(f"{self.node.describe()}: an array of {getattr(a, 'dtype', '?')}"
                                   f"{tuple(getattr(a, 'shape', ()))} — valid: C-contiguous "
                                   f"{spec.dtype}{spec.shape}")
        ins, in_keep = _tensors(self.node.inputs, inputs)
        outs, out_keep = _tensors(self.node.outputs, outputs)
        error = ctypes.create_string_buffer(ERROR_SIZE)
        rc = self._execute(self.impl, ins, len(inputs), outs, len(outputs), error, ERROR_SIZE)
        if rc != 0:
            raise BackendError(f"{self.node.describe()}: {error.value.decode('utf-8', 'replace')}")


def _numpy_dtype(name: str):
    from opforge.program.scalar_type import ScalarType

    return ScalarType[name.upper()].numpy_dtype()


def _tensors(specs, arrays=None):
    keep = []
    table = (_Tensor * max(len(specs), 1))()
    for i, spec in enumerate(specs):
        sizes = (ctypes.c_int64 * max(len(spec.shape), 1))(*spec.shape)
        keep.append(sizes)
        data = arrays[i].ctypes.data if arrays is not None else None
        table[i] = _Tensor(data, spec.code, len(spec.shape),
                           ctypes.cast(sizes, ctypes.POINTER(ctypes.c_int64)))
    keep.append(table)
    return table, keep


def _params(node: PackageNode):
    keep = []
    table = (_Param * max(len(node.params), 1))()
    for i, p in enumerate(node.params):
        name = p.name.encode("utf-8")
        ints = floats = None
        if p.kind == "float":
            floats = (ctypes.c_double * max(len(p.values), 1))(*map(float, p.values))
        else:
            ints = (ctypes.c_int64 * max(len(p.values), 1))(*map(int, p.values))
        keep += [name, ints, floats]
        table[i] = _Param(name, _PARAM_KIND[p.kind], int(p.is_list), len(p.values),
                          ctypes.cast(ints, ctypes.POINTER(ctypes.c_int64)) if ints else None,
                          ctypes.cast(floats, ctypes.POINTER(ctypes.c_double)) if floats else None)
    keep.append(table)
    return table, keep


def prepare(node_info: bytes | bytearray | memoryview | PackageNode,
            packages: Iterable[OpPackageInfo] | None = None) -> tuple[int, int, PreparedNode]:
    """``(fn, state, keepalive)`` for one package node (see the module docstring)."""
    node = node_info if isinstance(node_info, PackageNode) else PackageNode.from_bytes(node_info)
    where = f"op-package node {node.package}::{node.op_type} (for {node.custom_op})"
    path, provider = node.package_path, node.interface_provider
    if packages is not None:
        if not all(isinstance(i, OpPackageInfo) for i in packages):
            packages = parse_op_package_infos(list(packages))
        infos = [i for i in packages if i.op_package_name == node.package]
        here = [i for i in infos if i.platform == host_platform()]
        if infos and not here:
            raise BackendError(f"{where}: the compile spec registers package {node.package!r} "
                               f"only for {', '.join(sorted({i.platform for i in infos}))}; this "
                               f"machine is {host_platform()} — fix: register a {host_platform()} "
                               "build of it")
        if here:
            path, provider = here[0].op_package_path, here[0].interface_provider
    def gate(real: str) -> None:  # on the opened file's real path, before it is loaded
        if not is_trusted(real):
            raise BackendError(
                f"{where}: the program names the package library {shown(path)}, and opforge "
                "loads a library a program names (its code runs) only when you allow it — fix: "
                "1. `opforge run PROGRAM --op-packages FILE` with the registration file you "
                f"exported with, or 2. set {TRUST_ENV}={path} (libraries or folders, separated "
                f"by '{os.pathsep}'), or 3. call opforge.backends.oppackage.runtime."
                "trust_packages([...]) before loading the program")
        problem = world_writable_problem(real, _trust_entry(real))
        if problem:
            raise BackendError(
                f"{where}: the library {shown(real)} is trusted, but {problem}: anyone on this "
                "machine could have put their code there — valid: a library in folders only "
                "its owners can write — fix: chmod o-w the folder (or the file), or move the "
                "package to a folder of your own and trust that")

    if node.platform != host_platform():
        raise BackendError(f"{where}: exported for platform {node.platform!r}; this machine is "
                           f"{host_platform()} — fix: export with a package built for it")
    pkg = load_package(path, package_name=node.package, interface_provider=provider,
                       target=node.target, platform=node.platform, _gate=gate)
    op = pkg.ops.get(node.op_type)
    if op is None:
        raise BackendError(f"{where}: the package ({pkg.path}) has no op type {node.op_type!r} — "
                           f"valid: {', '.join(sorted(pkg.ops)) or '(none)'} — fix: rebuild the "
                           "package from the OpDef the model was exported with")
    params, keep_p = _params(node)
    ins, keep_i = _tensors(node.inputs)
    outs, keep_o = _tensors(node.outputs)
    slots = (ctypes.c_int32 * max(len(node.input_slots), 1))(*node.input_slots)
    impl = ctypes.c_void_p()
    error = ctypes.create_string_buffer(ERROR_SIZE)
    rc = _CREATE(op.create)(params, len(node.params), ins, slots, len(node.inputs), outs,
                            len(node.outputs), ctypes.byref(impl), error, ERROR_SIZE)
    if rc != 0 or not impl.value:
        message = error.value.decode("utf-8", "replace") or f"create returned {rc}"
        raise BackendError(f"{where}: the package refused the node: {message}")
    prepared = PreparedNode(pkg, op, node, impl.value, [keep_p, keep_i, keep_o, slots])
    return op.execute, impl.value, prepared
