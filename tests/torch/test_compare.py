"""`opforge compare` names exactly the node whose kernel is wrong (issue 27).

A chain of a dozen ops runs everywhere; a portable kernel planted for one node (sigmoid,
plus 1e-2) must make compare name that node, and only it, as the first divergence of the
runs that use it, with its model source line; the runs that do not use it stay within
tolerance. Also: debug handles in the program (on by default, stripped on request,
checked when loaded) and the CLI's table, JSON and HTML. Needs torch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from opforge.compare import compare, compare_program
from opforge.compare.report import to_html, to_json
from opforge.errors import ProgramError
from opforge.export import export
from opforge.program import Program, debug_info, from_bytes, strip_debug_handles, to_bytes

ROOT = Path(__file__).resolve().parents[2]


class Chain(torch.nn.Module):
    """Twelve nodes after decomposition: permute, addmm, relu, mul, add, sigmoid, sub,
    tanh, permute_1, addmm_1, abs, mul_1 (and neg, exp)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = torch.nn.Linear(16, 16)
        self.fc2 = torch.nn.Linear(16, 16)

    def forward(self, x):
        y = torch.relu(self.fc1(x))
        y = y * 0.5 + 1.0
        y = torch.sigmoid(y)  # the planted node
        y = torch.tanh(y - 0.25)
        y = torch.abs(self.fc2(y)) * 2.0
        return torch.exp(-y)


def plant_sigmoid(registry) -> None:
    """A registrar (``--kernels module:function``): sigmoid off by 1e-2."""
    def wrong_sigmoid(x, out):
        np.divide(1.0, 1.0 + np.exp(-x), out=out)
        out += np.float32(1e-2)
    registry.register("aten::sigmoid.out", wrong_sigmoid, origin="planted", target="portable",
                      override=True)


PLANT = f"{__name__}:plant_sigmoid"


@pytest.fixture(scope="module")
def inputs():
    return (torch.randn(4, 16, generator=torch.Generator().manual_seed(1)),)


def test_correct_kernels_stay_within_tolerance_everywhere(inputs):
    result = compare(Chain(), inputs, against=["eager", "lean", "aten"])
    for run in ("eager", "lean", "aten"):
        assert result.first_divergence(run) is None, run
    names = [row.name for row in result.rows]
    assert names[:6] == ["permute", "addmm", "relu", "mul", "add", "sigmoid"]
    assert len(names) >= 12
    assert all(row.errors["lean"] is not None for row in result.rows)  # every node observed


def test_a_planted_portable_kernel_is_named_as_the_first_divergence(inputs):
    result = compare(Chain(), inputs, against=["eager", "lean", "aten"], kernels=[PLANT])
    for run in ("lean", "aten"):  # the registrar is loaded into both registries
        first = result.first_divergence(run)
        assert first is not None and first.name == "sigmoid", run
        assert first.op == "aten::sigmoid"
        assert "test_compare.py" in first.source and "torch.sigmoid(y)" in first.source
        error = first.errors[run]
        assert 0.009 < error.max_abs < 0.011
        before = result.rows[:first.index]
        assert before and all(row.errors[run].within for row in before)
    assert result.first_divergence("eager") is None
    data = json.loads(to_json(result))
    lean = next(r for r in data["runs"] if r["name"] == "lean")
    assert lean["first_divergence"]["node"] == "sigmoid"
    page = to_html(result)
    assert page.startswith("<!DOCTYPE html>") and "<svg" in page
    assert "<script" not in page and "src=" not in page  # self-contained: nothing fetched


def test_a_program_compares_its_runs_with_the_first(inputs, tmp_path):
    program = export(Chain(), inputs)
    arrays = [a.numpy() for a in inputs]
    result = compare_program(program, arrays, against=["lean", "aten"])
    assert result.reference == "lean run" and result.first_divergence("aten") is None
    path = tmp_path / "chain.opf"
    path.write_bytes(to_bytes(program))
    result = compare_program(str(path), arrays, against=["aten", "lean"], kernels=[PLANT])
    # the planted kernel is in both: they agree with each other
    assert result.first_divergence("lean") is None


def test_debug_handles_are_on_by_default_stripped_on_request_and_checked(inputs):
    program = export(Chain(), inputs)
    info = debug_info(from_bytes(to_bytes(program)))
    forward = info.methods["forward"]
    names = {n.name for n in forward.nodes}
    assert {"addmm", "sigmoid", "exp"} <= names
    method = program.method("forward")
    captured = {forward.nodes[c.node].name for c in forward.captures}
    assert captured == names  # every node's result is an instruction's out
    sigmoid = next(c for c in forward.captures if forward.nodes[c.node].name == "sigmoid")
    call = method.instructions[sigmoid.instruction]
    assert method.operators[call.op].key == "aten::sigmoid.out" and call.args[-1] == sigmoid.value
    stripped = export(Chain(), inputs, debug_handles=False)
    assert debug_info(stripped) is None
    assert len(to_bytes(stripped)) < len(to_bytes(program))
    assert debug_info(strip_debug_handles(program)) is None
    # a hostile table is refused when the program is loaded
    meta = dict(program.user_metadata)
    for bad in ('{"version": 1, "methods": {"forward": {"sources": [], "nodes": [], '
                '"captures": [[0, 99999, 0, 0]]}}}', "[" * 100000, "not json",
                '{"version": 2, "methods": {}}'):
        meta["opforge.debug"] = bad
        hostile = Program(methods=program.methods, segments=program.segments,
                          delegates=program.delegates, user_metadata=meta)
        with pytest.raises(ProgramError, match="opforge.debug"):
            from_bytes(_unverified_bytes(hostile))


def _unverified_bytes(program: Program) -> bytes:
    """The file bytes without verifying first (what a hostile writer would make)."""
    from opforge.program.encode import encode

    head, segments = encode(program)
    out = bytearray(head)
    for offset, data in segments:
        out += bytes(offset - len(out)) + bytes(data)
    return bytes(out)


def test_cli_prints_the_first_divergence_json_and_html(tmp_path):
    factory = tmp_path / "chain_model.py"
    factory.write_text(
        "import torch\n"
        f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from test_compare import Chain\n"
        "def make():\n"
        "    return Chain(), (torch.randn(4, 16, generator=torch.Generator().manual_seed(1)),)\n")
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{Path(__file__).parent}"}
    cmd = [sys.executable, "-m", "opforge", "compare", f"{factory}:make", "--against",
           "lean,aten", "--kernels", "test_compare:plant_sigmoid"]
    proc = subprocess.run([*cmd, "--html", str(tmp_path / "c.html")], capture_output=True,
                          text=True, cwd=tmp_path, env=env, timeout=300)
    assert proc.returncode == 1, proc.stderr
    assert "lean: first leaves tolerance at node #5 `sigmoid` (aten::sigmoid)" in proc.stdout
    assert "◀ first" in proc.stdout and (tmp_path / "c.html").stat().st_size > 1000
    proc = subprocess.run([*cmd, "--json"], capture_output=True, text=True, cwd=tmp_path,
                          env=env, timeout=300)
    data = json.loads(proc.stdout)
    assert [r["first_divergence"]["node"] for r in data["runs"]] == ["sigmoid", "sigmoid"]


def test_cli_compares_a_program_file_and_refuses_unknown_runs(inputs, tmp_path):
    path = tmp_path / "chain.opf"
    path.write_bytes(to_bytes(export(Chain(), inputs)))
    np.save(tmp_path / "x.npy", inputs[0].numpy())
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    base = [sys.executable, "-m", "opforge", "compare", str(path), "--inputs", str(tmp_path / "x.npy")]
    proc = subprocess.run([*base, "--json"], capture_output=True, text=True, cwd=tmp_path,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["reference"] == "lean run" and [r["name"] for r in data["runs"]] == ["aten"]
    proc = subprocess.run([*base, "--against", "lean,cpu"], capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=300)
    assert proc.returncode != 0 and "--against" in proc.stderr and "valid: lean, aten" in proc.stderr
    stripped = tmp_path / "stripped.opf"
    stripped.write_bytes(to_bytes(export(Chain(), inputs, debug_handles=False)))
    proc = subprocess.run([sys.executable, "-m", "opforge", "compare", str(stripped)],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert proc.returncode != 0 and "no debug table" in proc.stderr


def test_cli_inputs_the_model_refuses_are_one_clear_error(tmp_path):
    factory = tmp_path / "chain_model.py"
    factory.write_text(
        "import torch\n"
        f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from test_compare import Chain\n"
        "def make():\n"
        "    return Chain(), (torch.randn(4, 16),)\n")
    np.save(tmp_path / "wrong.npy", np.ones((4, 15), np.float32))
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{Path(__file__).parent}"}
    proc = subprocess.run([sys.executable, "-m", "opforge", "compare", f"{factory}:make",
                           "--inputs", str(tmp_path / "wrong.npy")], capture_output=True,
                          text=True, cwd=tmp_path, env=env, timeout=300)
    assert proc.returncode != 0
    assert "--inputs (float32[4, 15]) — the model refuses them: RuntimeError: " in proc.stderr
    assert "like its example inputs (float32[4, 16])" in proc.stderr
    # one message: no torch log of the failing meta kernel, no traceback before it
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
