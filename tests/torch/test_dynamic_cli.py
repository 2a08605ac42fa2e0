"""The CLI with dynamic shapes and state: `export --dim`, `inspect`, `run --input-list`."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from opforge.cli import cli
from opforge.errors import ExportError
from opforge.program import load as load_file

FACTORY = '''
import torch

class Counter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.zeros(1))

    def forward(self, x):
        self.count.add_(1)
        return x * self.count

def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU()), (torch.randn(3, 4),)

def derived():
    s = torch.export.Dim("s", min=1, max=8)
    model = torch.nn.Sequential(torch.nn.ReLU())
    return model, (torch.randn(6, 4),), ({0: 2 * s},)

def counter():
    return Counter(), (torch.ones(2),)
'''


def _cli(*args):
    result = CliRunner().invoke(cli, [*map(str, args)])
    return result.exit_code, result.output + str(result.exception or "")


def test_export_dim_inspect_and_run_at_several_sizes(tmp_path):
    (tmp_path / "factory.py").write_text(FACTORY)
    out = tmp_path / "mlp.opf"
    code, text = _cli("export", f"{tmp_path}/factory.py:mlp", "-o", out, "--dim", "0:0:batch:1:32", "-q")
    assert code == 0, text
    method = load_file(out).method("forward")
    assert [(s.name, s.min, s.max) for s in method.symbols] == [("batch", 1, 32)]
    code, text = _cli("inspect", out)
    assert code == 0 and "batch" in text and "symbols" in text
    for n in (1, 7, 32):
        np.save(tmp_path / "x.npy", np.ones((n, 4), np.float32))
        code, text = _cli("run", out, "--input", tmp_path / "x.npy")
        assert code == 0 and f"({n}, 8)" in text, text
    np.save(tmp_path / "x.npy", np.ones((33, 4), np.float32))
    code, text = _cli("run", out, "--input", tmp_path / "x.npy")
    assert code != 0 and "batch in [1, 32]" in text


def test_a_wrong_input_count_shows_dynamic_shapes_by_their_symbols_and_ranges(tmp_path):
    (tmp_path / "factory.py").write_text(FACTORY)
    out = tmp_path / "mlp.opf"
    code, text = _cli("export", f"{tmp_path}/factory.py:mlp", "-o", out, "--dim", "0:0:batch:1:32", "-q")
    assert code == 0, text
    np.save(tmp_path / "x.npy", np.ones((3, 4), np.float32))
    code, text = _cli("run", out, "--input", tmp_path / "x.npy", "--input", tmp_path / "x.npy")
    assert code != 0
    assert "valid: exactly 1 (float32 of shape (batch, 4) with batch in [1, 32])" in text, text
    assert "(32, 4)" not in text  # the upper bound the arena is planned for
    np.save(tmp_path / "i.npy", np.ones((3, 4), np.int64))
    code, text = _cli("run", out, "--input", tmp_path / "i.npy")
    assert code != 0 and "valid: float32 of shape (batch, 4) with batch in [1, 32]" in text, text

def test_bad_dim_option_is_an_export_error(tmp_path):
    (tmp_path / "factory.py").write_text(FACTORY)
    code, text = _cli("export", f"{tmp_path}/factory.py:mlp", "-o", tmp_path / "x.opf", "--dim", "0:0:1batch")
    assert code != 0 and "INPUT:DIM:NAME:MIN:MAX" in text



@pytest.mark.parametrize("dim, message", [
    ("0:0:s:8:1", "MIN 8, MAX 1 — valid: 0 <= MIN <= MAX (or MAX 'inf') — fix: swap them: "
                  "--dim 0:0:s:1:8"),
    ("0:0:s:-1:8", "MIN -1, MAX 8 — valid: 0 <= MIN <= MAX"),
    ("0:5:s:1:8", "DIM 5, but input 0 has 2 dimension(s) (shape (3, 4)) — valid: DIM in 0..1"),
    ("0:0:s:4:8", "the example input 0 has size 3 in dimension 0, outside [4, 8]"),
])
def test_a_dim_that_does_not_fit_the_example_is_one_clear_error(tmp_path, dim, message):
    (tmp_path / "factory.py").write_text(FACTORY)
    result = CliRunner().invoke(cli, ["export", f"{tmp_path}/factory.py:mlp", "-o",
                                      str(tmp_path / "x.opf"), "--dim", dim])
    # an OpforgeError: `opforge` prints it as one line (no traceback, no torch.export text)
    assert isinstance(result.exception, ExportError), repr(result.exception)
    text = str(result.exception)
    assert f"--dim '{dim}' (method 'forward') — {message}" in text, text
    assert "torch.export failed" not in text and "\n" not in text

def test_factory_may_return_dynamic_shapes(tmp_path):
    (tmp_path / "factory.py").write_text(FACTORY)
    out = tmp_path / "d.opf"
    code, text = _cli("export", f"{tmp_path}/factory.py:derived", "-o", out, "-q")
    assert code == 0, text
    np.save(tmp_path / "x.npy", -np.ones((6, 4), np.float32))
    code, text = _cli("run", out, "--input", tmp_path / "x.npy")
    assert code == 0 and "(6, 4)" in text
    np.save(tmp_path / "x.npy", -np.ones((5, 4), np.float32))
    code, text = _cli("run", out, "--input", tmp_path / "x.npy")
    assert code != 0 and "in steps of 2" in text


def test_run_input_list_carries_state_from_one_input_to_the_next(tmp_path):
    (tmp_path / "factory.py").write_text(FACTORY)
    out = tmp_path / "c.opf"
    code, text = _cli("export", f"{tmp_path}/factory.py:counter", "-o", out, "-q")
    assert code == 0, text
    np.save(tmp_path / "one.npy", np.ones(2, np.float32))
    (tmp_path / "list.txt").write_text("one.npy\none.npy\none.npy\n")
    code, text = _cli("run", out, "--input-list", tmp_path / "list.txt", "--output-dir", tmp_path / "o")
    assert code == 0, text
    outputs = sorted((tmp_path / "o").rglob("*.npy"))
    assert [np.load(p).tolist() for p in outputs] == [[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]]
