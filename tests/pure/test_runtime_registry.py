"""KernelRegistry: keys, dtype keys, override precedence, duplicates naming both origins."""

from __future__ import annotations

import pytest

from opforge.errors import RegistrationError
from opforge.runtime import Kernel, KernelRegistry


def _k1(*args):
    pass


def _k2(*args):
    pass


def test_register_and_lookup():
    registry = KernelRegistry()
    registry.register("my_ops::mul3.out", _k1, origin="a.py", target="portable")
    kernel = registry.lookup("my_ops::mul3.out")
    assert kernel == Kernel("my_ops::mul3.out", _k1, "a.py", "portable")
    assert "my_ops::mul3.out" in registry
    assert "my_ops::mul4.out" not in registry
    assert registry.lookup("my_ops::mul4.out") is None
    assert registry.keys() == ["my_ops::mul3.out"]
    assert len(registry) == 1


def test_dtype_specific_kernel_wins_over_default():
    registry = KernelRegistry()
    registry.register("aten::add.out", _k1, origin="generic", target="portable")
    registry.register("aten::add.out", _k2, origin="f32", target="native", dtype_key="float32")
    assert registry.lookup("aten::add.out", "float32").origin == "f32"
    assert registry.lookup("aten::add.out", "int64").origin == "generic"
    assert registry.lookup("aten::add.out").origin == "generic"
    assert [k.origin for k in registry.kernels("aten::add.out")] == ["generic", "f32"]


def test_override_takes_precedence_over_portable():
    registry = KernelRegistry.portable()
    portable = registry.lookup("aten::add.out")
    assert portable.target == "portable"
    registry.register("aten::add.out", _k1, origin="libmine.so", target="native", override=True)
    assert registry.lookup("aten::add.out").origin == "libmine.so"
    assert registry.lookup("aten::add.out", "float32").origin == "libmine.so"


def test_duplicate_names_both_origins():
    registry = KernelRegistry()
    registry.register("my_ops::mul3.out", _k1, origin="first.py", target="portable")
    with pytest.raises(RegistrationError, match="first.py") as info:
        registry.register("my_ops::mul3.out", _k2, origin="second.py", target="portable")
    assert "second.py" in str(info.value) and "override=True" in str(info.value)


def test_two_overrides_for_same_key_and_dtype_is_an_error():
    registry = KernelRegistry()
    registry.register("aten::add.out", _k1, origin="liba.so", target="native", override=True)
    registry.register("aten::add.out", _k1, origin="libf.so", target="native", override=True,
                      dtype_key="float32")  # a different dtype key is fine
    with pytest.raises(RegistrationError, match="liba.so") as info:
        registry.register("aten::add.out", _k2, origin="libb.so", target="native", override=True)
    assert "libb.so" in str(info.value)


@pytest.mark.parametrize("key", ["add", "aten.add.out", "aten::", "::add.out", 3])
def test_malformed_keys_are_refused(key):
    with pytest.raises(RegistrationError, match="registry key|not a registry key"):
        KernelRegistry().register(key, _k1, origin="x", target="portable")


def test_non_callable_and_bad_dtype_key_are_refused():
    with pytest.raises(RegistrationError, match="callable"):
        KernelRegistry().register("a::b.out", 3, origin="x", target="portable")
    with pytest.raises(RegistrationError, match="dtype_key"):
        KernelRegistry().register("a::b.out", _k1, origin="x", target="p", dtype_key="Float32")


def test_portable_registry_is_fresh_and_complete():
    from opforge.kernels.portable import portable_kernels

    a, b = KernelRegistry.portable(), KernelRegistry.portable()
    assert set(a.keys()) == set(portable_kernels())
    a.register("my_ops::mul3.out", _k1, origin="x", target="portable")
    assert "my_ops::mul3.out" not in b


def test_fallback_serves_unregistered_keys():
    calls = []

    def fallback(key):
        calls.append(key)
        return Kernel(key, _k1, "fallback", "aten") if key.startswith("aten::") else None

    registry = KernelRegistry(fallback=fallback)
    registry.register("aten::add.out", _k2, origin="mine", target="native")
    assert registry.lookup("aten::add.out").origin == "mine"
    assert registry.lookup("aten::mul.out").origin == "fallback"
    assert "aten::mul.out" in registry and "my::x.out" not in registry
    assert registry.keys() == ["aten::add.out"]
