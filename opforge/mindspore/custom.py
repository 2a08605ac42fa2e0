"""``Custom``: a MindSpore-style custom operator as a real opforge / PyTorch operator.

>>> from opforge.mindspore import Custom, CustomRegOp, DataType        # doctest: +SKIP
>>> add = Custom("./add_custom.cc:CustomAdd", out_shape=lambda x, y: x,
...              out_dtype=lambda x, y: x, func_type="aot")             # doctest: +SKIP
>>> add(torch.ones(3), torch.ones(3))                                   # doctest: +SKIP
tensor([2., 2., 2.])

The definition is checked at once (``opforge.mindspore.definition``); the op is then
registered with ``torch.library`` as ``torch.ops.mindspore.<Name>`` (functional, out and
fake from the op's inference), its eager implementation is the AOT kernel (NumPy views of
the tensors, no copy for contiguous CPU tensors), so ``torch.export`` keeps it as one node,
opforge exports it, ATen mode runs it through PyTorch and the lean runtime runs it from a
vendor package (``write_package`` / ``opforge msop build``).

Defining an op again from the same ``func`` (the same file and kernel name, the same vendor
op, the same Python function) with the same inputs and outputs replaces its kernel and
inference. Two ``Custom`` of one kernel name from different files, or with different
inputs, are two operators, as in MindSpore: the second is registered as
``mindspore::<Name>_2`` (then ``_3``...), and each keeps its own library.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from opforge.errors import KernelError, ManifestError, RegistrationError
from opforge.manifest import OpDef
from opforge.mindspore.definition import UnknownArity, define
from opforge.mindspore.op import NAMESPACE, AotKernel, AotOp
from opforge.schema import FunctionSchema
from opforge.torch_bridge import registration

__all__ = ["Custom", "check"]

# name -> (AotOp, its runtime kernel, OpDef): the op each registered name runs now.
_CURRENT: dict[str, tuple[AotOp, AotKernel, OpDef]] = {}
# name -> where its func came from (see _origin): another origin gets another name.
_ORIGINS: dict[str, str] = {}


class Custom:
    """MindSpore's ``ops.Custom`` for ``func_type="aot"`` and ``"pyfunc"``.

    ``reference`` (an opforge addition) is a Python implementation on tensors used by
    ``opforge.mindspore.check`` to test the kernel; ``bprop`` is accepted and not used
    (opforge defines inference operators).
    """

    def __init__(self, func, out_shape=None, out_dtype=None, func_type="aot", bprop=None,
                 reg_info=None, *, reference: Callable | None = None,
                 cache_root: Path | None = None) -> None:
        api = f"opforge.mindspore.Custom({func!r})" if isinstance(func, str) else \
            "opforge.mindspore.Custom(...)"
        self._definition = (func, out_shape, out_dtype, func_type, reg_info, api, cache_root,
                            reference)
        self._prim_attrs: dict[str, object] = {}
        try:
            self._define(None)
        except UnknownArity:
            # MindSpore's own docstring form: a fixed out_shape and no reg_info; the op is
            # defined by its first call, with that call's number of inputs
            self.op = self.kernel = self.opdef = self.name = None

    def _define(self, n_inputs: int | None) -> None:
        func, out_shape, out_dtype, func_type, reg_info, api, cache_root, reference = \
            self._definition
        op = define(func, out_shape, out_dtype, func_type, reg_info, api=api,
                    cache_root=cache_root, n_inputs=n_inputs)
        # another signature or other dtype rows: another op (MindSpore: another primitive)
        identity = f"{_origin(func)} ({op.schema.partition('(')[2]} {op.dtype_rows}"
        op = replace(op, name=_name_for(op.name, identity))
        if self._prim_attrs:
            op = replace(op, attrs=_with_attrs(op.attrs, self._prim_attrs))
        self.op = op
        self.kernel = AotKernel(self.op)
        self.opdef = _register(self.op, self.kernel, reference)
        self.name = self.op.name

    @property
    def key(self) -> str:
        """The out overload's registry key, ``mindspore::<Name>.out``."""
        return self.op.key

    def add_prim_attr(self, name: str, value) -> "Custom":
        """MindSpore's ``Primitive.add_prim_attr``: an attribute the kernel reads with
        ``Attr<T>(name)`` (it replaces a reg_info value of that name); returns self."""
        from opforge.mindspore.attrs import parse_attr

        api = f"{self!r}.add_prim_attr({name!r}, ...)"
        if not isinstance(name, str) or not name:
            raise ManifestError(f"`{api}`: name {name!r} — valid: a non-empty string — fix: "
                                "add_prim_attr(\"scale\", 2.0)")
        parse_attr(name, None, value, api)  # a value of a type an attribute can have
        self._prim_attrs[name] = value
        if self.op is not None:
            self.op = replace(self.op, attrs=_with_attrs(self.op.attrs, {name: value}))
            self.kernel = AotKernel(self.op)
            _CURRENT[self.op.name] = (self.op, self.kernel, self.opdef)
        return self

    def __call__(self, *inputs):
        if self.op is None:
            self._define(len(inputs))
        if len(inputs) != len(self.op.inputs):
            raise KernelError(f"`{NAMESPACE}::{self.op.name}`: called with {len(inputs)} "
                              f"input(s) — valid: {len(self.op.inputs)} "
                              f"({', '.join(self.op.inputs)}) — fix: pass one tensor per input "
                              "of the registration info")
        return getattr(getattr(torch.ops, NAMESPACE), self.op.name)(*inputs)

    def __repr__(self) -> str:
        if self.op is None:
            return f"<opforge.mindspore.Custom {self._definition[0]!r} (defined at its first call)>"
        return f"<opforge.mindspore.Custom {self.op.schema} ({self.op.source})>"


def _with_attrs(attrs: tuple, values: dict) -> tuple:
    """``attrs`` with ``values`` (name → value) set: an existing entry's value replaced (its
    declared type kept), a new one appended."""
    out = [dict(a, value=values[a.get("name")]) if a.get("name") in values else a for a in attrs]
    known = {a.get("name") for a in attrs}
    out += [{"name": n, "value": v} for n, v in values.items() if n not in known]
    return tuple(out)


def _origin(func) -> str:
    """What makes two definitions the same op: the file and kernel name of "path:Name"
    (not the compiled library: editing a .cc keeps the op), a vendor op's name, or a
    Python function's module and name."""
    if isinstance(func, str):
        path, sep, name = func.rpartition(":")
        return f"{os.path.realpath(path)}:{name}" if sep else f"vendor:{func}"
    return f"{getattr(func, '__module__', '?')}:{getattr(func, '__qualname__', repr(func))}"


def _name_for(name: str, origin: str) -> str:
    """``name`` if free or held by the same origin, else the first free ``name_2``, ``_3``..."""
    candidate, k = name, 1
    while _ORIGINS.setdefault(candidate, origin) != origin:
        k += 1
        candidate = f"{name}_{k}"
    return candidate


def _register(op: AotOp, kernel: AotKernel, reference: Callable | None) -> OpDef:
    schema = FunctionSchema.parse(op.schema)
    name = f"{NAMESPACE}::{op.name}"
    previous = _CURRENT.get(op.name)
    if previous is not None:
        if previous[0].schema != op.schema:
            raise RegistrationError(
                f"`opforge.mindspore.Custom`: {name} — already defined in this process as "
                f"{previous[0].schema} ({previous[0].source}); now {op.schema} ({op.source}) — "
                "valid: one schema per op name — fix: give the new op another name (reg_info "
                "op name and kernel name)")
        if reference is not None or previous[2].python_impl is not None:
            warnings.warn(f"{name}: redefined; the reference implementation of the first "
                          "definition stays", stacklevel=3)
        _CURRENT[op.name] = (op, kernel, previous[2])
        return previous[2]
    opdef = OpDef.from_schema(schema, python_impl=reference, fake=_fake(op.name),
                              doc=f"MindSpore {op.func_type} custom operator", source=op.source)
    if registration.is_registered(name):
        raise RegistrationError(f"`opforge.mindspore.Custom`: {name} — already registered by "
                                f"{registration.registered_ops()[name]} — fix: rename the op")
    registration.register(opdef)
    registration.set_out_kernel(name, _eager(op.name))
    _CURRENT[op.name] = (op, kernel, opdef)
    return opdef


def current(name: str) -> tuple[AotOp, AotKernel]:
    op, kernel, _ = _CURRENT[name]
    return op, kernel


def _fake(name: str) -> Callable:
    def fake(*inputs):
        op, _ = current(name)
        dtypes = [_dtype_name(t) for t in inputs]
        shapes, out_dtypes = op.infer([tuple(int(d) for d in t.shape) for t in inputs], dtypes)
        outs = [inputs[0].new_empty(s, dtype=getattr(torch, d)) for s, d in zip(shapes, out_dtypes)]
        return outs[0] if len(outs) == 1 else tuple(outs)

    fake.__qualname__ = fake.__name__ = f"{name}_fake"
    return fake


def _eager(name: str) -> Callable:
    def eager(*inputs, outs):
        _, kernel = current(name)
        arrays = [_numpy(t, name) for t in (*inputs, *outs)]
        kernel(*arrays)

    return eager


def _dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def _numpy(t: torch.Tensor, name: str) -> np.ndarray:
    if t.device.type != "cpu":
        raise KernelError(f"`{NAMESPACE}::{name}`: a tensor on {t.device} — valid: CPU tensors "
                          "(AOT kernels run on the CPU) — fix: .cpu() the inputs")
    try:
        return t.detach().numpy()
    except TypeError as e:
        raise KernelError(f"`{NAMESPACE}::{name}`: dtype {t.dtype} — has no NumPy equivalent "
                          f"({e}) — fix: convert it, e.g. to float32") from None


def check(custom: Custom, reference: Callable | None = None, *, seed: int = 0):
    """``opforge check`` for one op: fake vs real shapes, kernel vs ``reference`` (or the
    ``reference=`` given to ``Custom``), eager vs the lean runtime's kernel. Returns the
    report (``.ok``, ``.failures``, ``.samples``, ``.dtypes``)."""
    from dataclasses import replace

    from opforge.check import check_op

    opdef = custom.opdef if reference is None else replace(custom.opdef, python_impl=reference)
    return check_op(opdef, custom.kernel, seed=seed)


