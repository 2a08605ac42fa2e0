"""Embedding: the engine's bounds-checked row gather (of an integer table:
``int_weights.py``).
"""

from __future__ import annotations

import torch
import torch.fx

from opforge.backends.cpu.lowering.core import SYMBOLIC_SIZES, LOWERINGS, Unsupported, _val
from opforge.backends.cpu.lowering.int_weights import lower_embedding as lower_int_embedding


def lower_embedding(L, node, args, kwargs):
    weight, indices = args[0], args[1]
    lowered = lower_int_embedding(L, node, indices)  # an integer table read as integers
    if lowered is not None:
        return lowered
    w = L.contiguous(L.materialize(weight))
    ix = L.contiguous(L.materialize(indices))
    if L.spec(w).dtype != torch.float32 or L.spec(ix).dtype not in (torch.int64, torch.int32):
        raise Unsupported("dtype", "aten::embedding needs float32 weights and int indices")
    fake = _val(node)
    out = L.new_tensor(fake.dtype, fake.shape)
    L.op("embedding", [w, ix], [out], name="embedding")
    return ("t", out)


LOWERINGS["aten::embedding"] = lower_embedding
SYMBOLIC_SIZES.add(lower_embedding)
