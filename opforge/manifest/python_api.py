"""Defining an operator in Python: ``@opforge.op(schema)`` on a reference implementation.

>>> import opforge
>>> @opforge.op("my_ops::scale2(Tensor x) -> Tensor")
... def scale2(x):
...     return x * 2
>>> scale2.opdef.out_key
'my_ops::scale2.out'

The decorated function becomes a :class:`CustomOp`: calling it calls the reference
implementation; ``@scale2.register_fake`` attaches a shape/dtype function and
``@scale2.register_samples`` extra samples for ``opforge check``; ``.opdef`` is
the frozen :class:`OpDef` the rest of opforge uses (registration, export, builds).
Nothing is registered with PyTorch until :func:`opforge.torch_bridge.register` is called
(or :meth:`CustomOp.register`), so defining ops never imports torch.
"""

from __future__ import annotations

import inspect
from dataclasses import replace
from typing import Callable

from opforge.errors import ManifestError, SchemaError
from opforge.manifest.model import KernelBinding, OpDef
from opforge.schema import FunctionSchema

__all__ = ["CustomOp", "op"]


def _where(fn: Callable) -> str:
    try:
        return f"{inspect.getsourcefile(fn)}:{inspect.getsourcelines(fn)[1]}"
    except (OSError, TypeError):
        return f"<python {getattr(fn, '__qualname__', fn)!r}>"


class CustomOp:
    """A Python-defined operator: a reference implementation plus its :class:`OpDef`."""

    def __init__(self, opdef: OpDef, impl: Callable) -> None:
        self._opdef = opdef
        self._impl = impl
        self.__doc__ = impl.__doc__
        self.__name__ = getattr(impl, "__name__", opdef.functional.name.name)

    @property
    def opdef(self) -> OpDef:
        return self._opdef

    def __call__(self, *args, **kwargs):
        return self._impl(*args, **kwargs)

    def register_fake(self, fn: Callable) -> Callable:
        """Decorator: the fake (meta) implementation computing output shapes and dtypes."""
        if self._opdef.fake is not None:
            raise ManifestError(f"`{self.__name__}.register_fake`: {self._opdef.name} already has "
                                f"a fake implementation — remove one of the two")
        self._opdef = replace(self._opdef, fake=fn)
        return fn

    def register_samples(self, fn: Callable) -> Callable:
        """Decorator: a function returning ``[(args, kwargs), ...]``, samples ``opforge
        check`` runs besides its own (the manifest's ``samples:``)."""
        if self._opdef.samples is not None:
            raise ManifestError(f"`{self.__name__}.register_samples`: {self._opdef.name} already "
                                "has a samples function — remove one of the two")
        self._opdef = replace(self._opdef, samples=fn)
        return fn

    def register(self) -> None:
        """Register this op with PyTorch (functional, out and fake); see torch_bridge."""
        from opforge.torch_bridge import register

        register(self._opdef)

    def __repr__(self) -> str:
        return f"<opforge op {self._opdef.functional}>"


def op(schema: str, *, kernels: tuple[KernelBinding, ...] | list = (), doc: str = "",
       quantization: object = None) -> Callable:
    """Decorator defining a custom operator from its functional (or out) schema.

    ``kernels`` binds native kernels as in a manifest: ``[KernelBinding("custom::f_out")]``.
    ``quantization`` is the op's quantization contract, as the manifest key writes it
    (``"passthrough"``, ``"float"`` or ``{"inputs": ..., "outputs": ...}``; docs/manifest.md).
    """
    if not isinstance(schema, str):
        raise ManifestError(f"`opforge.op`: the schema must be a string, got {type(schema).__name__}")
    try:
        parsed = FunctionSchema.parse(schema, api="opforge.op")
    except SchemaError as exc:
        raise ManifestError(str(exc)) from None
    if parsed.name.namespace is None or parsed.name.namespace == "aten":
        raise ManifestError(f"`opforge.op`: {parsed.name} — a custom operator needs its own "
                            f"namespace — write e.g. 'my_ops::{parsed.name.name}(...)'")
    if parsed.is_mutating():
        raise ManifestError(f"`opforge.op`: {parsed.name} mutates its input — define the "
                            "functional op; its out variant is derived")

    def decorate(fn: Callable) -> CustomOp:
        if not callable(fn):
            raise ManifestError(f"`opforge.op`: decorates a function, got {fn!r}")
        try:
            opdef = OpDef.from_schema(parsed, kernels=tuple(kernels), python_impl=fn,
                                      doc=doc or (fn.__doc__ or "").strip(), source=_where(fn),
                                      quantization=quantization)
        except SchemaError as exc:
            raise ManifestError(f"`opforge.op`: {parsed.name} — {exc}") from None
        return CustomOp(opdef, fn)

    return decorate
