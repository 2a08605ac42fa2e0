"""Program state inside cpu delegates: KV-cache writes (``index_put`` from ``index_copy_``,
slice and select assignment) run in the engine, in place in the program's state, with
every position checked before anything is written; row gathers (``index.Tensor``) too.
Compared with eager PyTorch (tokens exactly, caches and float64 gathers bit for bit where
the op is a copy) and with the lean runtime (one semantics)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from opforge.backends import get_backend
from opforge.errors import KernelError
from opforge.export import delegation_report, export
from opforge.program import DelegateCall, Move, from_bytes, to_bytes
from opforge.runtime import load

pytestmark = pytest.mark.skipif(get_backend("cpu").unavailable() is not None,
                                reason="the cpu backend cannot run here")


def _export(model, example, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return from_bytes(to_bytes(export(model, example, kernels="portable", **kwargs)))


def _kinds(program, name="forward"):
    method = next(m for m in program.methods if m.name == name)
    return [type(i).__name__ for i in method.instructions]


# --- the decoder: prefill on the kernels (dynamic), decode in one delegate --------------------

def _decoder():
    from opforge.examples.decoder import TinyDecoder

    return TinyDecoder(vocab=50, dim=24, heads=4, kv_heads=2, hidden=40, layers=2, max_len=40,
                       seed=7).eval()


def _decoder_program(model):
    seq = torch.export.Dim("seq", min=1, max=model.max_len)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = export(None, methods={
            "prefill": (model, (torch.tensor([1, 2, 3]), torch.arange(3)), ({0: seq}, {0: seq})),
            "decode": (model, (torch.tensor([0]), torch.tensor([0])))},
            kernels="portable", backends=["cpu"])
    return from_bytes(to_bytes(program))


def _generate(loaded, prompt, n):
    from opforge.examples.decoder import greedy_decode

    prefill, decode = loaded.method("prefill"), loaded.method("decode")
    return greedy_decode(lambda t, p: (decode if len(t) == 1 else prefill)(t.numpy(), p.numpy())[0],
                         prompt, n)


@pytest.mark.parametrize("mode", ["lean", "aten"])  # the prefill's kernels; decode: the engine
def test_decode_is_one_delegate_and_32_greedy_tokens_equal_eager(mode):
    from opforge.examples.decoder import greedy_decode

    model = _decoder()
    program = _decoder_program(model)
    report = delegation_report(program)["decode"]
    assert not report["rejected"], report["rejected"][:3]
    assert len(report["delegates"]) == 1
    assert report["delegates"][0]["ops"].count("aten::index_put.default") == 4  # 2 layers × k, v
    assert _kinds(program, "decode") == ["DelegateCall"]  # the caches written in place: no Move
    loaded = load(program, mode=mode)
    prompt = [4, 9, 2, 11, 30]
    with torch.no_grad():
        expected = greedy_decode(lambda t, p: model(t, p), prompt, 32)
    assert _generate(loaded, prompt, 32) == expected
    for name, buffer in model.named_buffers():
        if name.endswith("_cache"):
            np.testing.assert_allclose(loaded.read_state(name), buffer.numpy(), atol=2e-5)
    loaded.reset_state()  # the state the delegate wrote is the program's: reset restores it
    assert not any(loaded.read_state(n).any() for n in loaded.state_names)
    assert _generate(loaded, prompt, 32) == expected


# --- a cache write with positions out of range --------------------------------------------

class Cache(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("cache", torch.zeros(8, 3))

    def forward(self, k, pos):
        self.cache.index_copy_(0, pos, k)
        return (self.cache * 2).sum(0)


def _cache_programs():
    example = (torch.randn(2, 3), torch.tensor([0, 1]))
    cpu = _export(Cache(), example, backends=["cpu"])
    assert _kinds(cpu) == ["DelegateCall"], _kinds(cpu)
    return load(cpu), load(_export(Cache(), example))


@pytest.mark.parametrize("position", [8, 9, 1000, -9])
def test_position_outside_the_cache_is_refused_and_nothing_written(position):
    cpu, _ = _cache_programs()
    forward = cpu.method("forward")
    forward(np.ones((2, 3), np.float32), np.array([7, 2]))
    before = cpu.read_state("cache").copy()
    with pytest.raises(KernelError, match=r"`aten::index_put`: index — found values in "
                       rf"\[{min(0, position)}, {max(0, position)}\] — valid: \[-8, 7\] .*nothing "
                       "was written"):
        forward(np.full((2, 3), 5, np.float32), np.array([0, position]))
    np.testing.assert_array_equal(cpu.read_state("cache"), before)
    forward(np.ones((2, 3), np.float32), np.array([0, 3]))  # the program still runs
    assert cpu.read_state("cache")[3].tolist() == [1, 1, 1]


def test_negative_positions_count_from_the_end_as_on_the_lean_runtime():
    """``index_copy_`` reaches the program as ``index_put`` (torch's decomposition), which
    counts a negative index from the end, as ATen's ``index_put`` does: cpu and lean agree."""
    cpu, lean = _cache_programs()
    k = np.arange(6, dtype=np.float32).reshape(2, 3) + 1
    for loaded in (cpu, lean):
        loaded.method("forward")(k, np.array([-1, -8]))
    np.testing.assert_array_equal(cpu.read_state("cache"), lean.read_state("cache"))
    assert cpu.read_state("cache")[7].tolist() == [1, 2, 3]
    assert cpu.read_state("cache")[0].tolist() == [4, 5, 6]


def test_index_copy_kept_from_decomposition_refuses_negative_positions_as_eager():
    """``preserve_ops`` keeps ``index_copy`` in the graph: the delegate runs it in place and
    refuses ``-1`` as ``Tensor.index_copy_`` does, writing nothing."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = export(Cache(), (torch.randn(2, 3), torch.tensor([0, 1])), kernels="portable",
                         backends=["cpu"], preserve_ops=["aten::index_copy.default"])
    (delegate,) = delegation_report(program)["forward"]["delegates"]
    assert "aten::index_copy.default" in delegate["ops"]
    assert _kinds(program) == ["DelegateCall"]
    loaded, eager = load(program), Cache()
    forward = loaded.method("forward")
    k = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    with torch.no_grad():
        expected = eager(k, torch.tensor([6, 2]))
    np.testing.assert_array_equal(forward(k.numpy(), np.array([6, 2]))[0], expected.numpy())
    before = eager.cache.numpy().copy()
    np.testing.assert_array_equal(loaded.read_state("cache"), before)
    with pytest.raises(IndexError):  # eager refuses -1 (after writing row 0, as it happens)
        eager.cache.index_copy_(0, torch.tensor([0, -1]), k)
    with pytest.raises(KernelError, match=r"`aten::index_copy`: index — found values in "
                       r"\[-1, 0\] — valid: \[0, 7\]"):
        forward(k.numpy(), np.array([0, -1]))
    np.testing.assert_array_equal(loaded.read_state("cache"), before)  # nothing written


# --- slice and select assignment into state -------------------------------------------------

class Slices(torch.nn.Module):
    def __init__(self, chained: bool):
        super().__init__()
        self.chained = chained
        self.register_buffer("keys", torch.zeros(6, 4))
        self.register_buffer("values", torch.zeros(3, 5, 4))

    def forward(self, k):
        self.keys[1:3].copy_(k * 2)
        if self.chained:  # a second write of the same state: its new value is not a write of it
            self.keys[5] = k[0]
        self.values[:, 4] = k[1]
        return self.keys.sum(0) + self.values.sum((0, 1)) + k


@pytest.mark.parametrize("chained", [False, True])
def test_slice_and_select_assignment_match_eager(chained):
    torch.manual_seed(3)
    program = _export(Slices(chained), (torch.randn(2, 4),), backends=["cpu"])
    # one write per state: both in place; the chained keys keep their copy back
    assert _kinds(program) == ["DelegateCall"] + ["Move"] * chained
    loaded, eager = load(program), Slices(chained)
    forward = loaded.method("forward")
    for _ in range(3):
        k = torch.randn(2, 4)
        with torch.no_grad():
            expected = eager(k)
        np.testing.assert_array_equal(forward(k.numpy())[0], expected.numpy())
        np.testing.assert_array_equal(loaded.read_state("keys"), eager.keys.numpy())
        np.testing.assert_array_equal(loaded.read_state("values"), eager.values.numpy())


# --- gathers (index.Tensor) -------------------------------------------------------------------

class Gather(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(9, 2, 5, dtype=torch.float64) * 3,
                                        requires_grad=False)

    def forward(self, x, idx):
        return self.table[idx], x[:, idx]


def test_gathers_are_delegated_and_equal_eager_in_float64():
    torch.manual_seed(5)
    model = Gather()
    x, idx = torch.randn(2, 9, 3, dtype=torch.float64), torch.tensor([[8, -9], [0, 4]])
    program = _export(model, (x, idx), backends=["cpu"])
    report = delegation_report(program)["forward"]
    taken = [op for d in report["delegates"] for op in d["ops"]]
    assert taken.count("aten::index.Tensor") == 2, report
    forward = load(program).method("forward")
    for positions in (idx, torch.tensor([[-1, 3], [7, -2]])):
        with torch.no_grad():
            expected = model(x, positions)
        for got, want in zip(forward(x.numpy(), positions.numpy()), expected):
            np.testing.assert_array_equal(got, want.numpy())
    with pytest.raises(KernelError, match=r"`aten::index.Tensor`: index — found values in "
                       r"\[-10, 4\] — valid: \[-9, 8\]"):
        forward(x.numpy(), np.array([[-10, 0], [0, 4]]))


# --- which partitions may write a state in place (export/delegated_state.py) ------------------

def _state_graph(reader: str):
    """``new = index_put(cache, [pos], k)`` (the state's new value) and a reader of the old
    ``cache``: ``before`` the write, ``after`` it, or ``view``: a slice taken before the write
    and read after it (the slice may alias the cache)."""
    from opforge.export.method_graph import InputKind, MethodGraph

    aten = torch.ops.aten
    graph = torch.fx.Graph()
    cache, k, pos = (graph.placeholder(n) for n in ("cache", "k", "pos"))
    read = view = None
    if reader == "before":
        read = graph.call_function(aten.mul.Tensor, (cache, 2.0))
    if reader == "view":
        view = graph.call_function(aten.slice.Tensor, (cache, 0, 0, 2))
    new = graph.call_function(aten.index_put.default, (cache, [pos], k))
    if reader == "after":
        read = graph.call_function(aten.mul.Tensor, (cache, 2.0))
    if reader == "view":
        read = graph.call_function(aten.mul.Tensor, (view, 2.0))
    graph.output((new, read))
    method = MethodGraph("forward", torch.fx.GraphModule({}, graph),
                         {"cache": InputKind.STATE, "k": InputKind.USER, "pos": InputKind.USER},
                         {"cache": torch.zeros(4, 2)},
                         notes={"state_outputs": {0: "cache"}, "state": {"cache": "cache"}})
    nodes = [n for n in graph.nodes if n.op == "call_function"]
    return method, cache, new, nodes


@pytest.mark.parametrize("reader, inside, in_place", [
    ("before", True, True),    # every reader of the old value runs first, in the delegate
    ("before", False, False),  # a reader outside may be scheduled after the delegate call
    ("after", True, False),    # the old value is read after the write
    ("view", True, False),     # through a view taken before the write
])
def test_a_state_is_written_in_place_only_when_its_old_value_is_read_first(reader, inside,
                                                                          in_place):
    from opforge.export.delegated_state import in_place_writes

    method, cache, new, nodes = _state_graph(reader)
    partition = nodes if inside else [new]
    assert in_place_writes(method, partition) == ({cache: new} if in_place else {})


# --- a method that only reads a state another method updates ------------------------------

class Shared(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("cache", torch.zeros(4, 3))

    def forward(self, k, pos):
        self.cache.index_copy_(0, pos, k)
        return k * 2

    def read(self, x):
        return (x + self.cache).relu()


@pytest.mark.parametrize("backends", [[], ["cpu"]])
def test_a_delegate_reads_the_live_state_another_method_writes(backends):
    """The read method's delegate takes the cache at run time (it is program state, though
    this method never updates it), never its initial value baked into the blob."""
    model = Shared()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = export(None, methods={"write": (model, (torch.ones(1, 3), torch.tensor([0]))),
                                        "read": (model.read, (torch.ones(4, 3),))},
                         kernels="portable", backends=backends)
    assert _kinds(program, "read") == (["DelegateCall"] if backends else ["KernelCall"] * 2)
    loaded = load(program)
    loaded.method("write")(np.full((1, 3), 5, np.float32), np.array([2]))
    got = loaded.method("read")(np.full((4, 3), -1, np.float32))[0]
    assert got.tolist() == [[0, 0, 0], [0, 0, 0], [4, 4, 4], [0, 0, 0]]
