"""opforge.runtime.load(..., executor="native"): the ctypes binding over libopforge_runtime,
held to the lean runtime (the same kernel math runs in both for these programs: outputs
are compared bit for bit), and the native run of ``opforge compare``."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from opforge.errors import (
    ConcurrentCallError, MissingKernelError, ProgramError, RegistrationError,
)
from opforge.program import (
    KernelCall, MemoryPlan, Method, Operator, Program, ScalarType, TensorValue,
    ArenaStorage, to_bytes, save,
)
from opforge.runtime import load
from opforge.runtime.generate import Generator
from opforge.runtime.native_executor import NativeMethod, NativeProgram
from tests.native_runtime._native_programs import (
    add_program, scalar_alpha_program, state_program, toy_decoder,
)


@pytest.fixture(autouse=True)
def _built(native_runtime):
    """Every test here needs the built library (the binding builds it on first use too),
    with the C API in it: skipped only while src/runtime.cpp has not landed."""
    import ctypes

    if not hasattr(ctypes.CDLL(str(native_runtime.runtime_library)), "opf_method_execute"):
        pytest.skip("the native runtime's C API (src/runtime.cpp) has not landed in this tree yet")


def test_load_native_returns_the_binding_and_lean_stays_the_default(tmp_path):
    program = add_program()
    assert type(load(program, executor="native")) is NativeProgram
    assert type(load(program).method("forward")) is not NativeMethod
    save(program, tmp_path / "add.opf")
    for source in (program, to_bytes(program), tmp_path / "add.opf", str(tmp_path / "add.opf")):
        native = load(source, executor="native")
        assert native.method_names == ("forward",)
        (y,) = native.method("forward")(np.ones((1, 4), np.float32), np.full((1, 4), 2, np.float32))
        assert y.tolist() == [[3.0, 3.0, 3.0, 3.0]]


@pytest.mark.parametrize("shape, dtype, alpha", [
    ((1, 4), ScalarType.FLOAT32, 1), ((3, 7, 5), ScalarType.FLOAT32, 3),
    ((17,), ScalarType.FLOAT64, -2), ((4, 4), ScalarType.INT64, 5), ((2, 9), ScalarType.INT32, 1),
])
def test_outputs_match_lean_bit_for_bit(shape, dtype, alpha):
    program = add_program(shape, dtype, alpha)
    rng = np.random.default_rng(1)
    np_dtype = dtype.numpy_dtype()
    x, y = ((rng.standard_normal(shape) * 100).astype(np_dtype) for _ in range(2))
    native = load(program, executor="native").method("forward")
    lean = load(program).method("forward")
    for _ in range(2):  # a second call reuses the instance
        (got,), (expected,) = native(x, y), lean(x, y)
        assert got.dtype == expected.dtype and got.shape == expected.shape
        assert got.tobytes() == expected.tobytes()
    # non-contiguous and list inputs are converted like the lean runtime's
    listed = y.tolist() if np_dtype in (np.float64, np.int64) else y  # a list's own dtype
    (got,) = native(np.asfortranarray(x), listed)
    assert got.tobytes() == lean(np.asfortranarray(x), y)[0].tobytes()


def test_io_specs_scalars_and_views():
    native = load(scalar_alpha_program(), executor="native").method("forward")
    lean = load(scalar_alpha_program()).method("forward")
    assert [(s.dtype, s.shape) for s in native.inputs] == [(s.dtype, s.shape) for s in lean.inputs]
    assert [(s.dtype, s.shape) for s in native.outputs] == [(s.dtype, s.shape) for s in lean.outputs]
    x, y = np.arange(6, dtype=np.float32).reshape(2, 3), np.ones((2, 3), np.float32)
    for alpha in (2.0, -0.5, 3):
        assert native(x, y, alpha)[0].tobytes() == lean(x, y, alpha)[0].tobytes()
    (view,) = native(x, y, 1.0, views=True)
    (copy,) = native(x, y, 1.0)
    assert view.tolist() == copy.tolist()
    native(x, y, 10.0)
    assert view.tolist() == lean(x, y, 10.0)[0].tolist()  # a view: the instance's memory


def test_state_read_write_reset_shared_across_methods():
    native, lean = load(state_program(), executor="native"), load(state_program())
    assert native.state_names == ("count",)
    pairs = [(native.method("forward"), lean.method("forward")),
             (native.method("other"), lean.method("other"))]
    for step in (1.0, 2.5, -4.0, 0.25):
        for n, l in pairs:
            x = np.array([step], np.float32)
            assert n(x)[0].tobytes() == l(x)[0].tobytes()
    assert native.read_state("count").tobytes() == lean.read_state("count").tobytes()
    native.write_state("count", np.array([1.0], np.float32))
    assert pairs[0][0](np.ones(1, np.float32))[0].tolist() == [2.0]
    native.reset_state()
    assert native.read_state("count").tolist() == [5.0]
    with pytest.raises(ProgramError, match="valid: float32 of shape"):
        native.write_state("count", np.zeros(2))
    with pytest.raises(ProgramError):
        native.read_state("nope")


def test_generator_drives_the_native_program_like_the_lean_one():
    program = toy_decoder()
    native, lean = Generator(load(program, executor="native")), Generator(load(program))
    prompt = [3, 1, 4, 1, 5, 9]
    assert native.generate(prompt, 12).tokens == lean.generate(prompt, 12).tokens
    for seed in (0, 5):
        assert native.generate(prompt, 9, temperature=0.9, top_k=6, seed=seed).tokens == \
            lean.generate(prompt, 9, temperature=0.9, top_k=6, seed=seed).tokens


def test_errors_are_opforge_errors_with_the_runtimes_message():
    forward = load(add_program(), executor="native").method("forward")
    with pytest.raises(ProgramError, match="input 0 — found dtype float64"):
        forward(np.ones((1, 4)), np.ones((1, 4), np.float32))
    with pytest.raises(ProgramError, match="exactly 2"):
        forward(np.ones((1, 4), np.float32))
    with pytest.raises(ProgramError):  # the runtime's own size check
        forward(np.ones((2, 4), np.float32), np.ones((2, 4), np.float32))
    with pytest.raises(ProgramError):
        load(b"not a program", executor="native")
    with pytest.raises(ProgramError, match="not in|no method|nope"):
        load(add_program(), executor="native").method("nope")
    values = (TensorValue(ScalarType.FLOAT32, (4,), storage=ArenaStorage(0, 0)),
              TensorValue(ScalarType.FLOAT32, (4,), storage=ArenaStorage(0, 64)))
    unknown = Program(methods=(Method("forward", values, (0,), (1,), (KernelCall(0, (0, 1)),),
                                      (Operator("opforge_test::no_such_op", "out"),),
                                      MemoryPlan((128,))),))
    with pytest.raises(MissingKernelError, match="opforge_test::no_such_op"):
        load(unknown, executor="native")
    with pytest.raises(RegistrationError, match="Python kernels cannot run"):
        load(add_program(), executor="native", kernels=["opforge.examples.my_ops_numpy:register"])
    with pytest.raises(ProgramError, match="mode 'aten'"):
        load(add_program(), executor="native", mode="aten")
    with pytest.raises(ProgramError, match="executor 'gpu'"):
        load(add_program(), executor="gpu")


def test_a_second_thread_in_one_instance_is_refused_or_serialised_never_wrong():
    program = add_program((256, 256))
    forward = load(program, executor="native").method("forward")
    x = np.ones((256, 256), np.float32)
    expected = (x + x).tobytes()
    errors, wrong = [], []

    def work():
        for _ in range(200):
            try:
                (y,) = forward(x, x)
            except ConcurrentCallError:
                errors.append(1)
                continue
            if y.tobytes() != expected:
                wrong.append(1)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong


def test_run_with_a_tracer_records_every_instruction():
    from opforge.runtime import Tracer

    method = load(toy_decoder(), executor="native").method("decode")
    tracer = Tracer()
    method.run([np.array([3]), np.array([0])], tracer=tracer)
    ops = {s.op: s.calls for s in tracer.summary()}
    assert ops["aten::mul.out"] == 2 and ops["aten::fmod.Scalar_out"] == 1
    assert [e for e in tracer.events if e[1] == -1]  # the whole call


def test_compare_program_native_run_outputs_only():
    torch = pytest.importorskip("torch")
    from opforge.compare import compare_program
    from opforge.export import export

    class Model(torch.nn.Module):
        def forward(self, x, y):
            return x * y + x - y

    x, y = torch.randn(3, 5), torch.randn(3, 5)
    program = export(Model(), (x, y))
    try:
        load(program, executor="native")
    except MissingKernelError as e:
        pytest.skip(f"the portable C++ kernels do not cover this program yet: {e}")
    result = compare_program(program, [x.numpy(), y.numpy()], against=["lean", "native"])
    assert result.first_divergence("native") is None
    observed = [row for row in result.rows if row.errors.get("native") is not None]
    assert len(observed) == 1 and observed[0].errors["native"].max_abs == 0.0
    assert result.runs[0].note.startswith("the native C++ runtime: outputs only")


def test_compare_model_native_run():
    torch = pytest.importorskip("torch")
    from opforge.compare import compare

    model = torch.nn.Sequential(torch.nn.Linear(4, 3))
    try:
        result = compare(model, (torch.randn(2, 4),), against=["lean", "native"])
    except MissingKernelError as e:
        pytest.skip(f"the portable C++ kernels do not cover this model yet: {e}")
    assert result.first_divergence("native") is None
    assert sum(row.errors.get("native") is not None for row in result.rows) == 1


def test_opforge_run_executor_native(tmp_path):
    from click.testing import CliRunner

    from opforge.cli.run_cmd import run

    save(add_program((2, 3), alpha=3), tmp_path / "add.opf")
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.save(tmp_path / "x.npy", x)
    result = CliRunner().invoke(run, [str(tmp_path / "add.opf"), "--executor", "native",
                                      "--input", str(tmp_path / "x.npy"), "--input",
                                      str(tmp_path / "x.npy"), "--output-dir", str(tmp_path / "o"),
                                      "--iterations", "3", "--profile"])
    assert result.exit_code == 0, result.output
    assert "native runtime" in result.output and "aten::add.out" in result.output
    (expected,) = load(add_program((2, 3), alpha=3)).method("forward")(x, x)
    assert np.load(tmp_path / "o" / "output_0.npy").tobytes() == expected.tobytes()


@pytest.mark.parametrize("input_order, output_order", [
    ((0, 2, 1), (0, 2, 1)), ((0, 1, 2), (2, 0, 1)), ((1, 2, 0), (0, 1, 2))])
@pytest.mark.parametrize("stage_limit", [NativeMethod.STAGE_LIMIT, 0])  # staged, copied
def test_inputs_and_outputs_in_other_dim_orders(input_order, output_order, stage_limit):
    """The runtime holds a tensor's bytes dense in its dim order (channels-last): the
    binding takes and returns logical arrays, as the lean runtime does."""
    def tensor(offset, order):
        return TensorValue(ScalarType.FLOAT32, (2, 3, 4), storage=ArenaStorage(0, offset),
                           dim_order=order)

    from opforge.program import IntValue

    values = (tensor(0, input_order), tensor(128, input_order), IntValue(1),
              tensor(256, output_order))
    program = Program(methods=(Method("forward", values, (0, 1), (3,), (KernelCall(0, (0, 1, 2, 3)),),
                                      (Operator("aten::add", "out"),), MemoryPlan((384,))),))
    rng = np.random.default_rng(3)
    x, y = (rng.standard_normal((2, 3, 4)).astype(np.float32) for _ in range(2))
    native = load(program, executor="native").method("forward")
    native.STAGE_LIMIT = stage_limit
    (expected,) = load(program).method("forward")(x, y)
    for _ in range(2):
        (got,) = native(x, y)
        assert got.tobytes() == expected.tobytes() and got.tobytes() == (x + y).tobytes()


def test_no_compiler_and_nothing_built_is_a_clear_error(monkeypatch):
    import opforge.native_runtime.build as build
    import opforge.runtime.native_capi as native_capi
    from opforge.errors import BuildError

    def no_compiler(**_):
        raise BuildError("`opforge build`: no C++ compiler found — fix: install g++")

    monkeypatch.setattr(native_capi, "_library", None)
    monkeypatch.delenv(native_capi.LIBRARY_ENV, raising=False)
    monkeypatch.setattr(build, "build_runtime", no_compiler)
    with pytest.raises(BuildError, match="cannot be built here .* OPFORGE_RUNTIME_LIBRARY"):
        load(add_program(), executor="native")


def test_cpu_delegates_find_opforges_engine_without_an_environment_variable(monkeypatch):
    """executor='native' on a cpu-delegated program points the runtime at the engine the
    Python cpu backend uses, so no OPFORGE_CPU_ENGINE is needed; outputs are the Python
    runtime's, bit for bit (the same engine runs the same ops)."""
    pytest.importorskip("torch")
    from opforge.backends.cpu import engine
    if engine.missing():
        pytest.skip(f"cpu backend unavailable: {engine.missing()}")
    from opforge.examples.zoo import ZOO
    from opforge.export import export

    monkeypatch.delenv("OPFORGE_CPU_ENGINE", raising=False)
    model, example = ZOO["mlp"]()
    program = export(model, example, backends=["cpu"])
    assert program.delegates
    inputs = [a.numpy() for a in example]
    (got,) = load(program, executor="native").method("forward")(*inputs)
    (want,) = load(program).method("forward")(*inputs)
    assert got.tobytes() == want.tobytes()
