"""``opforge msop build``: MindSpore's offline compile tool for AOT operators, on opforge.

    op_host/   prototypes (``*.yaml``/``*.yml``/``*.json``: op_name, inputs, outputs,
               dtype_format; optional Python ``out_shape``/``out_dtype`` "module:function")
               and host C++ (``*.cc``/``*.cpp``: NameInferShape, NameInferType)
    op_kernel/ kernels (``*.cc``/``*.cpp``, MindSpore's C signature)

``build_vendor_package`` reads and checks the prototypes, generates one ``NameOpProto``
per op (so the library carries its own prototype), compiles everything into
``lib<vendor>_ops.so`` through the build cache, checks that every op's kernel and
inference are defined, and writes the vendor package to
``<op_host>/../build_out/vendors/<vendor_name>/`` (layout: ``opforge.mindspore.package``).
``install=True`` (``-i``) copies it to ``<install_path>/vendors/<vendor_name>/``
(replacing an older one whole); ``clean=True`` (``-c``) deletes the log and intermediate
files afterwards.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

from opforge.errors import BuildError, ManifestError
from opforge.mindspore.aot import AotLibrary
from opforge.mindspore.compile import compile_library
from opforge.mindspore.definition import _missing_symbol
from opforge.mindspore.op import AotOp
from opforge.mindspore.package import default_install_path, write_package
from opforge.mindspore.reg_info import parse_reg_info

__all__ = ["build_vendor_package", "VendorBuild"]

API = "opforge msop build"
_VENDOR = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*\Z")
_PROTOTYPES = (".yaml", ".yml", ".json")
_SOURCES = (".cc", ".cpp", ".cxx")


@dataclass(frozen=True)
class VendorBuild:
    package: Path  # build_out/vendors/<vendor_name>
    installed: Path | None
    ops: tuple[str, ...]
    library: Path


def build_vendor_package(op_host_path, op_kernel_path, *, vendor_name: str = "customize",
                         install_path=None, install: bool = False, clean: bool = False,
                         cache_root: Path | None = None) -> VendorBuild:
    """Build (and with ``install`` install) a vendor package; see the module docstring."""
    host, kernel = _folder(op_host_path, "--op_host_path/-o"), _folder(op_kernel_path,
                                                                       "--op_kernel_path/-k")
    if not _VENDOR.match(vendor_name or ""):
        raise BuildError(f"`{API}`: --vendor_name {vendor_name!r} — valid: letters, digits, "
                         "'_', '-', '.' (a folder name) — fix: e.g. --vendor_name customize")
    root = Path(install_path) if install_path else default_install_path()
    if install:
        _check_install_root(root)  # before compiling: a bad path should not cost a build
    prototypes = _prototypes(host)
    sources = sorted(p for d in (host, kernel) for p in d.iterdir() if p.suffix in _SOURCES)
    if not any(p.parent == kernel for p in sources):
        raise BuildError(f"`{API}`: {kernel} — holds no kernel source ({', '.join(_SOURCES)}) "
                         "— fix: put the kernels (MindSpore's C signature) in --op_kernel_path")
    out = host.parent / "build_out"
    work = out / "tmp"
    work.mkdir(parents=True, exist_ok=True)
    generated = work / "opforge_ms_protos.cc"
    generated.write_text(_proto_source(prototypes))
    try:
        library = compile_library([*sources, generated], f"{vendor_name}_ops",
                                  cache_root=cache_root, api=API)
    except BuildError as e:
        (out / "build.log").write_text(str(e))
        raise
    (out / "build.log").write_text(f"built {library} from {', '.join(map(str, sources))}\n")
    ops = _ops(prototypes, library)
    package = write_package(ops, out / "vendors" / vendor_name, vendor_name=vendor_name)
    installed = None
    if install:
        installed = _install(package, root, vendor_name)
    if clean:
        shutil.rmtree(work, ignore_errors=True)
        (out / "build.log").unlink(missing_ok=True)
    return VendorBuild(package, installed, tuple(op.name for op in ops), library)


def _folder(path, option: str) -> Path:
    if path is None:
        raise BuildError(f"`{API}`: {option} — missing — fix: pass the folder")
    p = Path(path)
    if not p.is_dir():
        raise BuildError(f"`{API}`: {option} {str(path)!r} — not a folder — valid: an existing "
                         "folder — fix: check the path")
    return p.resolve()


def _prototypes(host: Path) -> list[tuple[dict, Path]]:
    found = []
    for path in sorted(p for p in host.iterdir() if p.suffix in _PROTOTYPES):
        try:
            data = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError) as e:
            raise ManifestError(f"`{API}`: prototype {path} — cannot be read ({e}) — fix: "
                                "write op_name, inputs, outputs and dtype_format as YAML or "
                                "JSON") from None
        if not isinstance(data, dict) or not data.get("op_name"):
            raise ManifestError(f"`{API}`: prototype {path} — found no op_name — valid: a "
                                "mapping with op_name, inputs, outputs, dtype_format — fix: add "
                                "op_name: Name")
        unknown = set(data) - {"op_name", "inputs", "outputs", "dtype_format", "attr", "target",
                               "out_shape", "out_dtype"}
        if unknown:
            raise ManifestError(f"`{API}`: prototype {path} — unknown key(s) "
                                f"{', '.join(sorted(unknown))} — valid: op_name, inputs, outputs, "
                                "dtype_format, attr, target, out_shape, out_dtype — fix: remove "
                                "or rename them")
        info = parse_reg_info({k: v for k, v in data.items() if k not in ("out_shape",
                               "out_dtype")}, f"{API} ({path})")
        if not info.inputs or not info.outputs:
            raise ManifestError(f"`{API}`: prototype {path} — {info.op_name} has "
                                f"{len(info.inputs)} input(s) and {len(info.outputs)} output(s) "
                                "— valid: at least one of each — fix: list them by name")
        if any(info.op_name == other.op_name for other, _, _ in found):
            first = next(p for other, p, _ in found if other.op_name == info.op_name)
            raise ManifestError(f"`{API}`: prototype {path} — op {info.op_name} is also "
                                f"defined by {first} — fix: one prototype per op")
        found.append((info, path, data))
    if not found:
        raise ManifestError(f"`{API}`: {host} — holds no prototype ({', '.join(_PROTOTYPES)}) "
                            "— fix: describe each op (op_name, inputs, outputs, dtype_format) "
                            "in --op_host_path")
    return found


def _proto_source(prototypes) -> str:
    lines = ["// Generated by `opforge msop build`: each op's prototype, exported from the",
             "// library so that opforge checks every reg_info against it.",
             '#include "custom_aot_extra.h"', ""]
    for info, path, _ in prototypes:
        text = json.dumps(info.to_json(), separators=(",", ":"))
        literal = text.replace("\\", "\\\\").replace('"', '\\"')
        lines.append(f"// {path.name}")
        lines.append(f'OPFORGE_MS_OP_PROTO({info.op_name}, "{literal}")')
    return "\n".join(lines) + "\n"


def _ops(prototypes, library: Path) -> list[AotOp]:
    lib = AotLibrary.open(library, api=API)
    ops = []
    for info, path, data in prototypes:
        functions = lib.functions(info.op_name)
        if not functions.kernel:
            error = _missing_symbol(API, str(library), info.op_name, f"{path.name}: {info.op_name}")
            raise BuildError(str(error).replace(f"`{API}`: ", f"`{API}`: prototype ", 1))
        inference = {}
        for key, symbol, address in (("out_shape", "InferShape", functions.infer_shape_fn),
                                     ("out_dtype", "InferType", functions.infer_type_fn)):
            if data.get(key):
                inference[key] = data[key]
            elif address:
                inference[key] = "cpp"
            else:
                raise BuildError(f"`{API}`: {info.op_name} ({path}) — no {info.op_name}{symbol} "
                                 f"in op_host or op_kernel, and no {key} in the prototype — "
                                 f"fix: define extern \"C\" {info.op_name}{symbol} in op_host, or "
                                 f"add {key}: module:function to {path.name}")
        ops.append(AotOp(info.op_name, info.inputs, info.outputs, "aot", str(library),
                         info.op_name, None, info.dtype_rows(), inference["out_shape"],
                         inference["out_dtype"], info.attrs, source=str(path)))
    return ops


def _check_install_root(root: Path) -> None:
    """``--install_path`` and ``<it>/vendors`` must be folders, or not exist yet."""
    for path in (root, root / "vendors"):
        for parent in (path, *path.parents):
            if parent.exists() or parent.is_symlink():
                if not parent.is_dir():
                    raise BuildError(
                        f"`{API}`: --install_path {str(root)!r} — {str(parent)!r} is a file, not "
                        "a folder — valid: a folder (created if missing) — fix: pass a folder "
                        "path, or move the file away")
                break


def _install(package: Path, root: Path, vendor_name: str) -> Path:
    _check_install_root(root)
    target = root / "vendors" / vendor_name
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        return _replace_folder(package, target, vendor_name)
    except OSError as e:
        from opforge._user_files import os_error_text

        raise BuildError(f"`{API} -i`: --install_path: "
                         f"{os_error_text(e, e.filename or target, 'write')}") from None


def _replace_folder(package: Path, target: Path, vendor_name: str) -> Path:
    staging = Path(tempfile.mkdtemp(prefix=f".{vendor_name}.", dir=target.parent))
    try:
        shutil.copytree(package, staging, dirs_exist_ok=True)
        if target.exists():
            old = target.with_name(f".{vendor_name}.old.{os.getpid()}")
            os.replace(target, old)
            os.replace(staging, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target
