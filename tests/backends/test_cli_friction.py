"""The command line's second round of friction (issue 26): a mistyped verb or compile-spec
key gets a did-you-mean, type errors read as English, ``--explain`` lists the nodes left
out in graph order and fits 100 columns, and ``export --json`` gives scripts the program's
summary and delegation report."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from opforge.backends import SpecDef, register_backend, resolve_specs
from opforge.cli import cli
from opforge.errors import BackendError

sys.path.insert(0, str(Path(__file__).parent))
from toy_backend import ToyBackend  # noqa: E402

register_backend(ToyBackend, replace=True)

FACTORY = (
    "import torch\n"
    "class M(torch.nn.Module):\n"
    "    def forward(self, x):\n"
    "        a = torch.relu(x + 1)\n"
    "        b = torch.sin(a)\n"
    "        c = torch.cos(b) * a\n"
    "        return torch.tanh(c) + torch.exp(b)\n"
    "def make():\n"
    "    return M(), (torch.randn(4, 8),)\n")


@pytest.mark.parametrize("typo, verb", [("exprot", "export"), ("inspcet", "inspect"), ("quantise", "quantize")])
def test_a_mistyped_verb_suggests_the_verb(typo, verb):
    result = CliRunner().invoke(cli, [typo])
    assert result.exit_code == 2
    assert f"did you mean '{verb}'" in result.output and "valid: build, bundle, check" in result.output


def test_a_mistyped_compile_spec_key_suggests_the_key_and_types_read_as_english():
    defs = (SpecDef("num_threads", "int", 0, "threads"), SpecDef("int8", "bool", True, "int8"))
    with pytest.raises(BackendError, match="'num_thread' → did you mean 'num_threads'"):
        resolve_specs("cpu", defs, {"num_thread": "2"})
    with pytest.raises(BackendError, match="not an int —.*pass an int"):
        resolve_specs("cpu", defs, {"num_threads": "two"})
    with pytest.raises(BackendError, match="not a bool"):
        resolve_specs("cpu", defs, {"int8": "maybe"})


def test_explain_lists_nodes_in_graph_order_within_100_columns(tmp_path):
    """On a 100-column terminal the table of nodes left out fits; in a pipe (CliRunner)
    names are never cut (cli/tables.py), so the order is checked there."""
    import io

    from rich.console import Console

    from opforge.cli.delegation_view import print_delegation
    from opforge.export import delegation_report
    from opforge.program import load

    (tmp_path / "frictionfactory.py").write_text(FACTORY)
    out = tmp_path / "m.opf"
    result = CliRunner().invoke(cli, ["export", f"{tmp_path / 'frictionfactory.py'}:make", "-o",
                                      str(out), "--backend", "toy", "--explain"])
    assert result.exit_code == 0, result.output
    text = result.output
    positions = [text.index(op) for op in ("aten::sin", "aten::cos", "aten::tanh", "aten::exp")]
    assert positions == sorted(positions), positions  # graph order, not by name
    assert "frictionfactory.py:5" in text  # the source line of sin
    buffer = io.StringIO()
    print_delegation(Console(file=buffer, width=100, force_terminal=False),
                     delegation_report(load(out)), explain=True)
    lines = buffer.getvalue().splitlines()
    assert max(len(line) for line in lines) <= 100
    assert any("only add, mul and relu" in line for line in lines)


def test_export_json_is_the_summary_and_report(tmp_path):
    (tmp_path / "frictionfactory.py").write_text(FACTORY)
    out = tmp_path / "m.opf"
    result = CliRunner().invoke(
        cli, ["export", f"{tmp_path / 'frictionfactory.py'}:make", "-o", str(out), "--backend", "toy",
              "--json"])
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["file"] == {"path": str(out), "bytes": out.stat().st_size}
    rejected = [r["op"] for r in data["delegation"]["forward"]["rejected"]]
    assert rejected[:2] == ["aten::sin.default", "aten::cos.default"]
    assert data["methods"][0]["name"] == "forward" and data["delegates"]
