"""Quantizing without copies of the weights (opforge/quantize/memory.py, dynamic.py's
``inplace``, the cpu lowering's folds made when read): each path computes what the copying
one computed, bit for bit; tests/backends/test_export_memory.py measures the memory."""

from __future__ import annotations

import warnings

import pytest
import torch

from opforge.export import export
from opforge.program import to_bytes
from opforge.quantize import memory, quantize
from opforge.quantize.api import capture
from opforge.quantize.dynamic import quantize_dynamic, quantize_weight
from opforge.quantize.quantizer import Quantizer
from opforge.quantize.schemes import QuantizeError


class _Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.up = torch.nn.Linear(64, 320)
        self.down = torch.nn.Linear(320, 64, bias=False)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g) / 8)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


def _x(seed: int = 1) -> torch.Tensor:
    return torch.randn(5, 64, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("scheme", ["16a8w", "16a4w_block"])
def test_weight_folding_is_torchaos(scheme, monkeypatch):
    """convert's folding (no dequantize computed, quantize a few rows at a time) gives
    torchao's folded graph: the same nodes, attribute names and integers."""
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    monkeypatch.setattr(memory, "CHUNK_BYTES", 64 * 4 * 7)  # 7 rows a chunk: 46 chunks
    graphs = []
    for ours in (False, True):
        model = _Mlp().eval()
        prepared = prepare_pt2e(capture(model, (_x(),)), Quantizer(scheme))
        prepared(_x())
        if ours:
            converted = convert_pt2e(prepared, fold_quantize=False)
            memory.fold_weight_quantizes(converted)
        else:
            converted = convert_pt2e(prepared)
        graphs.append(converted)
    theirs, ours = graphs
    assert ours.code == theirs.code
    a, b = dict(theirs.named_buffers()), dict(ours.named_buffers())
    assert a.keys() == b.keys() and any(t.dtype == torch.int8 for t in a.values())
    for name in a:
        assert a[name].dtype == b[name].dtype and torch.equal(a[name], b[name]), name


def test_near_users_runs_the_same_values_one_weight_at_a_time(monkeypatch):
    result = _quantized("16a4w_block")
    monkeypatch.setattr(memory, "CHUNK_BYTES", 64 * 4 * 7)  # dequantized 7 rows at a time
    moved = memory.near_users(result.model)
    with torch.no_grad():
        assert torch.equal(moved(_x(2)), result.model(_x(2)))
    # every dequantize of a weight runs just before its first user; the original graph
    # (what export captures) keeps them at its top
    for gm, placed in ((moved, True), (result.model, False)):
        nodes = list(gm.graph.nodes)
        weights = [n for n in nodes if "dequantize" in str(n.target)
                   and all(a.op == "get_attr" for a in n.all_input_nodes)]
        assert len(weights) == 2
        assert all((nodes.index(min(n.users, key=nodes.index)) == nodes.index(n) + 1) == placed
                   for n in weights)


def test_graph_copy_shares_the_tensors_not_the_graph():
    result = _quantized("16a8w")
    copy = memory.graph_copy(result.model)
    theirs = dict(result.model.named_buffers())
    for name, tensor in copy.named_buffers():  # integer weights shared, float state copied
        shared = tensor.data_ptr() == theirs[name].data_ptr()
        assert shared == (not tensor.is_floating_point()), name
        assert torch.equal(tensor, theirs[name])
    assert any(not t.is_floating_point() for t in theirs.values())
    before = result.model.code
    node = next(n for n in copy.graph.nodes if n.op == "output")
    with copy.graph.inserting_before(node):
        copy.graph.call_function(torch.ops.aten.relu.default, (node.args[0][0],))
    copy.recompile()
    assert result.model.code == before


def test_keep_float_model_false_lets_the_float_model_go():
    import gc
    import weakref

    model = _Mlp().eval()
    weight = weakref.ref(model.up.weight)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = quantize(model, (_x(),), "16a8w", calibration=[(_x(),)], keep_float_model=False)
    assert result.float_model is None
    del model
    gc.collect()
    # nothing holds the float weights any more (torch's and torchao's device lookups
    # cached the prepared graph, weights and all, until memory.forget_cached_modules)
    assert weight() is None
    with pytest.raises(QuantizeError, match="keep_float_model"):
        result.evaluate([(_x(3),)])
    kept = _quantized("16a8w")
    assert kept.float_model is not None  # the default keeps it for evaluate
    assert torch.equal(dict(result.model.named_buffers())["_frozen_param0"],
                       dict(kept.model.named_buffers())["_frozen_param0"])


def test_quantize_dynamic_in_place_swaps_the_same_integers(monkeypatch):
    import opforge.quantize.dynamic as dynamic

    copied = quantize_dynamic(_Mlp().eval(), "8da4w")
    model = _Mlp().eval()
    monkeypatch.setattr(dynamic, "ROWS", 7)  # quantize_weight in 46 chunks of rows
    swapped = quantize_dynamic(model, "8da4w", inplace=True)
    assert swapped is model and not any(isinstance(m, torch.nn.Linear) for m in model.modules())
    a, b = dict(copied.named_buffers()), dict(swapped.named_buffers())
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    w = torch.randn(300, 64, generator=torch.Generator().manual_seed(4))
    for bits in (4, 8):
        monkeypatch.setattr(dynamic, "ROWS", 4096)
        whole = quantize_weight(w, bits, 32)
        monkeypatch.setattr(dynamic, "ROWS", 7)
        chunked = quantize_weight(w, bits, 32)
        assert all(torch.equal(x, y) for x, y in zip(whole, chunked))


@pytest.mark.parametrize("scheme", ["16a4w_block", "8da4w"])
def test_cpu_lowering_folds_when_read_and_the_program_is_the_same(scheme, monkeypatch):
    """The cpu lowering and its partition check fold a weight's dequantize where a node
    reads it (released.py), not where the graph has it: the program is byte for byte the
    one folding in graph order makes."""
    from opforge.backends.cpu.lowering import released

    if scheme == "8da4w":
        model = quantize_dynamic(_Mlp().eval(), scheme)
    else:
        model = _quantized(scheme).model
    programs = []
    for defer in (True, False):
        if defer:  # and a weight's dequantize folded 7 rows at a time
            monkeypatch.setattr(memory, "CHUNK_BYTES", 64 * 4 * 7)
        else:
            monkeypatch.setattr(memory, "CHUNK_BYTES", 1 << 40)
            monkeypatch.setattr(released.FoldedConstants, "defer", lambda self, node: False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            programs.append(to_bytes(export(model, (_x(),), kernels="portable", backends=["cpu"])))
    assert programs[0] == programs[1]


def _quantized(scheme: str):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return quantize(_Mlp().eval(), (_x(),), scheme, calibration=[(_x(),)])
