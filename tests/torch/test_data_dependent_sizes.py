"""Data-dependent sizes (torch.export's unbacked symbols): nonzero, masked_select, item()
used as a size, an OPT-style position computation. Exported with their upper bound (the
graph's value ranges or the user's torch._check), run on the lean and ATen runtimes and the
cpu backend, compared with eager; a size past its bound is refused per call, and a size
without a bound is refused at export with the torch._check that adds one."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from opforge.errors import ExportError, KernelError, ProgramError
from opforge.export import export
from opforge.program import from_bytes, to_bytes, verify
from opforge.runtime import load


class Nonzero(torch.nn.Module):
    def forward(self, x):
        return torch.nonzero(x > 0) + 1  # the +1 reads the data-dependent size


class MaskedSelect(torch.nn.Module):
    def forward(self, x):
        kept = torch.masked_select(x, x > 0)
        return kept * 2, kept.sum()  # a static result computed from a data-dependent one


class ItemAsSize(torch.nn.Module):
    def forward(self, x, n):
        k = n.item()
        torch._check(k >= 0)
        torch._check(k <= 16)
        return x[:k] * 3


class OptPositions(torch.nn.Module):
    """transformers' OPTLearnedPositionalEmbedding on a static cache: positions from the
    attention mask's cumsum, cut at the number of filled cache positions, which is counted
    from a tensor (data-dependent), not passed as an int."""

    def __init__(self, bound: bool = True) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(16 + 2, 8)  # OPT's offset of 2
        self.bound = bound

    def forward(self, attention_mask, filled):
        past = filled.sum().item()
        if self.bound:
            torch._check(past >= 0)
            torch._check(past <= attention_mask.shape[1])
        positions = (torch.cumsum(attention_mask, dim=1) * attention_mask - 1).long()
        return self.embed(positions[:, past:] + 2)


class LinearThenSelect(torch.nn.Module):
    """A linear (the cpu backend delegates it) whose result feeds nonzero and masked_select
    (left on the kernels); seeded, so every instance has the same weights."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = torch.nn.Linear(5, 5)

    def forward(self, x):
        y = self.linear(x)
        return torch.nonzero(y > 0) + 1, torch.masked_select(y, y > 0) * 2


def _filled(k: int) -> torch.Tensor:
    f = torch.zeros(32, dtype=torch.bool)
    f[:k] = True
    return f


def _mask(pad: int) -> torch.Tensor:
    mask = torch.ones(1, 16, dtype=torch.long)
    mask[0, :pad] = 0  # left padding, as a batch of prompts has
    return mask


CASES = {
    "nonzero": (Nonzero, (torch.randn(4, 5),),
                [(torch.randn(4, 5),), (torch.ones(4, 5),), (-torch.ones(4, 5),)]),
    "masked_select": (MaskedSelect, (torch.randn(4, 5),),
                      [(torch.randn(4, 5),), (torch.ones(4, 5),), (-torch.ones(4, 5),)]),
    "item_as_size": (ItemAsSize, (torch.randn(16, 3), torch.tensor(5)),
                     [(torch.randn(16, 3), torch.tensor(k)) for k in (0, 7, 16, 3)]),
    "opt_positions": (OptPositions, (_mask(0), _filled(5)),
                      [(_mask(p), _filled(k)) for p, k in ((0, 0), (2, 5), (3, 16), (0, 9))]),
}


@pytest.fixture(scope="module")
def programs():
    made = {}
    for name, (cls, example, _) in CASES.items():
        model = cls()
        made[name] = (model, export(model, example, kernels="portable"))
    return made


def _eager(model, call) -> list[np.ndarray]:
    with torch.no_grad():
        out = model(*call)
    return [o.numpy() for o in (out if isinstance(out, tuple) else (out,))]


def assert_like_eager(method, model, calls, *, rtol: float = 1e-6) -> None:
    """``method`` (a loaded program of ``model``) gives eager's shapes, dtypes and values on
    each call. Integer results and copies are exact; float sums may round in another order
    (oneDNN's sgemm in a cpu delegate: rtol 1e-5)."""
    for call in calls:
        got = method(*[t.numpy() for t in call])
        for g, e in zip(got, _eager(model, call), strict=True):
            assert g.shape == e.shape and g.dtype == e.dtype
            np.testing.assert_allclose(g, e, rtol=rtol, atol=1e-6)


@pytest.mark.parametrize("mode", ["lean", "aten"])
@pytest.mark.parametrize("name", list(CASES))
def test_runs_like_eager_at_every_data_dependent_size(programs, name, mode):
    model, program = programs[name]
    assert_like_eager(load(program, mode=mode).method("forward"), model, CASES[name][2])


def test_program_keeps_the_bound_and_round_trips(programs):
    _, program = programs["nonzero"]
    method = program.method("forward")
    (symbol,) = method.symbols
    assert (symbol.min, symbol.max) == (0, 20)  # nonzero of 4x5: at most 20 rows
    loaded = from_bytes(to_bytes(program))
    assert loaded == program and int.from_bytes(to_bytes(program)[8:12], "little") == 3
    _, item = programs["item_as_size"]
    assert item.method("forward").symbols[0].max == 16  # from torch._check(k <= 16)
    from opforge.program import describe  # opforge inspect says what binds each

    (nonzero_rows,) = describe(program)["methods"][0]["dynamic"]["produced"]
    assert nonzero_rows["symbol"] == symbol.name and nonzero_rows["from"] == "dimension 0"
    (element,) = describe(item)["methods"][0]["dynamic"]["produced"]
    assert element["from"] == "element"


@pytest.mark.parametrize("mode", ["lean", "aten"])
def test_a_size_past_its_bound_is_refused_per_call(programs, mode):
    model, program = programs["item_as_size"]
    method = load(program, mode=mode).method("forward")
    with pytest.raises(ProgramError, match=r"data-dependent size u\d+ .* found 17 — valid: "
                                           r"\[0, 16\].*torch._check\(n <= K\)"):
        method(np.zeros((16, 3), np.float32), np.array(17))
    (y,) = method(np.ones((16, 3), np.float32), np.array(2))  # the instance still works
    assert y.shape == (2, 3)


def test_opt_positions_past_the_bound_refused(programs):
    _, program = programs["opt_positions"]
    method = load(program).method("forward")
    with pytest.raises(ProgramError, match=r"found 20 — valid: \[0, 16\]"):
        method(_mask(0).numpy(), _filled(20).numpy())


def test_a_result_larger_than_its_slot_is_refused_by_the_kernel():
    from opforge.kernels.portable import portable_kernels

    nonzero = portable_kernels()["aten::nonzero.out"]
    out = np.zeros((3, 2), np.int64)
    with pytest.raises(KernelError, match="found 4 — valid: at most 3"):
        nonzero(np.ones((2, 2), bool), out)
    assert not out.any()  # refused before writing


def test_no_bound_refusal_says_where_and_how_to_add_one():
    with pytest.raises(ExportError, match=r"data-dependent size u\d+ .*no upper bound.*"
                                          r"torch._check\(n <= 64\)") as info:
        export(OptPositions(bound=False), (_mask(0), _filled(5)), kernels="portable")
    assert "test_data_dependent_sizes.py:" in str(info.value)  # the model line making it


def test_cpu_backend_leaves_data_dependent_nodes_on_the_kernels():
    model = LinearThenSelect()
    program = export(model, (torch.randn(4, 5),), backends=["cpu"])
    report = json.loads(program.metadata["opforge.delegation"])["forward"]
    assert report["delegates"], "the linear is delegated"
    rejected = {r["op"] for r in report["rejected"] if "data-dependent" in r["reason"]}
    assert {"aten::nonzero.default", "aten::masked_select.default"} <= rejected
    assert_like_eager(load(program).method("forward"), model, [(torch.randn(4, 5),) for _ in range(3)],
                      rtol=1e-5)


def test_verifier_refuses_a_symbol_nothing_produces(programs):
    import dataclasses

    from opforge.program import Move

    _, program = programs["item_as_size"]
    method = program.method("forward")
    assert isinstance(method.instructions[0], Move)
    broken = dataclasses.replace(method, instructions=method.instructions[1:])
    with pytest.raises(ProgramError, match="before an instruction produces it|produced by no "
                                           "instruction"):
        verify(dataclasses.replace(program, methods=(broken,)))


def test_a_data_dependent_size_bounded_by_a_dynamic_input():
    """nonzero of a (b, 5) input, b in [1, 8]: torch bounds the rows by 8 * 5."""

    class DynamicNonzero(torch.nn.Module):
        def forward(self, x):
            return torch.nonzero(x > 0).float() * 2

    b = torch.export.Dim("b", min=1, max=8)
    program = export(DynamicNonzero(), (torch.randn(4, 5),), dynamic_shapes=({0: b},),
                     kernels="portable")
    assert {(s.name, s.max) for s in program.method("forward").symbols} == {("u0", 40), ("b", 8)}
    for mode in ("lean", "aten"):
        method = load(program, mode=mode).method("forward")
        for n in (1, 3, 8, 2):
            x = torch.randn(n, 5)
            (y,) = method(x.numpy())
            np.testing.assert_array_equal(y, DynamicNonzero()(x).numpy())
