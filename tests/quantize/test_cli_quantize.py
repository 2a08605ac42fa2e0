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

    assert _SCHEMES == tuple(SCHEMES)


def test_the_documented_api_is_what_is_exported():
    import pathlib
    import re

    import opforge.quantize as Q

    doc = (pathlib.Path(__file__).parents[2] / "docs" / "quantization.md").read_text()
    api = doc.split("## API", 1)[1]
    documented = set(re.findall(r"^- `(\w+)` —", api, re.M))
    assert documented == set(Q.__all__)
