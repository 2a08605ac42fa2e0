"""ATen mode runs only allow-listed torch operators: a program file is untrusted data.

Hand-built programs (opforge.program dataclasses) calling file, print and non-core ops are
refused at load with a ProgramError naming the op, why, and how to allow it; core ATen
out variants, opforge-registered custom ops and explicitly allowed ops run.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from opforge.errors import ProgramError, RegistrationError
from opforge.kernels.aten import aten_kernel, unchecked_aten_kernel
from opforge.kernels.aten_allowlist import AtenOps, denial, refusal
from opforge.kernels.portable import portable_kernels
from opforge.program import (
    ArenaStorage, IntValue, KernelCall, MemoryPlan, Method, NoneValue, Operator,
    Program, ScalarType, StringValue, TensorValue, to_bytes,
)
from opforge.runtime import KernelRegistry, load

F32, U8 = ScalarType.FLOAT32, ScalarType.UINT8
NON_CORE = "aten::hypot.out"  # a real, harmless op outside core ATen and the portable set


def _arena(dtype, sizes, offset):
    return TensorValue(dtype, sizes, storage=ArenaStorage(0, offset))


def _from_file_program(path: str, size: int) -> Program:
    # aten::from_file.out(str filename, bool? shared=None, int? size=0, *, Tensor(a!) out)
    values = (StringValue(path), NoneValue(), IntValue(size), _arena(U8, (size,), 0))
    forward = Method("forward", values, (), (3,), (KernelCall(0, (0, 1, 2, 3)),),
                     (Operator("aten::from_file", "out"),), MemoryPlan((64,)))
    return Program(methods=(forward,))


def _unary_program(key: str, overload: str = "out") -> Program:
    values = (_arena(F32, (4,), 0), _arena(F32, (4,), 64))
    forward = Method("forward", values, (0,), (1,), (KernelCall(0, (0, 1)),),
                     (Operator(key, overload),), MemoryPlan((128,)))
    return Program(methods=(forward,))


def _binary_program(key: str, overload: str = "out") -> Program:
    values = (_arena(F32, (4,), 0), _arena(F32, (4,), 64), _arena(F32, (4,), 128))
    forward = Method("forward", values, (0, 1), (2,), (KernelCall(0, (0, 1, 2)),),
                     (Operator(key, overload),), MemoryPlan((192,)))
    return Program(methods=(forward,))


@pytest.fixture
def secret(tmp_path):
    path = tmp_path / "secret.txt"
    path.write_bytes(b"root:x:0:0:secret\n")
    return path


def test_the_from_file_program_is_a_real_exploit_without_the_allow_list(secret):
    # What the refusal below prevents: torch's kernel reads the file named by the program.
    out = np.zeros(18, np.uint8)
    unchecked_aten_kernel("aten::from_file.out").fn(str(secret), None, 18, out)
    assert out.tobytes() == secret.read_bytes()


@pytest.mark.parametrize("as_bytes", [False, True])
def test_from_file_is_refused_at_load(secret, as_bytes):
    program = _from_file_program(str(secret), 18)
    source = to_bytes(program) if as_bytes else program
    with pytest.raises(ProgramError) as info:
        load(source, mode="aten")
    message = str(info.value)
    assert message.startswith("`opforge.runtime.load(")
    assert "aten::from_file.out (method 'forward' instruction 0)" in message
    assert "deny-listed: it reads a file named by the program" in message
    assert "allow_ops" in message  # says what can be allowed and that this cannot


def test_save_is_refused_at_load(tmp_path):
    target = tmp_path / "written.pt"
    # aten::save(Tensor self, str filename) -> ()
    values = (_arena(F32, (4,), 0), StringValue(str(target)))
    forward = Method("forward", values, (0,), (0,), (KernelCall(0, (0, 1)),),
                     (Operator("aten::save", ""),), MemoryPlan((64,)))
    with pytest.raises(ProgramError, match=r"aten::save \(method 'forward' instruction 0\): "
                                           r"deny-listed: it writes a file"):
        load(Program(methods=(forward,)), mode="aten")
    assert not target.exists()


def test_print_is_refused_at_load():
    values = (StringValue("hello from a program"), _arena(F32, (1,), 0))
    forward = Method("forward", values, (), (1,), (KernelCall(0, (0,)),),
                     (Operator("aten::_print", ""),), MemoryPlan((64,)))
    with pytest.raises(ProgramError, match=r"aten::_print .*deny-listed: it prints"):
        load(Program(methods=(forward,)), mode="aten")


def test_a_non_core_op_is_refused_with_how_to_allow_it():
    assert NON_CORE not in portable_kernels()
    assert torch.Tag.core not in torch.ops.aten.hypot.default.tags
    with pytest.raises(ProgramError) as info:
        load(_binary_program("aten::hypot"), mode="aten")
    message = str(info.value)
    assert f"{NON_CORE} (method 'forward' instruction 0): not on the ATen-mode allow-list: " \
           "not the out variant of a core ATen operator" in message
    assert "load(..., allow_ops=['ns::op.overload'])" in message
    assert "registry.allow_ops" in message


def test_a_functional_overload_is_refused():
    with pytest.raises(ProgramError, match="not an out variant"):
        load(_unary_program("aten::relu", ""), mode="aten")


def test_every_refused_op_is_listed_at_once(secret):
    program = _from_file_program(str(secret), 18)
    forward = program.methods[0]
    values = forward.values + (_arena(F32, (4,), 0), _arena(F32, (4,), 0))
    forward = Method("forward", values, (), (3,),
                     forward.instructions + (KernelCall(1, (4, 4, 5)),),
                     forward.operators + (Operator("aten::hypot", "out"),), MemoryPlan((64,)))
    with pytest.raises(ProgramError) as info:
        load(Program(methods=(forward,)), mode="aten")
    message = str(info.value)
    assert "2 operator(s) refused" in message
    assert "aten::from_file.out" in message and NON_CORE in message


def test_allowed_ops_run():
    x = np.array([-1.5, 0.0, 2.0, 3.0], np.float32)
    (y,) = load(_unary_program("aten::relu"), mode="aten").method()(x)
    assert y.tolist() == [0.0, 0.0, 2.0, 3.0]
    (z,) = load(_binary_program("aten::mul"), mode="aten").method()(x, x)
    assert z.tolist() == (x * x).tolist()


def test_allow_ops_lets_a_non_core_op_run():
    x, y = np.array([3, 5, 8, 7], np.float32), np.array([4, 12, 15, 24], np.float32)
    for allow in ([NON_CORE], ["aten::hypot"]):  # the exact key, or every overload
        (z,) = load(_binary_program("aten::hypot"), mode="aten", allow_ops=allow).method()(x, y)
        assert z.tolist() == [5, 13, 17, 25]
    registry = KernelRegistry.aten()
    registry.allow_ops([NON_CORE])
    assert NON_CORE in registry and NON_CORE not in KernelRegistry.aten()
    (z,) = load(_binary_program("aten::hypot"), mode="aten", registry=registry).method()(x, y)
    assert z.tolist() == [5, 13, 17, 25]


def test_the_deny_list_cannot_be_allowed(secret):
    for key in ("aten::from_file.out", "aten::from_file", "aten::save", "profiler::x"):
        with pytest.raises(RegistrationError, match="deny-listed"):
            load(_from_file_program(str(secret), 18), mode="aten", allow_ops=[key])
        with pytest.raises(RegistrationError, match="deny-listed"):
            KernelRegistry.aten().allow_ops([key])


def test_a_custom_op_registered_through_opforge_runs_in_aten_mode():
    from opforge.examples.my_ops import register_examples

    register_examples()
    assert refusal("my_ops::mul3.out") is None
    x = np.array([1.0, -2.0, 0.5, 4.0], np.float32)
    loaded = load(_unary_program("my_ops::mul3"), mode="aten")
    assert loaded.kernel_for("forward", 0).origin == "torch.ops.my_ops.mul3.out"
    (y,) = loaded.method()(x)
    assert y.tolist() == (3 * x).tolist()


_LIB = torch.library.Library("opforge_allow_test", "DEF")
_LIB.define("twice.out(Tensor x, *, Tensor(a!) out) -> Tensor(a!)")
_LIB.define("read.out(str path, *, Tensor(a!) out) -> Tensor(a!)")


def _twice_out(x, *, out):
    return torch.mul(x, 2, out=out)


def _read_out(path, *, out):
    raise AssertionError("a deny-listed op ran")


_LIB.impl("twice.out", _twice_out, "CompositeExplicitAutograd")
_LIB.impl("read.out", _read_out, "CompositeExplicitAutograd")


def test_a_torch_op_not_registered_through_opforge_needs_allow_ops():
    program = _unary_program("opforge_allow_test::twice")
    with pytest.raises(ProgramError, match="not registered through opforge.torch_bridge"):
        load(program, mode="aten")
    x = np.arange(4, dtype=np.float32)
    (y,) = load(program, mode="aten", allow_ops=["opforge_allow_test::twice.out"]).method()(x)
    assert y.tolist() == [0, 2, 4, 6]


def test_an_op_with_a_path_argument_is_deny_listed_whatever_its_namespace():
    assert "string argument 'path'" in denial("opforge_allow_test::read.out")
    with pytest.raises(RegistrationError, match="deny-listed"):
        AtenOps(["opforge_allow_test::read.out"])
    values = (StringValue("/etc/passwd"), _arena(F32, (4,), 0))
    forward = Method("forward", values, (), (1,), (KernelCall(0, (0, 1)),),
                     (Operator("opforge_allow_test::read", "out"),), MemoryPlan((64,)))
    with pytest.raises(ProgramError, match="deny-listed: its string argument 'path'"):
        load(Program(methods=(forward,)), mode="aten")


def test_the_fallback_and_aten_kernel_serve_nothing_off_the_list():
    registry = KernelRegistry.aten()
    for key in ("aten::from_file.out", "aten::save", NON_CORE):
        assert aten_kernel(key) is None and registry.lookup(key) is None
        assert key not in registry and registry.refusal(key)
    assert registry.lookup("aten::add.out").origin == "torch.ops.aten.add.out"
    assert registry.refusal("aten::no_such_op.out") is None  # missing, not refused
    assert aten_kernel("aten::view_copy.out") is not None  # a view's _copy twin
    assert aten_kernel("aten::linear.out") is not None  # kept whole for the portable set


def test_an_unknown_op_is_still_a_missing_kernel():
    from opforge.errors import MissingKernelError

    with pytest.raises(MissingKernelError, match="aten::no_such_op.out"):
        load(_unary_program("aten::no_such_op"), mode="aten")


def test_lean_registries_have_no_allow_list():
    with pytest.raises(RegistrationError, match="no fallback with an allow-list"):
        KernelRegistry.portable().allow_ops(["aten::hypot.out"])
    x = np.array([-1.0, 1.0, 2.0, -3.0], np.float32)
    (y,) = load(_unary_program("aten::relu"), allow_ops=["aten::hypot.out"]).method()(x)
    assert y.tolist() == [0.0, 1.0, 2.0, 0.0]  # lean mode ignores allow_ops



def test_an_op_defined_after_a_first_lookup_is_still_judged():
    key = "opforge_allow_late::thrice.out"
    registry = KernelRegistry.aten()
    assert registry.lookup(key) is None and registry.refusal(key) is None  # unknown: missing
    lib = torch.library.Library("opforge_allow_late", "DEF")
    lib.define("thrice.out(Tensor x, *, Tensor(a!) out) -> Tensor(a!)")
    lib.impl("thrice.out", lambda x, *, out: torch.mul(x, 3, out=out),
             "CompositeExplicitAutograd")
    assert registry.lookup(key) is None
    assert "not registered through opforge" in registry.refusal(key)
