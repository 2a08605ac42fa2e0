"""Registering :class:`OpDef`s with PyTorch through ``torch.library``.

For each custom operator three things are registered in its namespace's library:

1. the functional overload, implemented by the Python reference (or by a native kernel
   once one is bound — see :func:`set_out_kernel`);
2. the out overload, implemented by its dedicated kernel if there is one, otherwise by
   the functional implementation followed by a copy into the ``out`` tensor(s);
3. the fake (meta) implementation of both, from ``register_fake``/``fake:`` or, for
   elementwise-shaped ops, a derived default (every Tensor output is shaped like the
   first Tensor input).

Both kernels are registered under ``CompositeExplicitAutograd`` so they serve every
device and are opaque to decompositions (``torch.export`` keeps them as single nodes).
Registering an op twice in one process is an error naming the first registration.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

import torch

from opforge.errors import KernelError, RegistrationError
from opforge.manifest import OpDef, resolve_reference
from opforge.schema import BaseType, FunctionSchema, ListType

__all__ = ["register", "registered_ops", "set_out_kernel", "has_out_kernel", "is_registered",
           "registered_opdef"]

_TENSOR, _TENSOR_LIST = BaseType("Tensor"), ListType(BaseType("Tensor"))

# "ns::name" -> where its definition came from; the libraries must stay alive.
_SOURCES: dict[str, str] = {}
# "ns::name" -> its definition (the quantizer reads its quantization contract)
_OPDEFS: dict[str, OpDef] = {}
_LIBRARIES: dict[str, torch.library.Library] = {}
# "ns::name" -> a callable(*functional args, outs) writing into outs (a native kernel).
_OUT_KERNELS: dict[str, Callable] = {}


def _unqualified(schema: FunctionSchema) -> str:
    return str(replace(schema, name=replace(schema.name, namespace=None)))


def _library(namespace: str) -> torch.library.Library:
    if namespace not in _LIBRARIES:
        _LIBRARIES[namespace] = torch.library.Library(namespace, "FRAGMENT")
    return _LIBRARIES[namespace]


def registered_ops() -> dict[str, str]:
    """``"ns::name"`` → source of every op registered by opforge in this process."""
    return dict(_SOURCES)


def registered_opdef(name: str) -> OpDef | None:
    """The definition opforge registered as ``"ns::name"``, or None."""
    return _OPDEFS.get(name)


def is_registered(name: str) -> bool:
    return name in _SOURCES


def _exists_in_torch(opdef: OpDef) -> bool:
    ns = getattr(torch.ops, opdef.namespace)
    try:
        getattr(ns, opdef.functional.name.name)
    except (AttributeError, RuntimeError):
        return False
    return True


def register(opdefs: OpDef | list[OpDef]) -> None:
    """Register one or more OpDefs with PyTorch (functional, out and fake).

    ATen ops (``op: add.out`` entries) already exist in PyTorch and are skipped.
    """
    for opdef in [opdefs] if isinstance(opdefs, OpDef) else list(opdefs):
        if opdef.is_aten:
            continue
        _register_one(opdef)


def _register_one(opdef: OpDef) -> None:
    name = opdef.name
    if name in _SOURCES:
        raise RegistrationError(
            f"`opforge.torch_bridge.register`: {name} — already registered in this process by "
            f"{_SOURCES[name]}; this second definition comes from {opdef.source} — register each "
            "operator once (remove the duplicate definition, or skip it with is_registered())"
        )
    if _exists_in_torch(opdef):
        raise RegistrationError(
            f"`opforge.torch_bridge.register`: {name} — PyTorch already has an operator of this "
            f"name, defined outside opforge; the opforge definition is at {opdef.source} — pick "
            "another namespace or name"
        )
    reference = resolve_reference(opdef.python_impl, what="python implementation", source=opdef.source)
    fake = resolve_reference(opdef.fake, what="fake implementation", source=opdef.source)
    fake = fake or _default_fake(opdef)
    lib = _library(opdef.namespace)
    functional_name = _qualified_overload(opdef.functional)
    out_name = _qualified_overload(opdef.out)

    lib.define(_unqualified(opdef.functional))
    lib.define(_unqualified(opdef.out))
    _SOURCES[name] = opdef.source
    _OPDEFS[name] = opdef

    lib.impl(functional_name, _functional_impl(opdef, reference), "CompositeExplicitAutograd")
    lib.impl(out_name, _out_impl(opdef, reference), "CompositeExplicitAutograd")
    torch.library.register_fake(f"{opdef.namespace}::{functional_name}", fake, lib=lib)
    torch.library.register_fake(f"{opdef.namespace}::{out_name}", _out_fake(opdef), lib=lib)


def _qualified_overload(schema: FunctionSchema) -> str:
    ov = schema.name.overload
    return f"{schema.name.name}.{ov}" if ov else schema.name.name


def set_out_kernel(name: str, kernel: Callable | None) -> None:
    """Make ``kernel(*args, out...)`` the implementation of op ``name`` (e.g. a native one)."""
    if name not in _SOURCES:
        raise RegistrationError(f"`set_out_kernel`: {name} is not registered by opforge — "
                                "register its OpDef first")
    if kernel is None:
        _OUT_KERNELS.pop(name, None)
    else:
        _OUT_KERNELS[name] = kernel


def has_out_kernel(name: str) -> bool:
    """Is a kernel bound to op ``name`` by :func:`set_out_kernel` (its eager outputs are
    then allocated from the fake's shapes)?"""
    return name in _OUT_KERNELS


def _default_fake(opdef: OpDef) -> Callable:
    schema = opdef.functional
    first = next((a.name for a in schema.arguments.flat if a.type == _TENSOR), None)
    if first is None or not all(r.type == _TENSOR for r in schema.returns):
        def missing(*args, **kwargs):
            raise RegistrationError(
                f"`torch.export`/fake tensors: {opdef.name} — has no fake (shape) implementation, "
                f"and its outputs are not shaped like an input — add one: in Python "
                f"`@{schema.name.name}.register_fake`, or `fake: module:function` in {opdef.source}"
            )
        return missing
    index = [a.name for a in schema.arguments.flat].index(first)

    def elementwise_fake(*args, **kwargs):
        x = args[index] if index < len(args) else kwargs[first]
        outs = tuple(torch.empty_like(x) for _ in schema.returns)
        return outs[0] if len(outs) == 1 else outs

    return elementwise_fake


def _split_out_args(opdef: OpDef, args: tuple, kwargs: dict) -> tuple[tuple, dict, list]:
    out_names = [a.name for a in opdef.out.arguments.out]
    outs = [kwargs.pop(n) for n in out_names]
    return args, kwargs, outs


def _functional_impl(opdef: OpDef, reference: Callable | None) -> Callable:
    def functional(*args, **kwargs):
        kernel = _OUT_KERNELS.get(opdef.name)
        if kernel is not None:
            fake = _out_shapes(opdef, args, kwargs)
            kernel(*args, outs=fake, **kwargs)
            return fake[0] if len(fake) == 1 and opdef.functional.returns[0].type == _TENSOR else tuple(fake)
        if reference is None:
            raise KernelError(
                f"`{opdef.name}`: no eager implementation — the op has neither a Python reference "
                f"implementation nor a loaded native kernel — fixes: 1. add `python: module:function` "
                f"to {opdef.source}; 2. build and load its native kernels (`opforge build`)"
            )
        return reference(*args, **kwargs)

    return functional


def _out_shapes(opdef: OpDef, args: tuple, kwargs: dict) -> list:
    fake = resolve_reference(opdef.fake, what="fake implementation", source=opdef.source)
    result = (fake or _default_fake(opdef))(*args, **kwargs)
    return list(result) if isinstance(result, (tuple, list)) else [result]


def _out_impl(opdef: OpDef, reference: Callable | None) -> Callable:
    functional = _functional_impl(opdef, reference)
    is_list = opdef.out.arguments.out[0].type == _TENSOR_LIST

    def out_variant(*args, **kwargs):
        args, kwargs, outs = _split_out_args(opdef, args, kwargs)
        kernel = _OUT_KERNELS.get(opdef.name)
        if kernel is not None:
            # A native kernel writes straight into the caller's out tensors (resized to the
            # fake's shapes first, as ATen's out variants do): no temporary, no copy.
            targets = outs[0] if is_list else outs
            for target, shaped in zip(targets, _out_shapes(opdef, args, kwargs)):
                if target.shape != shaped.shape:
                    target.resize_(shaped.shape)
            kernel(*args, outs=list(targets), **kwargs)
            if is_list:
                return None
            return outs[0] if len(outs) == 1 else tuple(outs)
        result = functional(*args, **kwargs)
        results = list(result) if isinstance(result, (tuple, list)) else [result]
        targets = outs[0] if is_list else outs
        if len(results) != len(targets):
            raise KernelError(f"`{opdef.out_key}`: the implementation returned {len(results)} "
                              f"tensor(s), the out variant has {len(targets)} out tensor(s)")
        for target, value in zip(targets, results):
            if target.shape != value.shape:
                target.resize_(value.shape)
            target.copy_(value)
        if is_list:
            return None
        return outs[0] if len(outs) == 1 else tuple(outs)

    return out_variant


def _out_fake(opdef: OpDef) -> Callable:
    is_list = opdef.out.arguments.out[0].type == _TENSOR_LIST

    def out_fake(*args, **kwargs):
        _, _, outs = _split_out_args(opdef, args, kwargs)
        if is_list:
            return None
        return outs[0] if len(outs) == 1 else tuple(outs)

    return out_fake
