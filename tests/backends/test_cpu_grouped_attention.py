"""Grouped-query attention in cpu delegates (lowering/grouped_matmul.py): the matmuls read
the KV cache in place through split batch dims instead of copying the cache expanded to
every query head.

Compared with float64 eager. The tolerance is the one float32 PyTorch itself earns: each
check allows 4x the error of float32 eager against float64 on the same inputs (plus 1e-6
of the result's scale, for a case where float32 eager happens to be exact); a wrong
stride, group or broadcast gives errors of the order of the values themselves.
"""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest
import torch
from torch import nn
from torch.export import Dim

from opforge.backends.cpu import blob
from opforge.backends.cpu import engine as cpu_engine
from opforge.export import delegation_report, export
from opforge.program import from_bytes, to_bytes
from opforge.runtime import load

pytestmark = pytest.mark.skipif(cpu_engine.missing() is not None,
                                reason=f"cpu backend: {cpu_engine.missing()}")


def _export(model, example, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return from_bytes(to_bytes(export(model, example, kernels="portable", backends=["cpu"],
                                          **kwargs)))


def _plans(program) -> list[dict]:
    return [blob.parse(memoryview(bytes(program.segments[d.segment].data)))[0]
            for d in program.delegates]


def _root(plan, tid):
    while plan["tensors"][tid]["role"] == "alias":
        tid = plan["tensors"][tid]["base"]
    return tid


def _copies_of(plan, roles) -> int:
    """Copy ops that read (a view of) a delegate input of one of ``roles``."""
    return sum(1 for op in plan["ops"] if op["kind"] == "copy"
               and plan["tensors"][_root(plan, op["in"][0])]["role"] in roles)


def _grouped_matmuls(plan) -> int:
    return sum(1 for op in plan["ops"] if op["kind"] == "matmul" and "grouped" in op["name"])


def _close(got, ref64, ref32):
    got, ref64, ref32 = (np.asarray(a, np.float64) for a in (got, ref64, ref32))
    tol = 4 * np.abs(ref32 - ref64).max() + 1e-6 * max(np.abs(ref64).max(), 1.0)
    err = np.abs(got - ref64).max()
    assert err <= tol, f"error {err:.3g} against float64, allowed {tol:.3g}"


# --- the attention core on its own: the cache is an input ----------------------------------

class Attention(nn.Module):
    """``softmax(q kᵀ / √d + causal) v`` with k, v the cache [T, Hkv, d] repeated to every
    query head, the decoder's way; ``q_transposed``: q arrives [H, d, s] (a column-major
    operand, which keeps the broadcast batch dim instead of folding it into the rows)."""

    def __init__(self, group: int, q_transposed: bool = False) -> None:
        super().__init__()
        self.group, self.q_transposed = group, q_transposed

    def forward(self, q, cache, values, start):
        if self.q_transposed:
            q = q.transpose(1, 2)
        keys = cache.repeat_interleave(self.group, dim=1).transpose(0, 1)   # (H, T, d)
        vals = values.repeat_interleave(self.group, dim=1).transpose(0, 1)
        scores = q @ keys.transpose(1, 2) / q.shape[-1] ** 0.5
        rows = torch.arange(q.shape[1])[:, None] + start[0]
        scores = scores.masked_fill(torch.arange(cache.shape[0])[None, :] > rows, float("-inf"))
        return torch.softmax(scores, dim=-1) @ vals


def _inputs(group, s, q_transposed=False, kv=2, d=8, t=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(kv * group, s, d, generator=g)
    if q_transposed:
        q = q.transpose(1, 2).contiguous()
    return (q, torch.randn(t, kv, d, generator=g), torch.randn(t, kv, d, generator=g),
            torch.tensor([t - s]))


def _check(model, program, inputs):
    ref64 = copy.deepcopy(model).double()(*(x.double() if x.is_floating_point() else x
                                            for x in inputs))
    ref32 = model(*inputs)
    got = load(program).method("forward")(*(x.numpy() for x in inputs))[0]
    _close(got, ref64.detach().numpy(), ref32.detach().numpy())


@pytest.mark.parametrize("group", [1, 2, 3, 4])
def test_decode_step_reads_the_cache_in_place(group):
    model = Attention(group)
    program = _export(model, _inputs(group, 1))
    (plan,) = _plans(program)
    assert _grouped_matmuls(plan) == (2 if group > 1 else 0)
    if group > 1:  # no copy of the cache, keys or values (MHA keeps its relayout copies)
        assert _copies_of(plan, ("input",)) == 0, [op["name"] for op in plan["ops"]]
    for seed in range(3):
        _check(model, program, _inputs(group, 1, seed=seed))


@pytest.mark.parametrize("group", [1, 2, 3, 4])
def test_prefill_with_a_symbolic_sequence(group):
    model = Attention(group)
    seq = Dim("seq", min=1, max=12)
    program = _export(model, _inputs(group, 5), dynamic_shapes=({1: seq}, None, None, None))
    (plan,) = _plans(program)
    assert plan.get("symbols"), "the delegate should be lowered with a symbolic sequence"
    assert _grouped_matmuls(plan) == (2 if group > 1 else 0)
    if group > 1:  # q is made row-major (a copy of q, an input too): count the cache's only
        cache_reads = [op for op in plan["ops"] if op["kind"] == "copy" and
                       _root(plan, op["in"][0]) in plan["inputs"][1:3]]
        assert not cache_reads
    for s in (1, 5, 7, 12):
        _check(model, program, _inputs(group, s, seed=s))


@pytest.mark.parametrize("group", [2, 3])
def test_a_column_major_query_keeps_the_broadcast_batch_dim(group):
    # q [H, s, d] with unit stride along s: G cannot join the rows, so keys are read
    # [Hkv, 1, d, T] against q [Hkv, G, s, d] (oneDNN broadcasts the size-1 batch dim)
    model = Attention(group, q_transposed=True)
    program = _export(model, _inputs(group, 4, q_transposed=True))
    (plan,) = _plans(program)
    ranks = [len(plan["tensors"][op["in"][1]]["dims"]) for op in plan["ops"]
             if op["kind"] == "matmul" and "grouped" in op["name"]]
    assert ranks[0] == 4 and 1 in plan["tensors"][
        next(op for op in plan["ops"] if "grouped" in op["name"])["in"][1]]["dims"]
    for seed in range(2):
        _check(model, program, _inputs(group, 4, q_transposed=True, seed=seed))


class OtherReader(nn.Module):
    """The expanded keys are also read by a sum: the chain is not the pattern, so the
    plain path (the expand copied) runs, with the same results."""

    def forward(self, q, cache, values, start):
        keys = cache.repeat_interleave(2, dim=1).transpose(0, 1)            # (H, T, d)
        return q @ keys.transpose(1, 2) + keys.sum(2).unsqueeze(1)


def test_an_expanded_cache_read_elsewhere_takes_the_plain_path():
    model = OtherReader()
    program = _export(model, _inputs(2, 1))
    (plan,) = _plans(program)
    assert _grouped_matmuls(plan) == 0
    assert _copies_of(plan, ("input",)) >= 1  # the keys' expand
    for seed in range(2):
        _check(model, program, _inputs(2, 1, seed=seed))


class SplitAgain(nn.Module):
    """Not the pattern, each at another place: ``split`` reshapes the merged heads back
    apart (a chain view that is no merge), ``into_rows`` merges the broadcast axis into
    the matrix's rows (an operand dim the matmul cannot read with one stride)."""

    def __init__(self, case: str) -> None:
        super().__init__()
        self.case = case

    def forward(self, q, cache):
        t, kv, d = cache.shape
        keys = cache.unsqueeze(2).expand(-1, -1, 2, -1)                   # (T, Hkv, 2, d)
        if self.case == "split":
            keys = keys.reshape(t, 2 * kv, d).reshape(t, kv, 2, d).reshape(t, 2 * kv, d)
            return q @ keys.permute(1, 2, 0)                                 # (H, d, T)
        keys = keys.permute(1, 0, 2, 3).reshape(kv, 2 * t, d)               # rows T·2
        return q[:kv] @ keys.transpose(1, 2)


@pytest.mark.parametrize("case", ["split", "into_rows"])
def test_a_chain_that_is_not_the_pattern_is_materialised(case):
    model = SplitAgain(case)
    g = torch.Generator().manual_seed(3)
    inputs = (torch.randn(4, 3, 8, generator=g), torch.randn(6, 2, 8, generator=g))
    program = _export(model, inputs)
    (plan,) = _plans(program)
    assert _grouped_matmuls(plan) == 0 and _copies_of(plan, ("input",)) >= 1
    got = load(program).method("forward")(*(x.numpy() for x in inputs))[0]
    ref64 = copy.deepcopy(model).double()(*(x.double() for x in inputs)).numpy()
    _close(got, ref64, model(*inputs).numpy())


# --- the bundled decoder: decode (static) and prefill (symbolic), greedy tokens ------------

def _decoder(heads, kv_heads):
    from opforge.examples.decoder import TinyDecoder

    return TinyDecoder(vocab=48, dim=8 * heads, heads=heads, kv_heads=kv_heads, hidden=40,
                       layers=2, max_len=24, seed=5).eval()


def _decoder_program(model):
    seq = Dim("seq", min=1, max=model.max_len)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return from_bytes(to_bytes(export(None, methods={
            "prefill": (model, (torch.tensor([1, 2, 3]), torch.arange(3)), ({0: seq}, {0: seq})),
            "decode": (model, (torch.tensor([0]), torch.tensor([0])))},
            kernels="portable", backends=["cpu"])))


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (4, 2), (6, 2), (8, 2)])
def test_decoder_prefill_and_decode_against_float64(heads, kv_heads):
    model = _decoder(heads, kv_heads)
    program = _decoder_program(model)
    report = delegation_report(program)
    for method in ("prefill", "decode"):
        assert len(report[method]["delegates"]) == 1 and not report[method]["rejected"]
    if heads > kv_heads:
        for plan in _plans(program):
            # 2 layers × (scores, values); the static decode's masked attention is one
            # engine op per layer instead (lowering/attention.py), reading the cache in place
            attention = sum(1 for op in plan["ops"] if op["kind"] == "attention")
            assert _grouped_matmuls(plan) == 4 or (attention == 2 and not _grouped_matmuls(plan))
            assert _copies_of(plan, ("state",)) == 0
    loaded = load(program)
    prefill, decode = loaded.method("prefill"), loaded.method("decode")
    eager32, eager64 = copy.deepcopy(model), copy.deepcopy(model).double()
    calls = [([3, 1, 4, 1, 5], range(5)), ([9], [5]), ([2], [6]), ([6], [7])]
    with torch.no_grad():
        for tokens, positions in calls:
            t, p = torch.tensor(tokens), torch.tensor(list(positions))
            got = (decode if len(tokens) == 1 else prefill)(t.numpy(), p.numpy())[0]
            _close(got, eager64(t, p).numpy(), eager32(t, p).numpy())


def test_decoder_greedy_tokens_equal_eager():
    from opforge.examples.decoder import greedy_decode

    model = _decoder(6, 2)
    loaded = load(_decoder_program(model))
    prefill, decode = loaded.method("prefill"), loaded.method("decode")
    prompt = [7, 3, 11, 2]
    stepper = copy.deepcopy(model)  # its caches fill as the program's state does
    with torch.no_grad():
        expected = greedy_decode(lambda t, p: stepper(t, p), prompt, 16)
    got = greedy_decode(lambda t, p: (decode if len(t) == 1 else prefill)(t.numpy(), p.numpy())[0],
                        prompt, 16)
    assert got == expected
