"""Dropping the large constants a lowering folded, once nothing can read them.

The walk folds every node whose inputs are constants (``folding.py``): a dequantize of an
integer weight becomes a float32 tensor 4-8x the bytes it was made from. The integer
weight kernels read the integer weight instead (``int_weights.py``, ``int_dot.py``), so
that float copy is only looked at, by the matcher's exactness guard; yet the environment
held every one of them until the delegate was lowered: a 1B decoder's 6 GB of float
weights, again for each method's delegate.

``FoldedConstants.after(node)``, called after each node is lowered, drops a folded result
of at least ``MIN_BYTES`` when every user of it and every user of those users has been
lowered: a matcher looks at most one node back past its operand (a linear reads its
weight's dequantize through a transpose), and a delegate output is never dropped (its user,
the graph's output, is not lowered). The tensor stays alive where the plan holds it (a
weight the float path materialized): only the environment's reference goes.

Folded when read, not where the graph has them: a quantized model's graph computes every
weight's dequantize at its top (PT2E's convert puts them there), so a walk in graph order
folded all of them before the first linear read one: the whole model's float copies at
once. ``defer(node)`` holds back a node the walk would fold (every input a constant or
another held-back node; it makes no engine op, so the plan does not depend on when),
``resolve(node)`` folds the held-back inputs of the node about to be lowered, in graph
order, and ``resolve_rest()`` the ones no lowered node read. A delegate then holds one
weight's float copy at a time (with ``after``).
"""

from __future__ import annotations

import torch

from opforge.backends.cpu.lowering.folding import _unwrap, folds
from opforge.export import freed_memory

__all__ = ["FoldedConstants", "MIN_BYTES"]

MIN_BYTES = 1 << 20


class FoldedConstants:
    def __init__(self, lowering) -> None:
        self.lowering = lowering
        self.env = lowering.env
        self.pending: dict[str, int] = {}  # node name → its users not lowered yet
        self.folded: set[str] = set()      # call nodes whose value is a large folded tensor
        self.deferred: dict[str, object] = {}  # node name → a node to fold when first read

    def defer(self, node) -> bool:
        """Hold ``node`` back when lowering it would only fold constants: ``folding.folds``,
        the lowering's own test, with the nodes held back seen as the constants they will
        be."""
        L, held = self.lowering, self.deferred
        if any(a.name not in self.env and a.name not in held for a in node.all_input_nodes):
            return False  # (an input with no value: lowering it fails, it folds nothing)
        if not folds(L, node, L.arg(node.args, held), {k: L.arg(v, held) for k, v in node.kwargs.items()}):
            return False
        self.deferred[node.name] = node
        return True

    def resolve(self, node, fold=None) -> None:
        """Fold the held-back nodes ``node`` reads (theirs first); ``fold(held)`` sets the
        environment's value (default: ``Lowering.lower``'s)."""
        for a in node.all_input_nodes:
            held = self.deferred.pop(a.name, None)
            if held is not None:
                self.resolve(held, fold)
                (fold or self._fold)(held)
                self.after(held)

    def resolve_rest(self, graph) -> None:
        """Fold, in graph order, the held-back nodes no lowered node read."""
        for node in graph.nodes:
            if node.name in self.deferred:
                self.resolve(node)
                self._fold(self.deferred.pop(node.name))
                self.after(node)

    def _fold(self, node) -> None:
        value = _weight_rows(self.lowering, node)
        self.env[node.name] = self.lowering.lower(node) if value is None else ("c", value)

    def after(self, node) -> None:
        value = self.env.get(node.name)
        if isinstance(value, tuple) and len(value) == 2 and value[0] == "c" \
                and isinstance(value[1], torch.Tensor) and value[1].nbytes >= MIN_BYTES:
            self.folded.add(node.name)
        for a in node.all_input_nodes:
            self.pending[a.name] = self.pending.get(a.name, len(a.users)) - 1
            if self.pending[a.name] == 0:
                for b in a.all_input_nodes:
                    if b.name in self.folded and all(self._done(u) for u in b.users):
                        self.folded.discard(b.name)
                        self.env[b.name] = ("released", b.name)
                        freed_memory.trim()  # its pages back (freed_memory.py)

    def _done(self, node) -> bool:
        """Every user of ``node`` lowered (``node`` itself then too)."""
        return self.pending.get(node.name, len(node.users) or 1) == 0


def _weight_rows(lowering, node) -> torch.Tensor | None:
    """A weight's dequantize folded a few rows at a time (the same values: each row reads
    its own scales; float temporaries of a chunk, not of the weight: a 1B decoder's output
    projection is 1 GB of float32), or None (another op: ``Lowering.lower`` folds it)."""
    if node.target.namespace not in ("quantized_decomposed", "torchao"):
        return None
    from opforge.quantize.memory import _rows_at_a_time

    args = _unwrap(lowering.arg(node.args))
    kwargs = {k: _unwrap(lowering.arg(v)) for k, v in node.kwargs.items()}
    return _rows_at_a_time(node.target, tuple(args), kwargs)
