"""`opforge export` and `opforge inspect` through the click commands."""

from __future__ import annotations

import json
import textwrap

import pytest
from click.testing import CliRunner

from opforge.cli import cli
from opforge.program import load


@pytest.fixture()
def runner():
    return CliRunner()


def test_export_zoo_mlp_then_inspect(runner, tmp_path):
    out = tmp_path / "mlp.opf"
    result = runner.invoke(cli, ["export", "opforge.examples.zoo:mlp", "-o", str(out), "--kernels", "portable"])
    assert result.exit_code == 0, result.output
    assert out.exists() and load(out).method("forward").instructions
    shown = runner.invoke(cli, ["inspect", str(out)])
    assert shown.exit_code == 0, shown.output
    for needle in ("aten::linear.out", "memory plan", "naive bytes", "constants", "instructions"):
        assert needle in shown.output
    data = json.loads(runner.invoke(cli, ["inspect", str(out), "--json"]).output)
    plan = data["methods"][0]["memory_plan"]
    assert plan["total_bytes"] < plan["naive_bytes"] and plan["reuse_ratio"] > 1
    assert {op["key"]: op["calls"] for op in data["methods"][0]["operators"]}["aten::linear.out"] == 3


def test_export_renames_the_method_and_preserves_ops(runner, tmp_path):
    out = tmp_path / "m.opf"
    result = runner.invoke(cli, ["export", "opforge.examples.zoo:mlp", "-o", str(out),
                                 "--method", "predict", "--preserve-op", "aten::linear"])
    assert result.exit_code == 0, result.output
    method = load(out).method("predict")
    assert "aten::linear.out" in {op.key for op in method.operators}


def test_export_dict_factory_exports_several_methods_and_selects(runner, tmp_path):
    models = tmp_path / "models.py"
    models.write_text(textwrap.dedent("""
        import torch
        class Model(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.enc = torch.nn.Linear(4, 3)
                self.dec = torch.nn.Linear(3, 4)
            def encode(self, x):
                return torch.relu(self.enc(x))
            def forward(self, x):
                return self.dec(self.encode(x))
        def both():
            m = Model().eval()
            return {"forward": (m, (torch.randn(2, 4),)), "encode": (m.encode, (torch.randn(2, 4),))}
    """))
    out = tmp_path / "two.opf"
    result = runner.invoke(cli, ["export", f"{models}:both", "-o", str(out)])
    assert result.exit_code == 0, result.output
    program = load(out)
    assert [m.name for m in program.methods] == ["forward", "encode"]
    assert len(program.segments) == 1  # the shared encoder weights are stored once
    only = tmp_path / "enc.opf"
    assert runner.invoke(cli, ["export", f"{models}:both", "-o", str(only), "--method", "encode"]).exit_code == 0
    assert [m.name for m in load(only).methods] == ["encode"]


def test_missing_kernels_fail_before_writing_and_allow_missing_writes(runner, tmp_path, monkeypatch):
    models = tmp_path / "custom.py"
    models.write_text(textwrap.dedent("""
        import torch
        def model():
            return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh()), (torch.randn(1, 4),)
    """))
    out = tmp_path / "x.opf"
    result = runner.invoke(cli, ["export", f"{models}:model", "-o", str(out), "--kernels", "portable"])
    assert result.exit_code == 0, result.output  # tanh and linear are portable
    monkeypatch.setattr("opforge.kernels.portable.portable_kernels", lambda: {"aten::linear.out": None})
    out2 = tmp_path / "y.opf"
    failed = runner.invoke(cli, ["export", f"{models}:model", "-o", str(out2), "--kernels", "portable"])
    assert failed.exit_code != 0 and not out2.exists()
    assert "aten::tanh.out" in str(failed.exception)
    allowed = runner.invoke(cli, ["export", f"{models}:model", "-o", str(out2), "--kernels", "portable",
                                  "--allow-missing"])
    assert allowed.exit_code == 0, allowed.output
    assert out2.exists() and "warning" in allowed.output


@pytest.mark.parametrize(
    "spec, needle",
    [
        ("opforge.examples.zoo", "not MODULE:FACTORY"),
        ("no_such_module_xyz:f", "cannot be imported"),
        ("opforge.examples.zoo:nope", "has no callable 'nope'"),
    ],
)
def test_bad_factories_are_clear_errors(runner, tmp_path, spec, needle):
    result = runner.invoke(cli, ["export", spec, "-o", str(tmp_path / "z.opf")])
    assert result.exit_code != 0
    assert needle in str(result.exception)


def test_main_prints_export_errors_cleanly(tmp_path, capsys):
    from opforge.cli import main

    with pytest.raises(SystemExit) as info:
        main(["export", "opforge.examples.zoo:mlp", "-o", str(tmp_path / "a.opf"), "--method", "a", "--method", "b"])
    assert info.value.code == 1
    assert "error: ExportError: `opforge export`: --method given 2 times" in capsys.readouterr().err
