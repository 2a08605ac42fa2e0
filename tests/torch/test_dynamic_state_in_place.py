"""State written in place: a cache write goes straight into the state tensor (no copy-back)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.export import Dim

from opforge.errors import KernelError
from opforge.export import export
from opforge.program import KernelCall, Move, from_bytes, to_bytes
from opforge.runtime import load


class SliceCache(torch.nn.Module):
    """Writes ``k`` into a slice of the cache (``copy_`` into a slice → slice_scatter)."""

    def __init__(self, length=6, dim=3):
        super().__init__()
        self.register_buffer("cache", torch.zeros(length, dim))

    def forward(self, k):
        self.cache[1:3].copy_(self.cache[2:4] + k)
        return self.cache.sum(0, keepdim=True) + k


class IndexCache(torch.nn.Module):
    def __init__(self, length=8, dim=4):
        super().__init__()
        self.register_buffer("cache", torch.zeros(length, dim))
        self.register_buffer("count", torch.zeros(1))

    def forward(self, k, pos):
        self.cache.index_copy_(0, pos, k)
        self.count.add_(1)
        return k @ self.cache.T * self.count


def _program(model, example, dims=None):
    return from_bytes(to_bytes(export(model, example, dynamic_shapes=dims, kernels="portable")))


def _writes(method):
    """(op key, args) of the instructions whose last argument (their out) is a state."""
    state = {slot.value for slot in method.state}
    return [(method.operators[i.op].key, i.args) for i in method.instructions
            if type(i) is KernelCall and i.args[-1] in state]


def test_cache_write_is_in_place_and_a_counter_keeps_its_copy():
    seq = Dim("seq", min=1, max=8)
    program = _program(IndexCache(), (torch.randn(2, 4), torch.tensor([0, 1])),
                       ({0: seq}, {0: seq}))
    method = program.methods[0]
    slots = {slot.name: slot.value for slot in method.state}
    (write,) = _writes(method)
    assert write[0] == "aten::index_put.out"
    assert write[1][0] == write[1][-1] == slots["cache"]  # self is out: the state itself
    moves = [i for i in method.instructions if type(i) is Move]
    assert [m.dst for m in moves] == [slots["count"]]  # add_ is no scatter: copied back


@pytest.mark.parametrize("mode", ["lean", "aten"])
def test_copy_into_a_slice_is_in_place_and_like_eager(mode):
    program = _program(SliceCache(), (torch.ones(2, 3),))
    (write,) = _writes(program.methods[0])
    assert write[0] == "aten::slice_scatter.out"
    assert not [i for i in program.methods[0].instructions if type(i) is Move]
    loaded, eager = load(program, mode=mode), SliceCache()
    forward = loaded.method("forward")
    for step in range(3):
        k = torch.full((2, 3), float(step + 1))
        with torch.no_grad():
            expected = eager(k)
        np.testing.assert_allclose(forward(k.numpy())[0], expected.numpy(), rtol=1e-6)
        np.testing.assert_array_equal(loaded.read_state("cache"), eager.cache.numpy())


@pytest.mark.parametrize("mode", ["lean", "aten"])
def test_in_place_cache_equals_eager_after_every_step(mode):
    torch.manual_seed(0)
    seq = Dim("seq", min=1, max=8)
    loaded = load(_program(IndexCache(), (torch.randn(2, 4), torch.tensor([0, 1])),
                           ({0: seq}, {0: seq})), mode=mode)
    forward, eager = loaded.method("forward"), IndexCache()
    start = 0
    for chunk in (3, 1, 1, 2, 1):
        k, pos = torch.randn(chunk, 4), torch.arange(start, start + chunk)
        with torch.no_grad():
            expected = eager(k, pos)
        (got,) = forward(k.numpy(), pos.numpy())
        np.testing.assert_allclose(got, expected.numpy(), rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(loaded.read_state("cache"), eager.cache.numpy())
        start += chunk


@pytest.mark.parametrize("mode", ["lean", "aten"])
@pytest.mark.parametrize("position", [8, 9, 1000, -9])
def test_position_out_of_the_cache_is_refused_and_nothing_written(mode, position):
    seq = Dim("seq", min=1, max=8)
    loaded = load(_program(IndexCache(), (torch.randn(2, 4), torch.tensor([0, 1])),
                           ({0: seq}, {0: seq})), mode=mode)
    forward = loaded.method("forward")
    forward(np.ones((1, 4), np.float32), np.array([7]))
    before = loaded.read_state("cache").copy()
    with pytest.raises(KernelError, match="index_put|out of bounds"):
        forward(np.full((2, 4), 5, np.float32), np.array([0, position]))
    np.testing.assert_array_equal(loaded.read_state("cache"), before)
    forward(np.ones((1, 4), np.float32), np.array([0]))  # the program still runs


def test_decoder_caches_written_in_place_give_eager_tokens():
    from opforge.examples.decoder import TinyDecoder, export_decoder, greedy_decode

    model = TinyDecoder(max_len=24).eval()
    program = from_bytes(to_bytes(export_decoder(model, kernels="portable")))
    method = program.methods[0]
    assert not [i for i in method.instructions if type(i) is Move]
    assert len(_writes(method)) == 4  # k and v caches of two layers
    loaded = load(program)
    forward = loaded.method("forward")
    with torch.no_grad():
        expected = greedy_decode(lambda t, p: model(t, p), [5, 1, 7], 12)
    got = greedy_decode(lambda t, p: forward(t.numpy(), p.numpy())[0], [5, 1, 7], 12)
    assert got == expected
    for name, buffer in model.named_buffers():
        if name.endswith("_cache"):
            np.testing.assert_allclose(loaded.read_state(name), buffer.numpy(), atol=1e-5)


def _graph_writing_state(read_old_after_write: bool):
    """A hand-made out-variant graph: ``new = index_put(cache, [pos], k)``, and a reader of
    the old ``cache`` placed after the write or before it."""
    from opforge.export.method_graph import InputKind, MethodGraph, alloc

    graph = torch.fx.Graph()
    cache, k, pos = (graph.placeholder(n) for n in ("cache", "k", "pos"))
    for node, value in ((cache, torch.zeros(4, 2)), (k, torch.zeros(1, 2)),
                        (pos, torch.zeros(1, dtype=torch.long))):
        node.meta["val"] = value

    def reader():
        out = graph.call_function(alloc, ((4, 2), torch.float32))
        out.meta["val"] = torch.zeros(4, 2)
        graph.call_function(torch.ops.aten.mul.out, (cache, cache), {"out": out})
        return out

    old = None if read_old_after_write else reader()
    new = graph.call_function(alloc, ((4, 2), torch.float32))
    new.meta["val"] = torch.zeros(4, 2)
    graph.call_function(torch.ops.aten.index_put.out, (cache, [pos], k, False), {"out": new})
    old = old if old is not None else reader()
    graph.output((new, old))
    method = MethodGraph("forward", torch.fx.GraphModule({}, graph),
                         {"cache": InputKind.STATE, "k": InputKind.USER, "pos": InputKind.USER},
                         {"cache": torch.zeros(4, 2)},
                         notes={"state_outputs": {0: "cache"}, "state": {"cache": "cache"}})
    return method, cache


@pytest.mark.parametrize("read_old_after_write", [False, True])
def test_in_place_only_when_no_reader_of_the_old_value_follows(read_old_after_write):
    from opforge.export.passes import UpdateStateInPlace

    method, cache = _graph_writing_state(read_old_after_write)
    UpdateStateInPlace().run(method)
    write = next(n for n in method.graph.nodes if n.target is torch.ops.aten.index_put.out)
    assert (write.kwargs["out"] is cache) is not read_old_after_write
    assert method.notes["state_in_place"] == ([] if read_old_after_write else ["cache"])
