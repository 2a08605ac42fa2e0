"""The lean runtime loads and runs a program file in a process where `import torch` fails.

The program is built by hand with opforge.program's dataclasses, so this test needs no
torch either: linear (constants) → relu → softmax, plus an add with a scalar alpha. The
child process runs it through the Python API and through `opforge run`, checks the numbers
against NumPy and asserts torch was never imported.
"""

from __future__ import annotations


import numpy as np

from opforge.program import (
    ArenaStorage, BoolValue, ConstantStorage, IntValue, KernelCall, MemoryPlan, Method,
    NoneValue, Operator, Program, ScalarType, Segment, TensorValue, save,
)


F32 = ScalarType.FLOAT32


def _program(weight: np.ndarray, bias: np.ndarray) -> Program:
    segment = np.zeros(128, dtype=np.uint8)
    segment[:weight.nbytes] = weight.view(np.uint8).ravel()
    segment[64:64 + bias.nbytes] = bias.view(np.uint8)
    a = lambda shape, offset: TensorValue(F32, shape, storage=ArenaStorage(0, offset))  # noqa
    values = (
        a((2, 4), 0),                                             # 0 x
        TensorValue(F32, (3, 4), storage=ConstantStorage(0, 0)),  # 1 weight
        TensorValue(F32, (3,), storage=ConstantStorage(0, 64)),   # 2 bias
        a((2, 3), 64),                                            # 3 linear
        a((2, 3), 128),                                           # 4 relu
        IntValue(1), BoolValue(False),                            # 5 dim, 6 half_to_float
        a((2, 3), 192),                                           # 7 softmax
        IntValue(2),                                              # 8 alpha
        a((2, 3), 256),                                           # 9 relu + 2 * softmax
        NoneValue(),
    )
    instructions = (
        KernelCall(0, (0, 1, 2, 3)), KernelCall(1, (3, 4)), KernelCall(2, (4, 5, 6, 7)),
        KernelCall(3, (4, 7, 8, 9)),
    )
    operators = (Operator("aten::linear", "out"), Operator("aten::relu", "out"),
                 Operator("aten::_softmax", "out"), Operator("aten::add", "out"))
    method = Method("forward", values, (0,), (9,), instructions, operators, MemoryPlan((320,)))
    return Program(methods=(method,), segments=(Segment(segment),))


def _expected(x, weight, bias):
    relu = np.maximum(x @ weight.T + bias, 0)
    e = np.exp(relu - relu.max(axis=1, keepdims=True))
    return relu + 2 * e / e.sum(axis=1, keepdims=True)


def test_lean_runtime_and_cli_run_without_torch(tmp_path, python_without_torch):
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((3, 4)).astype(np.float32)
    bias = rng.standard_normal(3).astype(np.float32)
    x = rng.standard_normal((2, 4)).astype(np.float32)
    save(_program(weight, bias), tmp_path / "model.opf")
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "expected.npy", _expected(x, weight, bias))
    code = f"""
        import numpy as np
        from opforge.runtime import load
        d = {str(tmp_path)!r}
        x, expected = np.load(d + "/x.npy"), np.load(d + "/expected.npy")
        forward = load(d + "/model.opf", mode="lean").method("forward")
        for _ in range(3):
            (y,) = forward(x)
            np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-6)
        from opforge.cli import main
        try:
            main(["run", d + "/model.opf", "--input", d + "/x.npy", "--output-dir", d + "/out",
                  "--iterations", "3", "--profile"])
        except SystemExit as e:
            assert not e.code, e.code
        np.testing.assert_allclose(np.load(d + "/out/output_0.npy"), expected, rtol=1e-5,
                                   atol=1e-6)
        assert "torch" not in sys.modules, sorted(m for m in sys.modules if "torch" in m)
        print("ok")
    """
    proc = python_without_torch(code)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert proc.stdout.strip().endswith("ok")
    assert "aten::linear.out" in proc.stdout  # the --profile table


def test_aten_mode_without_torch_is_a_clear_error(tmp_path, python_without_torch):
    save(_program(np.zeros((3, 4), np.float32), np.zeros(3, np.float32)), tmp_path / "m.opf")
    code = f"""
        from opforge.errors import KernelError
        from opforge.runtime import load
        try:
            load({str(tmp_path / "m.opf")!r}, mode="aten")
        except KernelError as e:
            print("KernelError:", e)
    """
    proc = python_without_torch(code)
    assert proc.returncode == 0, proc.stderr
    assert "torch is not importable (torch is not installed here)" in proc.stdout
    assert "--mode lean" in proc.stdout
