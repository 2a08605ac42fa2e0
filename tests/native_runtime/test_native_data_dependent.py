"""Data-dependent sizes on the native runtime (executor="native") and its verifier.

Symbols an instruction produces (opforge/program/produced.py: nonzero's rows, item() as a
size) are bound mid-call by the C++ method as by the lean runtime: held to eager on the
exported cases of tests/torch/test_data_dependent_sizes.py, and to the Python verifier on
hand-built programs (the same programs accepted, the same refused, naming the same field).
"""

from __future__ import annotations

import numpy as np
import pytest

import opforge.program as P
from opforge.errors import KernelError, ProgramError
from opforge.program._sample import unverified_bytes
from opforge.program.symbolic import SizeExpr
from opforge.runtime import load
from tests.native_runtime.test_native_verify import _assert_agree, _byte_mutation

F32, I64 = P.ScalarType.FLOAT32, P.ScalarType.INT64
OPF_OK = 0


def nonzero_program(bound: int = 20) -> P.Program:
    """nonzero of a float (4, 5) input (its truth values): out (u0, 2), u0 in [0, bound]."""
    values = (P.TensorValue(F32, (4, 5), storage=P.ArenaStorage(0, 0)),
              P.TensorValue(I64, (bound, 2), storage=P.ArenaStorage(0, 128)))
    u0 = SizeExpr.sym("u0")
    method = P.Method("forward", values, (0,), (1,), (P.KernelCall(0, (0, 1)),),
                      (P.Operator("aten::nonzero", "out"),), P.MemoryPlan((128 + 64 * (bound // 4 + 1),)),
                      symbols=(P.Symbol("u0", 0, bound),),
                      symbolic_values=(P.SymbolicValue(1, (u0, SizeExpr.const(2))),))
    return P.Program(methods=(method,))


def item_program() -> P.Program:
    """x[:int(n)] of a float (16,) x: a Move of n into an int produces u0 in [0, 16]."""
    values = (P.TensorValue(F32, (16,), storage=P.ArenaStorage(0, 0)),
              P.TensorValue(I64, (), storage=P.ArenaStorage(0, 64)),
              P.IntValue(16), P.IntValue(0), P.NoneValue(), P.IntValue(1),
              P.TensorValue(F32, (16,), storage=P.ArenaStorage(0, 128)))
    u0 = SizeExpr.sym("u0")
    method = P.Method("forward", values, (0, 1), (6,),
                      (P.Move(1, 2), P.KernelCall(0, (0, 3, 4, 2, 5, 6))),
                      (P.Operator("aten::slice_copy", "Tensor_out"),), P.MemoryPlan((192,)),
                      symbols=(P.Symbol("u0", 0, 16),),
                      symbolic_values=(P.SymbolicValue(2, (u0,)), P.SymbolicValue(6, (u0,))))
    return P.Program(methods=(method,))


def _with(program: P.Program, **changes) -> P.Program:
    import dataclasses

    return dataclasses.replace(program, methods=(dataclasses.replace(program.methods[0], **changes),))


def test_hand_built_programs_run_natively_as_on_lean():
    rng = np.random.default_rng(3)
    for program, calls in (
            (nonzero_program(), [(rng.standard_normal((4, 5)).astype(np.float32) > 0).astype(np.float32)
                                 for _ in range(3)] + [np.zeros((4, 5), np.float32)]),
            (item_program(), None)):
        native = load(program, executor="native").method("forward")
        lean = load(program).method("forward")
        if calls is None:
            x = np.arange(16, dtype=np.float32)
            for k in (0, 5, 16, 3):
                (got,), (expected,) = native(x, np.array(k)), lean(x, np.array(k))
                assert got.shape == expected.shape == (k,) and got.tobytes() == expected.tobytes()
            with pytest.raises(ProgramError, match=r"data-dependent size u0 .* found 17 — valid: "
                                                   r"\[0, 16\].*torch._check\(n <= K\)"):
                native(x, np.array(17))
            with pytest.raises(ProgramError, match=r"found -1 — valid: \[0, 16\]"):
                native(x, np.array(-1))
            continue
        for x in calls:
            (got,), (expected,) = native(x), lean(x)
            assert got.shape == expected.shape and got.tobytes() == expected.tobytes()
            assert got.tolist() == np.argwhere(x != 0).tolist()


def test_a_result_past_its_slot_is_refused_by_both_runtimes():
    program = nonzero_program(bound=3)  # fewer rows than the 20 nonzero positions
    ones = np.ones((4, 5), np.float32)
    with pytest.raises(KernelError, match="found 20 — valid: at most 3"):
        load(program, executor="native").method("forward")(ones)
    with pytest.raises(ProgramError, match="found 20 — valid: at most 3"):
        load(program).method("forward")(ones)
    (y,) = load(program, executor="native").method("forward")(np.eye(4, 5, dtype=np.float32)[:, :5] * 0)
    assert y.shape == (0, 2)


# --- the verifiers agree ------------------------------------------------------------------

def _refusals():
    nz, item = nonzero_program(), item_program()
    method = item.methods[0]
    float_n = tuple(P.TensorValue(F32, (), storage=v.storage) if i == 1 else v
                    for i, v in enumerate(method.values))
    u1 = P.Symbol("u1", 0, 4)
    return {
        # the Move that produces u0 removed: slice_copy reads it first
        "read_before_produced": (_with(item, instructions=method.instructions[1:]),
                                 "before an instruction produces it"),
        # u0 read from a float tensor
        "move_from_float": (_with(item, values=float_n), "a static one-element integer tensor"),
        # a symbol nothing produces or binds
        "produced_by_nothing": (_with(nz, symbols=(*nz.methods[0].symbols, u1)),
                                "produced by no instruction"),
        # an input sized by a data-dependent symbol
        "input_sized": (_with(nz, symbolic_values=(
            *nz.methods[0].symbolic_values,
            P.SymbolicValue(0, (SizeExpr.const(4), SizeExpr.parse("min(u0, 20)")))), values=(
            P.TensorValue(F32, (4, 20), storage=P.ArenaStorage(0, 0)), nz.methods[0].values[1])),
                        "yet input 0 is sized by them"),
    }


def test_verifiers_accept_produced_symbols(verify):
    for program in (nonzero_program(), item_program()):
        data = P.to_bytes(program)
        assert P.from_bytes(data) == program
        assert verify(data) == (OPF_OK, "")


@pytest.mark.parametrize("name", sorted(_refusals()))
def test_verifiers_refuse_the_same_programs(verify, name):
    program, needle = _refusals()[name]
    data = unverified_bytes(program)
    with pytest.raises(ProgramError) as python:
        P.from_bytes(data)
    rc, message = verify(data)
    assert rc != OPF_OK and needle in message and needle in str(python.value)
    field = str(python.value).split("`: ", 1)[-1].split(" — ")[0]
    assert field in message  # the same subject


# --- exported models ----------------------------------------------------------------------

def test_exported_cases_run_natively_like_eager():
    pytest.importorskip("torch")
    from opforge.export import export
    from tests.torch.test_data_dependent_sizes import CASES, assert_like_eager

    for cls, example, calls in CASES.values():
        model = cls()
        method = load(export(model, example, kernels="portable"), executor="native").method("forward")
        assert_like_eager(method, model, calls)


def test_cpu_delegated_program_runs_natively():
    torch = pytest.importorskip("torch")
    from opforge.export import export
    from tests.torch.test_data_dependent_sizes import LinearThenSelect, assert_like_eager

    model = LinearThenSelect()
    program = export(model, (torch.randn(4, 5),), backends=["cpu"])
    assert_like_eager(load(program, executor="native").method("forward"), model,
                      [(torch.randn(4, 5),) for _ in range(3)], rtol=1e-5)


def test_cpp_kernels_match_the_numpy_kernels_and_serve_the_lean_runtime(native_runtime):
    from opforge.kernels.portable import portable_kernels
    from opforge.runtime import KernelRegistry
    from opforge.runtime.native import NativeLibrary

    library, numpy_kernels = NativeLibrary(native_runtime.portable_library), portable_kernels()
    rng = np.random.default_rng(5)
    for x in (rng.standard_normal((3, 4, 2)) > 0.3, np.zeros((2, 5), np.float32),
              (rng.standard_normal((6,)) > 0).astype(np.int32), np.array(2.5, np.float32)):
        outs = [np.full((x.size, x.ndim), 0x5A, np.int64) for _ in range(2)]
        got = library.kernel("aten::nonzero.out")(x, outs[0])
        expected = numpy_kernels["aten::nonzero.out"](x, outs[1])
        assert got.shape == expected.shape and got.tobytes() == expected.tobytes()
        assert outs[0].tobytes() == outs[1].tobytes()  # the same slot contents: a dense prefix
    x = rng.standard_normal((3, 4)).astype(np.float32)
    for mask in (x > 0, (rng.standard_normal((4,)) > 0), np.zeros((3, 1), bool)):  # broadcasts
        outs = [np.zeros(12, np.float32) for _ in range(2)]
        got = library.kernel("aten::masked_select.out")(x, mask, outs[0])
        expected = numpy_kernels["aten::masked_select.out"](x, mask, outs[1])
        assert got.tobytes() == expected.tobytes() and got.shape == expected.shape
    registry = KernelRegistry.portable()
    registry.register("aten::nonzero.out", library.kernel("aten::nonzero.out"),
                      origin=library.path, target="native", override=True)
    method = load(nonzero_program(), registry=registry).method("forward")
    for _ in range(3):
        x = (rng.standard_normal((4, 5)) > 0).astype(np.float32)
        assert method(x)[0].tolist() == np.argwhere(x != 0).tolist()


def test_mutated_produced_programs_agree(verify):
    """Byte mutations of the two hand-built programs: both verifiers accept or refuse each."""
    import random

    rng = random.Random(46)
    corpus = [P.to_bytes(nonzero_program()), P.to_bytes(item_program())]
    accepted = sum(_assert_agree(verify, _byte_mutation(rng, corpus))[0] for _ in range(400))
    assert 0 < accepted < 400, accepted  # both outcomes exercised
