"""ATen mode: PyTorch's own out-variant kernels behind the portable calling convention.

``aten_kernel("aten::add.out")`` wraps ``torch.ops.aten.add.out`` as a ``Kernel`` that the
runtime calls exactly like a portable one: positionally, in schema order, outs included,
NumPy arrays for tensors. Only operators the ATen-mode allow-list admits are served
(``opforge.kernels.aten_allowlist``: core ATen out variants, what opforge's export emits,
custom ops registered through opforge such as ``torch.ops.my_ops.mul3.out`` once
``opforge.examples.my_ops.register_examples()`` ran, and what the caller allows): a
program file is untrusted, and ``aten::from_file.out`` would read any file.

Conversion (per schema argument, decided once from the schema):

* ``np.ndarray`` → ``torch.from_numpy`` (zero-copy: an out array stays the arena view, so
  torch writes straight into the arena); lists of arrays → lists of tensors;
* a NumPy dtype (``ScalarType``) → the torch dtype;
* ``MemoryFormat`` / ``Layout`` / ``Device`` enum numbers → ``torch.memory_format`` /
  ``torch.layout`` / ``torch.device``;
* keyword-only arguments (the outs) are passed by name.

Converting on every call would cost microseconds per argument, so the wrapper has a
``bind(args)`` the executor calls once per instruction: the tensors are made once, and
the hot loop calls ``functools.partial(op, **outs)(*tensors)``. Torch is imported only when
an ATen kernel is first asked for: the lean runtime never imports this module.
A read-only array (a constant in the memory-mapped file) in an argument torch writes to is
refused at bind time: torch would write through the pointer and crash the process.

The tests' reference interpreter (tests/torch/test_export_zoo.py, test-only) converts the
same way; this module is the runtime's own, with conversion decided once per schema.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import numpy as np

from opforge.runtime.registry import Kernel

__all__ = ["aten_kernel", "unchecked_aten_kernel", "AtenOpKernel", "torch_op"]


def torch_op(key: str) -> Any | None:
    """``torch.ops.<ns>.<op>.<overload>`` for ``"ns::op.overload"``, or None if torch has
    no such operator."""
    import torch

    name, _, overload = key.partition(".")
    namespace, _, op = name.partition("::")
    from opforge.torch_bridge.library_ops import LIBRARY_NAMESPACES, ensure_registered

    if namespace in LIBRARY_NAMESPACES:  # their .out overloads are opforge's
        ensure_registered(namespace)
    try:
        packet = getattr(getattr(torch.ops, namespace), op)
        found = getattr(packet, overload or "default")
    except (AttributeError, RuntimeError):
        return None
    return found if isinstance(found, torch._ops.OpOverload) else None  # not a dunder's value


_known: dict[str, Kernel] = {}  # found kernels only: a later-registered custom op is found


def aten_kernel(key: str) -> Kernel | None:
    """The ATen-mode kernel for ``key``: None if torch has no such op or the default
    allow-list refuses it (``opforge.kernels.aten_allowlist.refusal(key)`` says why)."""
    from opforge.kernels.aten_allowlist import refusal

    if refusal(key) is not None:
        return None
    return unchecked_aten_kernel(key)


def unchecked_aten_kernel(key: str) -> Kernel | None:
    """``aten_kernel`` without the allow-list: for a caller that checked ``key`` itself
    (``AtenOps``); never hand it a key read from a program file unchecked."""
    kernel = _known.get(key)
    if kernel is None:
        op = torch_op(key)
        if op is None:
            return None
        kernel = _known[key] = Kernel(key, AtenOpKernel(op),
                                      origin=f"torch.ops.{key.replace('::', '.')}",
                                      target="aten")
    return kernel


class AtenOpKernel:
    """A torch out overload called with the portable convention (see the module doc)."""

    def __init__(self, op: Any) -> None:
        import torch

        self.op = op
        schema = op._schema
        self.schema = str(schema)
        self._names = [a.name for a in schema.arguments]
        self._kwarg_only = [a.kwarg_only for a in schema.arguments]
        self._written = [a.alias_info is not None and a.alias_info.is_write
                         for a in schema.arguments]
        # positions of the written arguments: the loader refuses constants there at load
        self.written = tuple(i for i, w in enumerate(self._written) if w)
        self._converters = [_converter(str(a.real_type), torch) for a in schema.arguments]
        overload = f"{schema.name}.{schema.overload_name}" if schema.overload_name else schema.name
        self._in_place = _IN_PLACE.get(overload)
        self._linear = overload == "aten::linear.out"
        self._matmul = overload == "aten::matmul.out"
        self._sized_by_data = overload in _SIZED_BY_DATA

    def __repr__(self) -> str:
        return f"AtenOpKernel({self.schema})"

    def _convert(self, args: tuple) -> tuple[list, dict]:
        if len(args) != len(self._names):
            raise TypeError(f"{self.schema} takes {len(self._names)} arguments, "
                            f"got {len(args)}")
        positional, keyword = [], {}
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*not writable.*")
            for i, (arg, convert) in enumerate(zip(args, self._converters)):
                if self._written[i] and _read_only(arg):
                    raise ValueError(
                        f"argument {self._names[i]!r} is written by the op but is a read-only "
                        "array (a constant of the program)")
                value = convert(arg)
                if self._kwarg_only[i]:
                    keyword[self._names[i]] = value
                else:
                    positional.append(value)
        return positional, keyword

    def __call__(self, *args: Any) -> None:
        fn, positional = self.bind(args)
        fn(*positional)

    def bind(self, args: tuple) -> tuple:
        """``(callable, args)`` with every conversion done now, for the executor's loop."""
        positional, keyword = self._convert(args)
        if self._in_place is not None and args and args[0] is args[-1]:
            # self is out: a state written in place (export/passes/update_state_in_place.py);
            # the out overload would first copy all of self onto itself, touching every page
            # of a KV cache each step, so write only the positions, as the portable kernel
            return self._in_place, tuple(positional)  # out is keyword-only: not in it
        if self._linear and positional[0].dim() == 1:
            # ATen's linear.out resizes a 1-D input's out to (1, N) and back (a deprecated
            # resize, an error in a later torch): give it the (1, N) view it wants
            return functools.partial(self.op, out=keyword["out"].unsqueeze(0)), (
                positional[0].unsqueeze(0), *positional[1:])
        if self._matmul and positional[0].dim() == 1 and positional[1].dim() == 2:
            # so does matmul.out of a vector and a matrix (mm_out into out, then squeeze_(0)):
            # the planned (N,) out is right; (1, K) @ (K, N) into its (1, N) view is that mm
            return functools.partial(self.op, out=keyword["out"].unsqueeze(0)), (
                positional[0].unsqueeze(0), *positional[1:])
        if self._sized_by_data:
            # the out is its slot at the upper bound; torch resizes an empty view of it to
            # the result's sizes (within the slot's storage: a larger result is torch's
            # "not resizable" error) and returns it: the runtime reads the sizes from it
            out = keyword["out"]
            return functools.partial(_sized_by_data, self.op, out), tuple(positional)
        return functools.partial(self.op, **keyword), tuple(positional)


# out overloads whose result size depends on the inputs' values (opforge/program/produced.py)
_SIZED_BY_DATA = frozenset({"aten::nonzero.out", "aten::masked_select.out", "aten::bincount.out"})


def _sized_by_data(op, out, *args):
    """``op`` into an empty view of ``out``'s slot, which torch resizes; its result dense
    from the slot's start (CPU ``nonzero`` writes it transposed), returned for its sizes."""
    flat = out.view(-1)
    result = op(*args, out=flat[:0].view((0, *out.shape[1:])))
    if not result.is_contiguous():
        dense = result.contiguous()
        flat[:dense.numel()].copy_(dense.view(-1))
        return dense
    return result


def _index_put_in_place(self, indices, values, accumulate) -> None:
    import torch

    # every position checked before anything is written: ATen's index_put_ may write the
    # positions before a bad one, and a state must not keep half a write
    for dim, index in enumerate(indices):
        if index is None or dim >= self.dim():
            continue
        if index.dtype in (torch.bool, torch.uint8):
            break  # a mask shifts the dimensions after it; ATen checks its shape first
        size = self.shape[dim]
        low, high = (int(index), int(index)) if index.numel() == 1 else (
            (int(index.min()), int(index.max())) if index.numel() else (0, 0))
        if low < -size or high >= size:
            bad = low if low < -size else high
            raise IndexError(f"index {bad} is out of bounds for dimension {dim} with size "
                             f"{size} (aten::index_put.out, in place)")
    torch.ops.aten.index_put_.default(self, indices, values, accumulate)


def _slice_scatter_in_place(self, src, dim, start, end, step) -> None:
    import torch

    torch.ops.aten.slice.Tensor(self, dim, start, end, step).copy_(src)


def _select_scatter_in_place(self, src, dim, index) -> None:
    import torch

    torch.ops.aten.select.int(self, dim, index).copy_(src)


# out overloads that the exporter calls with out = self for a state written in place
_IN_PLACE = {"aten::index_put.out": _index_put_in_place,
             "aten::slice_scatter.out": _slice_scatter_in_place,
             "aten::select_scatter.out": _select_scatter_in_place}


def _read_only(arg: Any) -> bool:
    if isinstance(arg, np.ndarray):
        return not arg.flags.writeable
    if isinstance(arg, list):
        return any(_read_only(a) for a in arg)
    return False


def _converter(real_type: str, torch: Any):
    dtypes = {np.dtype(getattr(np, n)): getattr(torch, n) for n in (
        "float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8",
        "uint16", "uint32", "uint64", "bool", "complex64", "complex128")}
    formats = {0: torch.contiguous_format, 1: torch.preserve_format,
               2: torch.channels_last, 3: torch.channels_last_3d}

    def tensor_like(value: Any) -> Any:
        if isinstance(value, np.ndarray):
            return torch.from_numpy(value)
        if isinstance(value, list):
            return [tensor_like(v) for v in value]
        if isinstance(value, np.dtype):
            return dtypes[value]
        return value

    if "MemoryFormat" in real_type:
        return lambda v: formats[v] if type(v) is int else v
    if "Layout" in real_type:
        return lambda v: torch.strided if type(v) is int else v
    if "Device" in real_type:
        return lambda v: torch.device("cpu") if type(v) is int else v
    if "Generator" in real_type:
        return lambda v: None
    return tensor_like
