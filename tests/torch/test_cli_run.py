"""`opforge run`: inputs from .npy files, input lists or random; outputs, latency, profile,
trace, ATen mode, kernel registrars, and errors printed without a traceback."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from opforge.cli import cli
from opforge.examples.custom_model import custom_op_model
from opforge.examples.zoo import ZOO
from opforge.export import export
from opforge.program import save


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    directory = tmp_path_factory.mktemp("mlp")
    model, inputs = ZOO["mlp"]()
    save(export(model, inputs), directory / "mlp.opf")
    x = inputs[0].numpy()
    np.save(directory / "x.npy", x)
    np.save(directory / "x2.npy", 2 * x)
    with torch.no_grad():
        expected = [model(torch.from_numpy(a)).numpy() for a in (x, 2 * x)]
    return directory, expected


def _run(*args):
    result = CliRunner().invoke(cli, ["run", *map(str, args)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def test_random_inputs_are_generated_and_announced(mlp):
    directory, _ = mlp
    output = _run(directory / "mlp.opf")
    assert "generated random inputs (seed 0): float32 of shape (4, 64)" in output
    assert "(4, 10)" in output


@pytest.mark.parametrize("mode", ["lean", "aten"])
def test_npy_inputs_and_output_dir(mlp, tmp_path, mode):
    directory, expected = mlp
    _run(directory / "mlp.opf", "--input", directory / "x.npy", "--output-dir", tmp_path,
         "--mode", mode)
    np.testing.assert_allclose(np.load(tmp_path / "output_0.npy"), expected[0], rtol=1e-4,
                               atol=1e-5)


def test_input_list_writes_one_folder_per_inference(mlp, tmp_path):
    directory, expected = mlp
    listing = tmp_path / "inputs.txt"
    listing.write_text(f"{directory / 'x.npy'}\n\n# a comment\n{directory / 'x2.npy'}\n")
    output = _run(directory / "mlp.opf", "--input-list", listing, "--output-dir", tmp_path / "o")
    assert "wrote 2 output file(s)" in output
    for i in range(2):
        np.testing.assert_allclose(np.load(tmp_path / "o" / f"inference_{i}" / "output_0.npy"),
                                   expected[i], rtol=1e-4, atol=1e-5)


def test_iterations_profile_and_trace(mlp, tmp_path):
    directory, _ = mlp
    trace = tmp_path / "trace.json"
    output = _run(directory / "mlp.opf", "--iterations", "5", "--profile", "--trace", trace)
    assert "latency over 5 call(s): median" in output and "p10" in output and "p90" in output
    for column in ("op", "calls", "total ms", "% of total", "mean µs"):
        assert column in output
    assert "aten::addmm.out" in output
    events = json.loads(trace.read_text())["traceEvents"]
    kernels = [e for e in events if e["cat"] == "kernel"]
    assert kernels and all(e["ph"] == "X" and "instruction" in e["args"] for e in kernels)
    assert len({e["args"]["instruction"] for e in kernels}) == len(kernels) // 5


def test_custom_ops_run_lean_with_a_registrar(tmp_path):
    model, inputs = custom_op_model()
    save(export(model, inputs), tmp_path / "custom.opf")
    np.save(tmp_path / "x.npy", inputs[0].numpy())
    _run(tmp_path / "custom.opf", "--input", tmp_path / "x.npy", "--output-dir", tmp_path,
         "--kernels", "opforge.examples.my_ops_numpy:register_example_kernels")
    with torch.no_grad():
        expected = model(*inputs).numpy()
    np.testing.assert_allclose(np.load(tmp_path / "output_0.npy"), expected, rtol=1e-4,
                               atol=1e-5)


def _main(*args):
    return subprocess.run([sys.executable, "-m", "opforge", "run", *map(str, args)],
                          capture_output=True, text=True, timeout=120)


def test_errors_print_cleanly_without_a_traceback(mlp, tmp_path):
    directory, _ = mlp
    np.save(tmp_path / "bad.npy", np.ones((4, 64), np.float64))
    proc = _main(directory / "mlp.opf", "--input", tmp_path / "bad.npy")
    assert proc.returncode == 1
    assert "error: ProgramError" in proc.stderr and "input 0 — found dtype float64" in proc.stderr
    assert "Traceback" not in proc.stderr
    proc = _main(directory / "mlp.opf", "--method", "encode")
    assert proc.returncode == 1 and "valid: 'forward'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_missing_kernels_print_every_op(tmp_path):
    model, inputs = custom_op_model()
    save(export(model, inputs), tmp_path / "custom.opf")
    proc = _main(tmp_path / "custom.opf")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "error: MissingKernelError" in proc.stderr and "4 operator(s)" in proc.stderr
    assert "--mode aten" in proc.stderr


def test_a_bad_npy_and_both_input_kinds_are_usage_errors(mlp, tmp_path):
    directory, _ = mlp
    (tmp_path / "junk.npy").write_bytes(b"not numpy")
    proc = _main(directory / "mlp.opf", "--input", tmp_path / "junk.npy")
    assert proc.returncode == 1 and "cannot read it as .npy" in proc.stderr
    listing = tmp_path / "l.txt"
    listing.write_text(str(directory / "x.npy"))
    proc = _main(directory / "mlp.opf", "--input", directory / "x.npy", "--input-list", listing)
    assert proc.returncode != 0 and "not both" in proc.stderr
