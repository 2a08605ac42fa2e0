"""Growing memory (``export(grow=...)``): tensors outside the arenas that grow with the sizes."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from torch.export import Dim

from opforge.errors import ExportError, ProgramError
from opforge.export import export
from opforge.program import from_bytes, to_bytes
from opforge.runtime import load


class Attend(torch.nn.Module):
    def __init__(self, dim=4):
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(dim, dim)

    def forward(self, x):
        return torch.softmax(self.lin(x) @ x.T, dim=-1) @ x


class CatDecoder(torch.nn.Module):
    """One token per call; the key/value caches come in and go out longer by one row."""

    def __init__(self, vocab=32, dim=16):
        super().__init__()
        torch.manual_seed(1)
        self.embed = torch.nn.Embedding(vocab, dim)
        self.q, self.k, self.v = (torch.nn.Linear(dim, dim, bias=False) for _ in range(3))
        self.head = torch.nn.Linear(dim, vocab, bias=False)

    def forward(self, token, k_cache, v_cache):
        x = self.embed(token)
        keys = torch.cat([k_cache, self.k(x)])
        values = torch.cat([v_cache, self.v(x)])
        attended = torch.softmax(self.q(x) @ keys.T / 4, dim=-1) @ values
        return self.head(x + attended), keys, values


def _attend_program(**kwargs):
    model = Attend().eval()
    program = export(model, (torch.randn(3, 4),), dynamic_shapes=({0: Dim("seq")},),
                     grow=["seq"], kernels="portable", **kwargs)
    return model, from_bytes(to_bytes(program))


def test_unbounded_dim_without_grow_is_still_refused():
    with pytest.raises(ExportError, match=r"no upper bound.*grow=\['<Dim name>'\]"):
        export(Attend(), (torch.randn(3, 4),), dynamic_shapes=({0: Dim("seq")},))


def test_grow_names_an_unknown_dim():
    with pytest.raises(ExportError, match=r"\['len'\] name no dynamic dimension.*\['seq'\]"):
        export(Attend(), (torch.randn(3, 4),), dynamic_shapes=({0: Dim("seq", max=8)},),
               grow=["len"])


def test_growing_program_format_version_4_and_unplanned_tensors():
    _, program = _attend_program()
    (symbol,) = program.methods[0].symbols
    assert symbol.grow and to_bytes(program)[8] == 4
    growing = [v for v in program.methods[0].values
               if getattr(v, "storage", 0) is None and getattr(v, "nbytes", 0)]
    assert growing and all(3 in v.sizes for v in growing)  # first allocated at the example


@pytest.mark.parametrize("mode", ["lean", "aten"])
def test_sizes_far_past_the_example_match_eager_and_growth_is_counted(mode, caplog):
    model, program = _attend_program()
    forward = load(program, mode=mode).method("forward")
    with caplog.at_level(logging.INFO, logger="opforge.runtime"):
        for n in (1, 3, 2, 17, 64, 5, 1000, 1, 1000):
            x = torch.randn(n, 4)
            with torch.no_grad():
                expected = model(x)
            np.testing.assert_allclose(forward(x.numpy())[0], expected.numpy(), rtol=1e-4,
                                       atol=1e-5)
    grew = forward.memory_growths
    assert grew > 0 and "grew from" in caplog.text
    forward(np.ones((1000, 4), np.float32))  # a size already held: no growth
    assert forward.memory_growths == grew and forward.growing_bytes >= 1000 * 1000 * 4


def test_memory_limit_refuses_growth_clearly_and_smaller_calls_still_run():
    model, program = _attend_program()
    forward = load(program, max_memory=1 << 20).method("forward")
    forward(np.ones((100, 4), np.float32))
    with pytest.raises(ProgramError, match=r"growing tensors.*seq=2000.*memory limit, 1048576"):
        forward(np.ones((2000, 4), np.float32))
    x = torch.randn(50, 4)
    with torch.no_grad():
        expected = model(x)
    np.testing.assert_allclose(forward(x.numpy())[0], expected.numpy(), rtol=1e-4, atol=1e-5)


def test_a_growing_kv_cache_decodes_past_its_first_capacity_like_eager():
    model = CatDecoder().eval()
    ctx = Dim("ctx")
    example = (torch.tensor([1]), torch.zeros(2, 16), torch.zeros(2, 16))
    program = from_bytes(to_bytes(export(
        model, example, dynamic_shapes=(None, {0: ctx}, {0: ctx}), grow=["ctx"],
        kernels="portable")))
    forward = load(program).method("forward")

    def decode(step, keys, values):
        tokens, token = [], torch.tensor([3])
        for _ in range(40):  # 40 rows, 20x the example's 2
            logits, keys, values = step(token, keys, values)
            token = torch.as_tensor(logits).argmax(-1)
            tokens.append(int(token))
        return tokens, keys

    with torch.no_grad():
        expected, eager_keys = decode(model, torch.zeros(1, 16), torch.zeros(1, 16))
    got, keys = decode(lambda t, k, v: tuple(torch.from_numpy(o) for o in forward(
        t.numpy(), k.numpy(), v.numpy())), torch.zeros(1, 16), torch.zeros(1, 16))
    assert got == expected
    np.testing.assert_allclose(keys.numpy(), eager_keys.numpy(), rtol=1e-5, atol=1e-6)
    assert forward.memory_growths > 0


def test_grow_with_backends_is_refused():
    with pytest.raises(ExportError, match="grow=.*backends"):
        export(Attend(), (torch.randn(3, 4),), dynamic_shapes=({0: Dim("seq")},),
               grow=["seq"], backends=["cpu"])


FACTORY = '''
import torch

def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU()), (torch.randn(3, 4),)
'''


def test_cli_export_grow_inspect_and_run_reports_growth(tmp_path):
    from click.testing import CliRunner

    from opforge.cli import cli

    def run(*args):
        result = CliRunner().invoke(cli, [*map(str, args)])
        return result.exit_code, result.output + str(result.exception or "")

    (tmp_path / "factory.py").write_text(FACTORY)
    out = tmp_path / "mlp.opf"
    code, text = run("export", f"{tmp_path}/factory.py:mlp", "-o", out, "--dim",
                     "0:0:batch:1:inf", "-q")
    assert code != 0 and "grow" in text
    code, text = run("export", f"{tmp_path}/factory.py:mlp", "-o", out, "--dim",
                     "0:0:batch:1:inf", "--grow", "batch", "-q")
    assert code == 0, text
    code, text = run("inspect", out)
    assert code == 0, text
    np.save(tmp_path / "x.npy", np.ones((5000, 4), np.float32))
    code, text = run("run", out, "--input", tmp_path / "x.npy")
    assert code == 0 and "(5000, 8)" in text and "growing memory: grew" in text, text
