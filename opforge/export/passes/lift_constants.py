"""Constants: parameters, buffers and lifted tensor constants become constant segments.

torch.export has already lifted every constant to a placeholder; this pass makes each
one contiguous, gives it a segment key (a hash of dtype, sizes and bytes) and merges
placeholders whose tensors are equal (tied weights, repeated masks), so each distinct
tensor is stored once; a state tensor's initial value is never merged (each state has its
own live copy at run time), nor is a buffer (another method may update it). The emitter deduplicates again across methods by the same key.
"""

from __future__ import annotations

import hashlib

import torch

from opforge.export.method_graph import InputKind, MethodGraph
from opforge.export.pass_manager import ExportPass

__all__ = ["LiftConstants", "constant_key"]


def constant_key(tensor: torch.Tensor) -> str:
    """A content key for a contiguous CPU tensor: equal keys mean equal tensors."""
    digest = hashlib.sha256()
    digest.update(f"{tensor.dtype}|{tuple(tensor.shape)}|".encode())
    if tensor.numel():  # hashed in place (a view, not a copy of the bytes)
        digest.update(tensor.contiguous().view(-1).view(torch.uint8).numpy())
    return digest.hexdigest()


class LiftConstants(ExportPass):
    """Give every constant placeholder a segment key; merge equal constants."""

    requires = frozenset({"functional"})
    ensures = frozenset({"constants_lifted"})

    def run(self, method: MethodGraph) -> MethodGraph:
        keys: dict[str, str] = {}
        first_with_key: dict[str, torch.fx.Node] = {}
        merged: dict[str, str] = {}
        for node in method.placeholders():
            if method.input_kinds[node.name] == InputKind.USER:
                continue
            tensor = method.constants[node.name].detach().cpu().contiguous()
            key = constant_key(tensor)
            kind = method.input_kinds[node.name]
            if kind == InputKind.STATE:  # its own live copy: no merging
                key = f"state:{method.notes['state'][node.name]}:{key}"
            elif kind == InputKind.BUFFER:  # may be another method's state: no merging
                key = f"buffer:{method.notes.get('buffer_names', {}).get(node.name)}:{key}"
            kept = first_with_key.get(key)
            if kept is not None:
                node.replace_all_uses_with(kept)
                method.graph.erase_node(node)
                del method.constants[node.name]
                del method.input_kinds[node.name]
                merged[node.name] = kept.name
                continue
            first_with_key[key] = node
            method.constants[node.name] = tensor
            keys[node.name] = key
        method.notes["constant_keys"] = keys
        method.notes["merged_constants"] = merged
        return method
