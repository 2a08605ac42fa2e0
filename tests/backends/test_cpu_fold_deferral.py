"""The cpu lowering's walk holds back (lowering/released.py) exactly the nodes its lowering
folds to constants (lowering/folding.py): one held back that ``_lower`` would have lowered
loses a fused op's input or reads a table's node as a constant (wrong numbers); one
``_lower`` folds that is not held back makes its float copy early (the memory released.py
saves).

Each graph is exported twice: once with nothing held back, every node lowered in graph
order (the nodes ``_lower`` folds are those it calls ``_fold`` on), once as shipped (the
nodes ``defer`` holds back); the two lists are equal, node for node, in the partition
check and in the delegate's lowering. Each graph has constant-input nodes of a table that
takes them in place of the fold: a safe softmax's inner nodes (the transformer layer),
int8 patterns reading weights (a small 8a8w convolution net), int_dot groups reading a
weight's dequantize (the 8da4w decoder); or a matmul operand's scalar multiply of a
constant, which folds (held back: its float copy made when read). (No graph here has
op-package nodes or a grouped KV cache read on constant inputs.)
"""

from __future__ import annotations

import collections
import warnings

import pytest
import torch

from opforge.backends.cpu import engine as cpu_engine
from opforge.backends.cpu.lowering import core, released
from opforge.backends.cpu.lowering.folding import _all_constant
from opforge.export import export

pytestmark = pytest.mark.skipif(cpu_engine.missing() is not None,
                                reason=f"cpu backend: {cpu_engine.missing()}")


def _transformer_layer():
    from opforge.examples.zoo import ZOO

    return ZOO["transformer_layer"]()


def _cnn_8a8w():
    from opforge.quantize import quantize

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.MaxPool2d(2), torch.nn.Conv2d(8, 8, 3), torch.nn.ReLU(),
                                torch.nn.Flatten(), torch.nn.Linear(8 * 2 * 2, 4)).eval()
    example = (torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(0)),)
    return quantize(model, example, "8a8w", calibration=[example]).model, example


def _decoder_8da4w():
    from opforge.examples.decoder import TinyDecoder
    from opforge.quantize.dynamic import quantize_dynamic

    model = TinyDecoder(vocab=64, dim=64, heads=4, kv_heads=2, hidden=128, layers=1,
                        max_len=16, seed=0).eval()
    return quantize_dynamic(model, "8da4w"), (torch.tensor([1, 2, 3]), torch.arange(3))


class _ScaledConstant(torch.nn.Module):
    """A matmul operand's scalar multiply of a constant: a scaled operand
    (lowering/scaled_matmul.py) that folds instead."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(8, 5, generator=torch.Generator().manual_seed(1)))

    def forward(self, a):
        return a @ (self.w * 3)


def _scaled_constant():
    return _ScaledConstant().eval(), (torch.randn(6, 8, generator=torch.Generator().manual_seed(2)),)


# graph → (a table it has constant-input nodes of, whether it folds any node)
CASES = {"transformer_layer": (_transformer_layer, "softmax", False),
         "cnn_8a8w": (_cnn_8a8w, "int8", True),
         "decoder_8da4w": (_decoder_8da4w, "group", True),
         "scaled_constant": (_scaled_constant, None, True)}


def _export(model, example):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        export(model, example, kernels="portable", backends=["cpu"])


@pytest.mark.parametrize("case", sorted(CASES))
def test_held_back_nodes_are_the_folded_ones(case, monkeypatch):
    make, table, any_folds = CASES[case]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, example = make()

    folded: collections.Counter = collections.Counter()
    taken: collections.Counter = collections.Counter()  # table → its constant-input nodes
    fold, takes = core._fold, core.takes

    def counted_fold(node, args, kwargs):
        folded[node.name] += 1
        return fold(node, args, kwargs)

    def counted_takes(L, node):
        kind = takes(L, node)
        args, kwargs = L.arg(node.args), {k: L.arg(v) for k, v in node.kwargs.items()}
        if kind is not None and _all_constant(args, kwargs):
            taken[kind] += 1
        return kind

    with monkeypatch.context() as m:  # every node lowered where the graph has it
        m.setattr(released.FoldedConstants, "defer", lambda self, node: False)
        m.setattr(core, "_fold", counted_fold)
        m.setattr(core, "takes", counted_takes)
        _export(model, example)

    held: collections.Counter = collections.Counter()
    defer = released.FoldedConstants.defer

    def counted_defer(self, node):
        if defer(self, node):
            held[node.name] += 1
            return True
        return False

    with monkeypatch.context() as m:  # as shipped: folds held back until read
        m.setattr(released.FoldedConstants, "defer", counted_defer)
        _export(model, example)

    assert held == folded, (f"held back, not folded by _lower: {held - folded}; "
                            f"folded by _lower, not held back: {folded - held}")
    assert table is None or taken[table] > 0, taken  # (the graph has what it is here for)
    assert bool(folded) == any_folds, folded
