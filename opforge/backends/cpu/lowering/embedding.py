"""Embedding: the engine's bounds-checked row gather.
"""

from __future__ import annotations

import torch
import torch.fx

from opforge.backends.cpu.lowering.core import SYMBOLIC_SIZES, LOWERINGS, Unsupported, _val


def lower_embedding(L, node, args, kwargs):
    weight, indices = args[0], args[1]
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
