"""opforge-run and opforge-generate (the native runtime's tools) against the lean runtime.

Hand-built programs (tests/native_runtime/_native_programs.py) always run; exported ones
(the zoo, opforge.examples.decoder) need torch and are skipped, naming the operators the
portable C++ kernels do not cover yet, while those are missing. The same kernel math
runs in both runtimes here (add, mul, fmod, copies), so outputs are compared bit for bit.
"""

from __future__ import annotations

import io
import json
import os
import subprocess

import numpy as np
import pytest

from opforge.errors import ProgramError
from opforge.program import save
from opforge.runtime import load
from opforge.runtime.generate import Generator
from tests.native_runtime._native_programs import (
    add_program, scalar_alpha_program, state_program, toy_decoder,
)


@pytest.fixture(scope="module")
def run_tool(native_runtime):
    for name in ("opforge-run", "opforge-generate"):
        if not native_runtime.tool(name).exists():  # tools link only once the C API exists
            pytest.skip(f"{name} is not built: the native runtime's C API (src/runtime.cpp) "
                        "has not landed in this tree yet")

    def run(name, *args, check=True):
        result = subprocess.run([str(native_runtime.tool(name)), *map(str, args)],
                                capture_output=True, text=True, timeout=120,
                                env={**os.environ, "OMP_NUM_THREADS": "1"})
        if check:
            assert result.returncode == 0, result.stdout + result.stderr
        return result
    return run


def _save_npy(path, array):
    np.save(path, array)
    return path


def test_run_writes_the_lean_runtimes_outputs_bit_for_bit(tmp_path, run_tool):
    save(add_program((3, 5), alpha=2), tmp_path / "add.opf")
    rng = np.random.default_rng(0)
    x, y = (rng.standard_normal((3, 5)).astype(np.float32) for _ in range(2))
    result = run_tool("opforge-run", tmp_path / "add.opf", "--input", _save_npy(tmp_path / "x.npy", x),
                      "--input", _save_npy(tmp_path / "y.npy", y), "--output-dir", tmp_path / "out")
    (expected,) = load(add_program((3, 5), alpha=2)).method("forward")(x, y)
    got = np.load(tmp_path / "out" / "output_0.npy")
    assert got.dtype == expected.dtype and got.shape == expected.shape
    assert got.tobytes() == expected.tobytes()
    assert "wrote 1 output file(s)" in result.stdout


def test_run_takes_a_scalar_input_from_a_0d_npy(tmp_path, run_tool):
    save(scalar_alpha_program(), tmp_path / "alpha.opf")
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    y = np.full((2, 3), 0.5, np.float32)
    run_tool("opforge-run", tmp_path / "alpha.opf", "--input", _save_npy(tmp_path / "x.npy", x),
             "--input", _save_npy(tmp_path / "y.npy", y),
             "--input", _save_npy(tmp_path / "a.npy", np.array(3.0)), "--output-dir", tmp_path / "o")
    (expected,) = load(scalar_alpha_program()).method("forward")(x, y, 3.0)
    assert np.load(tmp_path / "o" / "output_0.npy").tobytes() == expected.tobytes()


def test_run_carries_state_across_an_inputs_list(tmp_path, run_tool):
    save(state_program(), tmp_path / "state.opf")
    steps = [np.array([v], np.float32) for v in (1.0, 2.5, -4.0)]
    lines = [str(_save_npy(tmp_path / f"x{i}.npy", a)) for i, a in enumerate(steps)]
    (tmp_path / "calls.txt").write_text("# one call per line\n" + "\n".join(lines) + "\n")
    run_tool("opforge-run", tmp_path / "state.opf", "--inputs-list", tmp_path / "calls.txt",
             "--output-dir", tmp_path / "out")
    forward = load(state_program()).method("forward")
    for i, a in enumerate(steps):  # 6, 8.5, 4.5: each call sees the state the last one left
        (expected,) = forward(a)
        assert np.load(tmp_path / "out" / f"inference_{i}" / "output_0.npy").tobytes() == \
            expected.tobytes()


def test_run_profile_trace_and_repeat(tmp_path, run_tool):
    save(toy_decoder(), tmp_path / "decoder.opf")
    tokens, positions = np.array([3], np.int64), np.array([0], np.int64)
    trace = tmp_path / "trace.json"
    result = run_tool("opforge-run", tmp_path / "decoder.opf", "--method", "decode",
                      "--input", _save_npy(tmp_path / "t.npy", tokens),
                      "--input", _save_npy(tmp_path / "p.npy", positions),
                      "--profile", "--trace", trace, "--repeat", "4")
    out = result.stdout
    assert "latency over 4 call(s)" in out
    for label in ("aten::mul.out", "aten::add.out", "aten::fmod.Scalar_out"):
        row = next(line for line in out.splitlines() if line.startswith(label + " "))
        assert int(row.split()[1]) == 4 * (2 if label != "aten::fmod.Scalar_out" else 1)
    events = json.loads(trace.read_text())["traceEvents"]
    kernels = [e for e in events if e["cat"] == "kernel"]
    assert all(e["ph"] == "X" and e["dur"] >= 0 for e in events)
    labels = [e["name"] for e in kernels]
    assert labels.count("aten::unsqueeze_copy.out") == 8
    assert sum(e["cat"] == "method" for e in events) == 4
    instructions = {e["args"]["instruction"] for e in kernels}
    assert len(instructions) >= 9  # every kernel call (and the Move) of the method


@pytest.mark.parametrize("name, payload, needle", [
    ("big-endian", "{'descr': '>f4', 'fortran_order': False, 'shape': (1, 4), }", "big-endian"),
    ("fortran", "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", "fortran_order"),
    ("object", "{'descr': '|O', 'fortran_order': False, 'shape': (1, 4), }", "dtype '|O'"),
    ("code", "{'descr': '<f4', 'fortran_order': False, 'shape': __import__('os'), }",
     "cannot be read"),
    ("short", "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1000000000000), }",
     "4000000000000 bytes"),
    ("overflow", "{'descr': '<f8', 'fortran_order': False, 'shape': (4611686018427387904, 4), }",
     "overflows int64"),
])
def test_run_refuses_hostile_npy_files(tmp_path, run_tool, name, payload, needle):
    save(add_program(), tmp_path / "add.opf")
    header = payload.encode()
    header += b" " * (-(10 + len(header) + 1) % 64) + b"\n"
    bad = tmp_path / f"{name}.npy"
    bad.write_bytes(b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header + bytes(16))
    good = _save_npy(tmp_path / "y.npy", np.ones((1, 4), np.float32))
    result = run_tool("opforge-run", tmp_path / "add.opf", "--input", bad, "--input", good,
                      check=False)
    assert result.returncode == 1, result.stdout + result.stderr  # refused, not a crash
    assert needle in result.stderr and "valid:" in result.stderr


def test_run_reads_every_npy_version_and_refuses_a_fifo(tmp_path, run_tool):
    save(add_program(), tmp_path / "add.opf")
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    for version in ((1, 0), (2, 0), (3, 0)):
        buffer = io.BytesIO()
        np.lib.format.write_array(buffer, x, version=version)
        (tmp_path / "x.npy").write_bytes(buffer.getvalue())
        run_tool("opforge-run", tmp_path / "add.opf", "--input", tmp_path / "x.npy",
                 "--input", tmp_path / "x.npy", "--output-dir", tmp_path / "out")
        assert np.load(tmp_path / "out" / "output_0.npy").tolist() == [[0.0, 2.0, 4.0, 6.0]]
    os.mkfifo(tmp_path / "fifo.npy")
    result = run_tool("opforge-run", tmp_path / "add.opf", "--input", tmp_path / "fifo.npy",
                      "--input", tmp_path / "x.npy", check=False)
    assert result.returncode == 1 and "not a regular file" in result.stderr


def test_run_reports_the_runtimes_errors(tmp_path, run_tool):
    (tmp_path / "bad.opf").write_bytes(b"not a program at all")
    result = run_tool("opforge-run", tmp_path / "bad.opf", check=False)
    assert result.returncode == 1 and "OPF_ERR_PROGRAM" in result.stderr
    save(add_program(), tmp_path / "add.opf")
    result = run_tool("opforge-run", tmp_path / "add.opf", "--method", "nope", check=False)
    assert result.returncode == 1 and "nope" in result.stderr
    x = _save_npy(tmp_path / "x.npy", np.ones((2, 4), np.float32))  # wrong shape
    result = run_tool("opforge-run", tmp_path / "add.opf", "--input", x, "--input", x, check=False)
    assert result.returncode == 1 and "OPF_ERR_INPUT" in result.stderr
    result = run_tool("opforge-run", tmp_path / "add.opf", "--input", x, check=False)
    assert result.returncode == 2 and "exactly 2" in result.stderr
    result = run_tool("opforge-run", tmp_path / "add.opf", "--kernels", tmp_path / "none.so",
                      check=False)
    assert result.returncode == 1 and "OPF_ERR_LIBRARY" in result.stderr and "none.so" in result.stderr


def _generate(run_tool, path, prompt, max_new, *options):
    result = run_tool("opforge-generate", path, "--tokens", ",".join(map(str, prompt)),
                      "--max-new-tokens", max_new, "--json", *options)
    return json.loads(result.stdout)


@pytest.mark.parametrize("layout", ["flat", "batched"])
def test_generate_gives_pythons_tokens_greedy_and_seeded(tmp_path, run_tool, layout):
    program = toy_decoder(layout=layout)
    save(program, tmp_path / "decoder.opf")
    generator = Generator(load(program))
    prompt = [3, 1, 4, 1, 5, 9]  # 4 through prefill, 2 through decode (static prefill)
    native = _generate(run_tool, tmp_path / "decoder.opf", prompt, 8)
    python = generator.generate(prompt, 8)
    assert native["tokens"] == list(python.tokens) and native["stop_reason"] == "length"
    assert generator.signature.layout == layout
    for seed, temperature, top_k in ((0, 1.0, None), (1, 0.7, 5), (7, 1.5, 3), (123, 0.3, None)):
        options = ["--temperature", temperature, "--seed", seed] + (
            ["--top-k", top_k] if top_k else [])
        native = _generate(run_tool, tmp_path / "decoder.opf", prompt, 10, *options)
        python = generator.generate(prompt, 10, temperature=temperature, top_k=top_k, seed=seed)
        assert native["tokens"] == list(python.tokens), (seed, temperature, top_k)


def test_generate_stops_at_capacity_and_end_tokens_as_python(tmp_path, run_tool):
    program = toy_decoder()
    save(program, tmp_path / "decoder.opf")
    generator = Generator(load(program))
    native = _generate(run_tool, tmp_path / "decoder.opf", [2, 7], 40)
    python = generator.generate([2, 7], 40)
    assert native["stop_reason"] == python.stop_reason == "capacity"
    assert native["tokens"] == list(python.tokens) and len(python.tokens) == 20 - 2 + 1
    eos = python.tokens[3]
    native = _generate(run_tool, tmp_path / "decoder.opf", [2, 7], 40, "--eos-id", eos)
    python = generator.generate([2, 7], 40, eos_ids=[eos])
    assert native["stop_reason"] == python.stop_reason == "eos"
    assert native["tokens"] == list(python.tokens)
    result = run_tool("opforge-generate", tmp_path / "decoder.opf", "--tokens", "1,99", check=False)
    assert result.returncode == 1 and "[0, 20)" in result.stderr
    result = run_tool("opforge-generate", tmp_path / "decoder.opf", "--tokens", "1", "--top-p",
                      "0.9", check=False)
    assert result.returncode == 2 and "top-p" in result.stderr


def test_generate_warmup_repeat_memory_and_arenas(tmp_path, run_tool):
    """--warmup runs generations counted in no rate; --json lists each counted one's times
    and the process's memory; the tool's mapped arenas and the runtime's own (which it
    zeroes) give Python's tokens alike."""
    program = toy_decoder()
    save(program, tmp_path / "decoder.opf")
    python = Generator(load(program)).generate([3, 1, 4, 1, 5], 9)
    for arenas in ([], ["--runtime-arenas"]):
        native = _generate(run_tool, tmp_path / "decoder.opf", [3, 1, 4, 1, 5], 9, "--warmup", 2,
                           "--repeat", 3, *arenas)
        assert native["tokens"] == list(python.tokens), arenas
        assert native["warmup"] == 2 and native["repeat"] == 3
        assert len(native["prefill_seconds_each"]) == len(native["decode_seconds_each"]) == 3
        assert sorted(native["decode_seconds_each"])[1] == pytest.approx(native["decode_seconds"],
                                                                          rel=1e-5)
        end, loaded = native["memory_end"], native["memory_loaded"]
        if os.path.exists("/proc/self/status"):  # Linux: the process's own VmHWM
            assert end["vm_hwm_kb"] >= end["vm_rss_kb"] > 0 and end["vm_hwm_kb"] >= loaded["vm_rss_kb"]
    result = run_tool("opforge-generate", tmp_path / "decoder.opf", "--tokens", "1",
                      "--warmup", "-1", check=False)
    assert result.returncode == 2 and "--warmup" in result.stderr


# --- exported programs (torch): run when the portable C++ kernels cover them ------------

def _native_or_skip(program):
    """The program on the native runtime: every method's instance can be made (all its
    kernels exist and take the program's arguments, wrapped numbers included)."""
    native = load(program, executor="native")
    for name in native.method_names:
        native.method(name)
    return native


@pytest.mark.parametrize("name", ["mlp", "cnn", "transformer_layer", "gpt_decoder"])
def test_run_zoo_model_matches_lean(tmp_path, run_tool, name):
    torch = pytest.importorskip("torch")
    from opforge.examples.zoo import ZOO
    from opforge.export import export

    model, example = ZOO[name]()
    program = export(model, example)
    _native_or_skip(program)
    save(program, tmp_path / "model.opf")
    inputs = [np.asarray(a.numpy() if isinstance(a, torch.Tensor) else a) for a in example]
    args = []
    for i, a in enumerate(inputs):
        args += ["--input", _save_npy(tmp_path / f"in{i}.npy", a)]
    run_tool("opforge-run", tmp_path / "model.opf", *args, "--output-dir", tmp_path / "out")
    expected = load(program).method("forward")(*inputs)
    for j, e in enumerate(expected):
        got = np.load(tmp_path / "out" / f"output_{j}.npy")
        # other kernels than NumPy's (blocked GEMM, own convolution): float32 rounding
        # differs in the last bits; 1e-4 relative is ~1000 ulp of float32 at these sizes
        np.testing.assert_allclose(got, e, rtol=1e-4, atol=1e-5)


def test_generate_example_decoder_matches_lean(tmp_path, run_tool):
    pytest.importorskip("torch")
    from opforge.examples.decoder import TinyDecoder, export_decoder

    program = export_decoder(TinyDecoder().eval())
    _native_or_skip(program)
    save(program, tmp_path / "decoder.opf")
    native = _generate(run_tool, tmp_path / "decoder.opf", [5, 9, 1, 3], 8)
    python = Generator(load(program)).generate([5, 9, 1, 3], 8)
    assert native["tokens"] == list(python.tokens)


@pytest.mark.parametrize("input_order, output_order", [
    ((0, 2, 1), (0, 2, 1)), ((0, 1, 2), (2, 0, 1)), ((1, 2, 0), (0, 1, 2))])
def test_run_lays_npy_arrays_out_in_the_programs_dim_orders(tmp_path, run_tool, input_order,
                                                           output_order):
    """.npy files are C order; the runtime holds a tensor dense in its dim order
    (channels-last): opforge-run converts both ways (opf_io_info.dim_order)."""
    from opforge.program import ArenaStorage, IntValue, KernelCall, MemoryPlan, Method, Operator, \
        Program, ScalarType, TensorValue

    def tensor(offset, order):
        return TensorValue(ScalarType.FLOAT32, (2, 3, 4), storage=ArenaStorage(0, offset), dim_order=order)

    values = (tensor(0, input_order), tensor(128, input_order), IntValue(1), tensor(256, output_order))
    program = Program(methods=(Method("forward", values, (0, 1), (3,), (KernelCall(0, (0, 1, 2, 3)),),
                                      (Operator("aten::add", "out"),), MemoryPlan((384,))),))
    save(program, tmp_path / "p.opf")
    rng = np.random.default_rng(5)
    x, y = (rng.standard_normal((2, 3, 4)).astype(np.float32) for _ in range(2))
    run_tool("opforge-run", tmp_path / "p.opf", "--input", _save_npy(tmp_path / "x.npy", x),
             "--input", _save_npy(tmp_path / "y.npy", y), "--output-dir", tmp_path / "out")
    (expected,) = load(program).method("forward")(x, y)
    assert np.load(tmp_path / "out" / "output_0.npy").tobytes() == expected.tobytes() == (x + y).tobytes()
