"""Registers opforge operator definitions with PyTorch (``torch.library``).

>>> import opforge, torch
>>> from opforge.torch_bridge import register
>>> @opforge.op("doc_ops::twice(Tensor x) -> Tensor")
... def twice(x):
...     return x * 2
>>> register(twice.opdef)
>>> torch.ops.doc_ops.twice(torch.ones(2)).tolist()
[2.0, 2.0]
"""

from opforge.torch_bridge.registration import (
    is_registered, register, registered_opdef, registered_ops, set_out_kernel,
)

__all__ = [
    "is_registered", "register", "register_manifest", "registered_opdef", "registered_ops",
    "set_out_kernel",
]


def register_manifest(path) -> list:
    """Load a manifest file and register every custom op in it; returns the OpDefs."""
    from opforge.manifest import load_manifest

    defs = load_manifest(path)
    register(defs)
    return defs
