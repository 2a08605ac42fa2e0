"""The define-stage verbs as a user runs them: `opforge schema`, `opforge manifest`."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "opforge" / "examples" / "my_ops.yaml"


def run(*args, check=True):
    proc = subprocess.run([sys.executable, "-m", "opforge", *args], capture_output=True, text=True,
                          env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def test_help_lists_every_verb():
    out = run("--help").stdout
    for verb in ("schema", "manifest", "example", "export", "inspect", "run", "build", "check"):
        assert verb in out


def test_schema_shows_the_out_twin():
    out = run("schema", "my_ops::mul3(Tensor input) -> Tensor").stdout
    assert "my_ops::mul3.out(Tensor input, *, Tensor(a!) out) -> Tensor(a!)" in out
    data = json.loads(run("schema", "--json", "aten::add.out(Tensor self, Tensor other, *, "
                          "Scalar alpha=1, Tensor(a!) out) -> Tensor(a!)").stdout)
    assert data["kind"] == "out"
    assert data["twin"]["schema"] == "aten::add(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor"


def test_schema_refuses_mutating_op_with_the_reason():
    out = run("schema", "aten::relu_(Tensor(a!) self) -> Tensor(a!)").stdout
    assert "in-place" in out and "out variant" in out


def test_malformed_schema_exits_1_with_caret():
    proc = run("schema", "my::f(Tensor x -> Tensor", check=False)
    assert proc.returncode == 1
    assert "SchemaError" in proc.stderr and "^" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_manifest_lists_ops_and_kernels():
    data = json.loads(run("manifest", "--json", str(EXAMPLE)).stdout)
    assert [d["op"] for d in data] == ["my_ops::mul3", "my_ops::mul4", "my_ops::minmax", "my_ops::scaled_sum"]
    assert data[0]["kernels"][0]["cpp"] == "custom::native::mul3_out_impl"
    table = run("manifest", str(EXAMPLE)).stdout
    assert "custom::native::mul4_out_impl" in table


@pytest.mark.parametrize("bad, expect", [
    ("- func: mul3(Tensor input) -> Tensor\n", "bad.yaml:1"),
    ("- func: my_ops::a(Tensor x) -> Tensor\n\tkernels: []\n", "bad.yaml:2"),
])
def test_manifest_errors_exit_1_with_file_and_line(tmp_path, bad, expect):
    path = tmp_path / "bad.yaml"
    path.write_text(bad)
    proc = run("manifest", str(path), check=False)
    assert proc.returncode == 1 and expect in proc.stderr and "Traceback" not in proc.stderr
