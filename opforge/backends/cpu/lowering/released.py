"""Dropping the large constants a lowering folded, once nothing can read them.

The walk folds every node whose inputs are constants (``core._fold``): a dequantize of an
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
"""

from __future__ import annotations

import torch

__all__ = ["FoldedConstants", "MIN_BYTES"]

MIN_BYTES = 1 << 20


class FoldedConstants:
    def __init__(self, lowering) -> None:
        self.env = lowering.env
        self.pending: dict[str, int] = {}  # node name → its users not lowered yet
        self.folded: set[str] = set()      # call nodes whose value is a large folded tensor

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

    def _done(self, node) -> bool:
        """Every user of ``node`` lowered (``node`` itself then too)."""
        return self.pending.get(node.name, len(node.users) or 1) == 0
