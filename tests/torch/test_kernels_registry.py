"""The portable registry: keys name real ATen out overloads, each kernel accepts exactly
its schema's positional arguments, and duplicates are refused with the first's origin.
"""

from __future__ import annotations

import inspect

import pytest
import torch

from opforge.errors import RegistrationError
from opforge.kernels import portable
from opforge.kernels.portable import portable_kernels
from opforge.kernels.portable._registry import kernel_decorator

KERNELS = portable_kernels()


def _schema(key: str):
    ns, rest = key.split("::")
    name, overload = rest.split(".")
    from opforge.torch_bridge.library_ops import LIBRARY_OUT_SCHEMAS, ensure_registered

    if ns == "transformers":  # the library may be absent: the schema opforge registers
        return torch._C.parse_schema(f"{ns}::{LIBRARY_OUT_SCHEMAS[f'{ns}::{name}']}")
    if ns != "aten":
        # their out overloads are opforge's (torch_bridge.library_ops), registered on first
        # use: this file must not depend on another test having used them in its process
        ensure_registered(ns)
    return getattr(getattr(getattr(torch.ops, ns), name), overload)._schema


@pytest.mark.parametrize("key", sorted(KERNELS))
def test_key_is_an_out_overload_and_arity_matches(key):
    schema = _schema(key)
    outs = [a for a in schema.arguments
            if a.kwarg_only and a.alias_info is not None and a.alias_info.is_write]
    assert outs, f"{key} is not an out overload"
    params = inspect.signature(KERNELS[key]).parameters.values()
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return
    assert len(params) == len(schema.arguments), f"{key}: {schema}"


def test_duplicate_key_in_a_module_names_the_first_definition():
    table: dict = {}
    kernel = kernel_decorator(table)

    @kernel("aten::foo.out")
    def first(out):
        pass

    with pytest.raises(RegistrationError, match=r"test_kernels_registry\..*first"):
        @kernel("aten::foo.out")
        def second(out):
            pass


def test_malformed_key_is_refused():
    kernel = kernel_decorator({})
    with pytest.raises(RegistrationError, match="namespace::op.overload"):
        kernel("add.out")(lambda out: None)


def test_cross_module_duplicate_is_refused(monkeypatch):
    monkeypatch.setitem(portable.unary.KERNELS, "aten::add.out", lambda *a: None)
    with pytest.raises(RegistrationError, match="arithmetic and opforge.kernels.portable.unary"):
        portable_kernels()


def test_portable_kernels_returns_a_fresh_dict():
    a = portable_kernels()
    a.clear()
    assert portable_kernels()
