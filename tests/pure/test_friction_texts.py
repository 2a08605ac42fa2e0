"""Texts users tripped over (issue 16, item 8 and the registry half of item 3).

Each test would have caught the friction point it names: the old text is what it refuses.
"""

from __future__ import annotations

import numpy as np
import pytest

from opforge.errors import KernelError, ProgramError, RegistrationError
from opforge.program import (ArenaStorage, KernelCall, MemoryPlan, Method, Operator, Program,
                             ScalarType, TensorValue)
from opforge.runtime import KernelRegistry, load

F32 = ScalarType.FLOAT32


def _program(op: str, args: tuple[int, ...], values, inputs=(), outputs=()) -> Program:
    ns_op, overload = op.split(".")
    return Program(methods=(Method("forward", tuple(values), inputs, outputs,
                                   (KernelCall(0, args),), (Operator(ns_op, overload),),
                                   MemoryPlan((128,))),))


def _failing(*args) -> None:
    raise ValueError("planted failure")


def _registry(key: str) -> KernelRegistry:
    registry = KernelRegistry.portable()
    registry.register(key, _failing, origin="tests.friction", target="portable")
    return registry


def test_kernel_failure_without_arguments_has_no_empty_argument_list():
    program = _program("texts::noargs.out", (), ())
    method = load(program, registry=_registry("texts::noargs.out")).method()
    with pytest.raises(KernelError) as info:
        method()
    message = str(info.value)
    assert "planted failure" in message
    assert "arguments: ()" not in message and "arguments:" not in message


def test_kernel_failure_lists_arguments_and_names_the_method_once():
    x = TensorValue(F32, (3,), storage=ArenaStorage(0, 0))
    y = TensorValue(F32, (3,), storage=ArenaStorage(0, 64))
    program = _program("texts::twice.out", (0, 1), (x, y), inputs=(0,), outputs=(1,))
    method = load(program, registry=_registry("texts::twice.out")).method()
    with pytest.raises(KernelError) as info:
        method(np.zeros(3, np.float32))
    message = str(info.value)
    assert "arguments: (float32[3], float32[3])" in message
    assert message.count("'forward'") == 1, message


def test_input_error_names_the_method_once():
    x = TensorValue(F32, (3,), storage=ArenaStorage(0, 0))
    y = TensorValue(F32, (3,), storage=ArenaStorage(0, 64))
    program = _program("aten::abs.out", (0, 1), (x, y), inputs=(0,), outputs=(1,))
    method = load(program).method()
    with pytest.raises(ProgramError) as info:
        method(np.zeros(3, np.float64))
    message = str(info.value)
    assert "input 0 — found dtype float64" in message
    assert message.count("'forward'") == 1, message


def test_missing_library_file_is_a_registration_error_naming_the_path(tmp_path):
    missing = tmp_path / "libgone.so"
    x = TensorValue(F32, (3,), storage=ArenaStorage(0, 0))
    y = TensorValue(F32, (3,), storage=ArenaStorage(0, 64))
    program = _program("aten::abs.out", (0, 1), (x, y), inputs=(0,), outputs=(1,))
    with pytest.raises(RegistrationError) as info:
        load(program, kernels=[str(missing)])
    message = str(info.value)
    assert "no such file" in message and str(missing) in message


@pytest.mark.parametrize("given, missing", [({}, "origin and target"),
                                            ({"origin": "m"}, "target"),
                                            ({"target": "portable"}, "origin")])
def test_register_without_origin_or_target_says_what_is_missing(given, missing):
    registry = KernelRegistry.portable()
    with pytest.raises(RegistrationError) as info:
        registry.register("texts::twice.out", _failing, **given)
    message = str(info.value)
    assert f"`KernelRegistry.register('texts::twice.out', ...)`: {missing} — not given" in message
    assert "'portable'" in message and "origin=__name__, target='portable'" in message
    assert "texts::twice.out" not in registry


def test_build_manifest_errors_name_opforge_build(tmp_path):
    from opforge.native import build_library
    from opforge.errors import ManifestError

    bad = tmp_path / "bad.yaml"
    bad.write_text("- func: my_ops::f(Tensor x) -> Tensor\n  colour: red\n")
    with pytest.raises(ManifestError) as info:
        build_library(bad, [tmp_path / "k.cpp"], tmp_path / "libk.so")
    assert str(info.value).startswith("`opforge build`: "), str(info.value)
    assert "unknown key 'colour'" in str(info.value)


def test_signature_says_why_it_renamed_a_parameter(tmp_path):
    """`opforge signature` printed `a_` for a schema argument `a` without a word (issue 43,
    item 7): `a` is a name the generated glue uses, `new` a C++ keyword."""
    import json

    from click.testing import CliRunner

    from opforge.cli import cli

    manifest = tmp_path / "ren.yaml"
    manifest.write_text("- func: ren::f.out(Tensor a, Tensor x, float new, *, Tensor(a!) out) "
                        "-> Tensor(a!)\n  kernels: [{arg_meta: null, kernel_name: custom::f_out}]\n")
    result = CliRunner().invoke(cli, ["signature", str(manifest)])
    assert result.exit_code == 0, result.output
    assert ("// renamed: a → a_ (names the generated glue uses where it calls the kernel); "
            "new → new_ (C++ keywords)") in result.output, result.output
    assert "const opforge::Tensor& a_, const opforge::Tensor& x, double new_" in result.output
    data = json.loads(CliRunner().invoke(cli, ["signature", str(manifest), "--json"]).output)
    assert [r["schema"] for r in data[0]["renamed"]] == ["a", "new"]
