"""A native kernel library as the eager PyTorch implementation of its custom ops.

``use_native_library("libmy_ops.so")`` makes each custom op of the library run its C++
kernel when called eagerly (``torch.ops.my_ops.mul3(x)``): the same compiled library the
lean runtime loads, so one C++ source serves eager PyTorch, export and the runtime.

Tensors reach the kernel as views of their own memory (``Tensor.numpy()`` shares it; the
ABI carries strides, so non-contiguous CPU tensors are not copied either). Output tensors
are allocated from the op's fake (shape) function and written in place by the kernel.
ATen ops in the library (``op: add.out`` entries) are left to PyTorch in eager mode; the
lean runtime uses them (see docs/kernel-abi.md).
"""

from __future__ import annotations

import ast
import os
from typing import Callable

import torch

from opforge.errors import KernelError, RegistrationError
from opforge.manifest import OpDef, load_definitions
from opforge.runtime.native import NativeKernel, NativeLibrary
from opforge.schema import FunctionSchema
from opforge.torch_bridge.registration import is_registered, register, set_out_kernel

__all__ = ["use_native_library", "native_eager_kernel", "stop_using_native_library"]

_IN_USE: dict[str, list[str]] = {}  # library path -> op names it serves


def use_native_library(path: str | os.PathLike, *,
                       manifest: str | os.PathLike | list[OpDef] | None = None,
                       command: str | None = None) -> NativeLibrary:
    """Make the library's kernels the eager implementation of its custom ops.

    Each op must be registered with PyTorch (``opforge.torch_bridge.register``); pass
    ``manifest`` (definitions, or anything ``load_definitions`` reads) to register the ones
    that are not yet. ``command`` (``"opforge check"``) words errors for a CLI user, with
    the command's arguments instead of Python calls. Returns the loaded library.

    >>> from opforge.torch_bridge.native_eager import use_native_library   # doctest: +SKIP
    >>> use_native_library("libmy_ops.so", manifest="my_ops.yaml")        # doctest: +SKIP
    >>> torch.ops.my_ops.mul3(torch.arange(3.0))                          # doctest: +SKIP
    tensor([0., 3., 6.])
    """
    library = NativeLibrary(path)
    if manifest is not None:
        defs = load_definitions(manifest) if isinstance(manifest, (str, os.PathLike)) \
            else manifest
        register([d for d in defs if not d.is_aten and not is_registered(d.name)])
    served = []
    for key in library.keys():
        name = key.rpartition(".")[0]
        if name.startswith("aten::"):
            continue  # eager ATen ops stay PyTorch's own
        if not is_registered(name) and command is not None:
            raise RegistrationError(
                f"`{command}`: {name} — the library {library.path} serves it, but the "
                "MANIFEST given does not define it — valid: the manifest (or @opforge.op "
                "module) the library was built from — fix: pass that one as MANIFEST, e.g. "
                f"`{command} my_ops.yaml --kernels {library.path}`")
        if not is_registered(name):
            raise RegistrationError(
                f"`use_native_library({library.path!r})`: {name} — not registered with PyTorch "
                "by opforge — fix: register its manifest first "
                "(opforge.torch_bridge.register_manifest(path)) or pass manifest=")
        kernel = library.kernel(key)
        set_out_kernel(name, native_eager_kernel(kernel))
        served.append(name)
    _IN_USE[library.path] = served
    return library


def stop_using_native_library(path: str | os.PathLike) -> None:
    """Undo ``use_native_library``: its ops go back to their Python implementations."""
    for name in _IN_USE.pop(os.path.abspath(os.fspath(path)), []):
        set_out_kernel(name, None)


def _default(text: str | None):
    if text is None:
        return None
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text  # an enum name (e.g. contiguous_format): passed through


def _to_numpy(value, where: str):
    if isinstance(value, torch.Tensor):
        if value.device.type != "cpu":
            raise KernelError(f"{where}: native kernels run on CPU tensors, got one on "
                              f"{value.device} — move it with .cpu()")
        return value.detach().numpy()  # shares the tensor's memory, strides included
    if isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in value):
        return [None if v is None else _to_numpy(v, where) for v in value]
    if isinstance(value, torch.dtype):
        return torch.empty((), dtype=value).numpy().dtype
    return value


def native_eager_kernel(kernel: NativeKernel) -> Callable:
    """Adapt a native kernel to ``set_out_kernel``'s convention: ``fn(*args, outs, **kwargs)``
    with the functional call's arguments and the out tensors to write."""
    out_schema = FunctionSchema.parse(kernel.schema)
    functional = out_schema.functional_variant()
    params = [(a.name, _default(a.default), a.default is not None)
              for a in functional.arguments.flat]
    where = f"`{kernel.key}` (native, eager)"
    outs_are_list = len(out_schema.arguments.out) == 1 and str(out_schema.arguments.out[0].type) != "Tensor"

    def run(*args, outs, **kwargs):
        values = list(args)
        for name, default, has_default in params[len(args):]:
            if name in kwargs:
                values.append(kwargs[name])
            elif has_default:
                values.append(default)
            else:
                raise KernelError(f"{where}: missing argument '{name}'")
        flat = [_to_numpy(v, where) for v in values]
        out_arrays = [_to_numpy(o, where) for o in outs]
        if outs_are_list:
            kernel(*flat, out_arrays)
        else:
            kernel(*flat, *out_arrays)

    run.__name__ = f"native:{kernel.key}"
    return run
