"""A lowering constant's bytes: a view of its tensor, or one copy, shared by name.

The plan's constants are row-major bytes. A contiguous tensor's bytes are a view of it (a
model's weight is not copied); a strided one (a linear's weight read transposed) is
copied once. A large constant (``blob.NAMED_MIN_BYTES``) of a delegate with a named data
store goes through the export's pool (``NamedDataStore.share``): a strided one is hashed
slab by slab first, so that when another delegate made the same bytes (the decode
method's transposed weight is the prefill's) the pooled bytes are taken and no duplicate
is built at all. (Built and dropped, a duplicate still cost memory: glibc keeps freed
blocks of a few MB in its heap, ~0.8x the weights of a 125M decoder's decode delegate.)
"""

from __future__ import annotations

import torch

from opforge.backends.cpu.blob import NAMED_MIN_BYTES, named_layout
from opforge.export.argument_values import scalar_type_of

__all__ = ["constant_bytes"]

SLAB_BYTES = 4 << 20  # the rows hashed at a time from a strided tensor


def constant_bytes(tensor: torch.Tensor, named_data=None):
    """``tensor``'s row-major bytes for a plan (``TensorSpec.data``)."""
    if not tensor.numel():
        return b""
    if named_data is None or tensor.nbytes < NAMED_MIN_BYTES:
        return _bytes(tensor)
    layout = named_layout(int(scalar_type_of(tensor.dtype)), list(tensor.shape))
    if tensor.is_contiguous() or tensor.dim() == 0:
        return named_data.share(_bytes(tensor), layout)
    rows = max(1, SLAB_BYTES // max(1, tensor[0].numel() * tensor.element_size()))
    slabs = (_bytes(tensor[i:i + rows]) for i in range(0, tensor.shape[0], rows))
    return named_data.share_chunks(slabs, layout, lambda: _bytes(tensor))


def _bytes(tensor: torch.Tensor) -> memoryview:
    return memoryview(tensor.contiguous().view(-1).view(torch.uint8).numpy())
