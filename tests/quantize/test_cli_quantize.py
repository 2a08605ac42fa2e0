"""`opforge quantize`: calibration list, report tables, JSON, warnings and errors."""

import json

import numpy as np
import pytest
from click.testing import CliRunner

from opforge.cli import cli
from opforge.program import load


@pytest.fixture
def calibration(tmp_path):
    rng = np.random.default_rng(0)
    for i in range(3):
        np.save(tmp_path / f"x{i}.npy", rng.standard_normal((4, 64)).astype(np.float32))
    path = tmp_path / "cal.txt"
    path.write_text("# one sample per line\n" + "\n".join(f"x{i}.npy" for i in range(3)) + "\n")
    return path


def test_quantize_with_a_calibration_list(tmp_path, calibration):
    out = tmp_path / "m.opf"
    result = CliRunner().invoke(cli, ["quantize", "opforge.examples.zoo:mlp", "--scheme", "16a8w",
                                      "--calibration", str(calibration), "-o", str(out)])
    assert result.exit_code == 0, result.output
    for text in ("quantization (16a8w)", "linear_2", "weights per channel", "SQNR (dB)",
                 "max abs error", f"wrote {out}"):
        assert text in result.output
    keys = {o.key for o in load(out).method("forward").operators}
    assert "quantized_decomposed::quantize_per_tensor.out" in keys


def test_json_report_and_discarded_ops(tmp_path, calibration):
    out = tmp_path / "m.opf"
    result = CliRunner().invoke(cli, ["quantize", "opforge.examples.zoo:mlp", "--calibration",
                                      str(calibration), "-o", str(out), "--json",
                                      "--discard-op", "aten::gelu"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["scheme"] == "8a8w" and report["calibration_samples"] == 3
    assert report["sqnr_db"] > 25
    gelu = next(n for n in report["nodes"] if n["node"] == "gelu")
    assert gelu["scheme"] == "float" and "discarded" in gelu["detail"]


def test_without_calibration_it_warns(tmp_path):
    result = CliRunner().invoke(cli, ["quantize", "opforge.examples.zoo:cnn", "--scheme", "16a4w",
                                      "-o", str(tmp_path / "c.opf")])
    assert result.exit_code == 0, result.output
    assert "warning: opforge.quantize: no calibration data" in result.output
    assert load(tmp_path / "c.opf")  # packed 4-bit weights load


def test_calibration_of_the_wrong_shape(tmp_path):
    np.save(tmp_path / "bad.npy", np.zeros((4, 32), np.float32))
    (tmp_path / "bad.txt").write_text("bad.npy\n")
    result = CliRunner().invoke(cli, ["quantize", "opforge.examples.zoo:mlp", "--calibration",
                                      str(tmp_path / "bad.txt"), "-o", str(tmp_path / "m.opf")])
    assert result.exit_code != 0
    assert "sample 0, input 0 — shape (4, 32) torch.float32 — valid: (4, 64)" in result.output


def test_unknown_scheme(tmp_path):
    result = CliRunner().invoke(cli, ["quantize", "opforge.examples.zoo:mlp", "--scheme", "4a4w",
                                      "-o", str(tmp_path / "m.opf")])
    assert result.exit_code == 2 and "'4a4w' is not one of '8a8w'" in result.output


def test_the_cli_offers_every_scheme():
    from opforge.cli.quantize_cmd import _SCHEMES
    from opforge.quantize import SCHEMES
    from opforge.quantize.dynamic import DYNAMIC_SCHEMES

    assert _SCHEMES == tuple(SCHEMES) + tuple(DYNAMIC_SCHEMES)


def test_the_documented_api_is_what_is_exported():
    import pathlib
    import re

    import opforge.quantize as Q

    doc = (pathlib.Path(__file__).parents[2] / "docs" / "quantization.md").read_text()
    api = doc.split("## API", 1)[1]
    documented = set(re.findall(r"^- `(\w+)` —", api, re.M))
    assert documented == set(Q.__all__)


def test_backend_eval_and_progress(tmp_path, calibration):
    """--backend delegates the quantized program (8a8w on the cpu backend's int8 ops),
    --eval reports held-out accuracy beside calibration's, and the stages are named."""
    rng = np.random.default_rng(7)
    for i in range(2):
        np.save(tmp_path / f"h{i}.npy", 3 * rng.standard_normal((4, 64)).astype(np.float32))
    (tmp_path / "held.txt").write_text("h0.npy\nh1.npy\n")
    out = tmp_path / "m.opf"
    result = CliRunner().invoke(cli, [
        "quantize", "opforge.examples.zoo:mlp", "--calibration", str(calibration), "--eval",
        str(tmp_path / "held.txt"), "--backend", "cpu", "--compile-spec", "num_threads=1",
        "-o", str(out), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    held = report["held_out"]
    assert held["samples"] == 2 and held["sqnr_db"] != report["sqnr_db"]  # other inputs
    assert report["delegation"]["forward"]["delegates"][0]["backend"] == "cpu"
    assert any(type(i).__name__ == "DelegateCall" for i in load(out).method("forward").instructions)
    table = CliRunner().invoke(cli, [
        "quantize", "opforge.examples.zoo:mlp", "--calibration", str(calibration), "--eval",
        str(tmp_path / "held.txt"), "-o", str(out)])
    assert table.exit_code == 0 and "held out" in table.output and "calibration" in table.output


def test_bad_options_fail_before_calibrating_and_name_quantize(tmp_path, calibration):
    result = CliRunner().invoke(cli, ["quantize", "opforge.examples.zoo:mlp", "--calibration",
                                      str(calibration), "--compile-spec", "num_threads=1",
                                      "-o", str(tmp_path / "m.opf")])
    assert result.exit_code != 0 and "without --backend" in str(result.exception)
    result = CliRunner().invoke(cli, ["quantize", "opforge.examples.zoo:mlp", "--kernels",
                                      str(tmp_path / "missing.so"), "-o", str(tmp_path / "m.opf")])
    assert result.exit_code != 0 and "opforge quantize" in result.output and "no such file" in result.output
    (tmp_path / "list.txt").write_text("nothere.npy\n")
    result = CliRunner().invoke(cli, ["quantize", "opforge.examples.zoo:mlp", "--calibration",
                                      str(tmp_path / "list.txt"), "-o", str(tmp_path / "m.opf")])
    assert result.exit_code != 0
    assert "`opforge quantize --calibration" in result.output and "opforge run" not in result.output


def test_a_native_library_alone_is_joined_with_the_portable_set(tmp_path, calibration):
    """`--kernels libmy_ops.so` alone used to fail after the whole calibration, asking for a
    manifest of quantized_decomposed::* — which the portable set has."""
    import shutil

    if shutil.which("c++") is None and shutil.which("g++") is None:
        pytest.skip("needs a C++ compiler")
    from opforge.examples.my_ops import manifest_path
    from opforge.native import build_library

    sources = sorted((manifest_path().parent / "kernels").glob("*.cpp"))
    lib = build_library(manifest_path(), sources, tmp_path / "libmy_ops.so",
                        cache_root=tmp_path / "cache").path
    result = CliRunner().invoke(cli, ["quantize", "opforge.examples.zoo:mlp", "--calibration",
                                      str(calibration), "--kernels", str(lib), "-o",
                                      str(tmp_path / "m.opf")])
    assert result.exit_code == 0, result.output
    assert "the portable set is added" in result.output


def test_importing_quantize_prints_no_torchao_noise():
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", "import opforge.quantize"], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "Failed to load" not in proc.stderr + proc.stdout
    assert "KernelPreference" not in proc.stderr + proc.stdout


def test_a_dynamic_dim_lets_calibration_samples_differ_there(tmp_path):
    rng = np.random.default_rng(1)
    for i, rows in enumerate((3, 7)):
        np.save(tmp_path / f"r{i}.npy", rng.standard_normal((rows, 64)).astype(np.float32))
    (tmp_path / "cal.txt").write_text("r0.npy\nr1.npy\n")
    out = tmp_path / "m.opf"
    args = ["quantize", "opforge.examples.zoo:mlp", "--calibration", str(tmp_path / "cal.txt"),
            "-o", str(out)]
    refused = CliRunner().invoke(cli, args)
    assert refused.exit_code != 0 and "valid: (4, 64)" in refused.output
    malformed = CliRunner().invoke(cli, args + ["--dim", "0:0:rows:1"])
    assert malformed.exit_code != 0 and "`opforge quantize`: --dim '0:0:rows:1'" in malformed.output
    result = CliRunner().invoke(cli, args + ["--dim", "0:0:rows:1:16"])
    assert result.exit_code == 0, result.output
    from opforge.runtime import load as load_program

    method = load_program(str(out)).method("forward")
    for rows in (1, 9, 16):  # one program, any row count in the range
        assert method(rng.standard_normal((rows, 64)).astype(np.float32))[0].shape[0] == rows


def test_quantize_and_inspect_report_the_same_constants(tmp_path, calibration):
    """With the cpu backend the weights live in named data and a delegate blob: quantize
    counted all of it as "constants" (31,784 bytes) where inspect said 0."""
    from opforge.backends.cpu.engine import missing

    if missing() is not None:
        pytest.skip(f"cpu backend: {missing()}")
    out = tmp_path / "m.opf"
    result = CliRunner().invoke(cli, ["quantize", "opforge.examples.zoo:mlp", "--calibration",
                                      str(calibration), "--backend", "cpu", "-o", str(out)])
    assert result.exit_code == 0, result.output
    wrote = next(line for line in result.output.splitlines() if line.startswith("wrote "))
    shown = CliRunner().invoke(cli, ["inspect", str(out)])
    summary = shown.output.splitlines()[0].split(" method(s), ", 1)[1]
    assert summary.startswith("constants 0 bytes, named data ") and "delegate blob(s)" in summary
    assert wrote == f"wrote {out} (8a8w, {summary})", (wrote, summary)
