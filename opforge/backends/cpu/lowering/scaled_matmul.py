"""Scalar multiplies of a matmul's operands, folded into the matmul's output.

``scaled_dot_product_attention`` decomposes into ``matmul(q * s, kᵀ * s)`` with
``s = d ** -0.25``: two elementwise passes over q and k before the score matmul. Since
``(s₁ a)(s₂ b) = s₁ s₂ (a b)``, each such multiply (``aten::mul`` of a tensor by a Python
number, read by nothing but a ``matmul``/``bmm``/``mm``) is dropped and the product of the
factors becomes an eltwise ``linear`` post-op (α = s₁ s₂) at the front of the matmul's
post-ops: one pass fewer per operand, and one float32 rounding fewer than eager's (the
result is as close to float64 as eager's, or closer; ``s₁ s₂`` of the decomposition is
1/√d, a power of two for d = 4^k). A multiply whose input is not a computed tensor (a
constant: it folds at export) is lowered as usual.
"""

from __future__ import annotations

import math

import torch
import torch.fx

__all__ = ["find_scaled_operands", "scalar_factor", "apply_scale"]

aten = torch.ops.aten

_MATMULS = (aten.matmul.default, aten.bmm.default, aten.mm.default)
_MULS = (aten.mul.Scalar, aten.mul.Tensor)


def find_scaled_operands(sub) -> dict[str, str]:
    """Multiply node name → the name of the matmul it alone feeds."""
    found: dict[str, str] = {}
    for mm in sub.graph_module.graph.nodes:
        if mm.op != "call_function" or mm.target not in _MATMULS or mm.kwargs:
            continue
        for operand in set(mm.args[:2]):
            if _scalar_factor(operand) is not None and list(operand.users) == [mm]:
                found[operand.name] = mm.name
    return found


def _scalar_factor(node) -> float | None:
    if not (isinstance(node, torch.fx.Node) and node.op == "call_function"
            and node.target in _MULS and len(node.args) == 2 and not node.kwargs
            and isinstance(node.args[0], torch.fx.Node)):
        return None
    s = node.args[1]
    if isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(s):
        return None
    val = node.meta.get("val")
    src = node.args[0].meta.get("val")
    if not (isinstance(val, torch.Tensor) and isinstance(src, torch.Tensor)
            and val.dtype == src.dtype == torch.float32):
        return None
    return float(s)


def scalar_factor(node) -> float:
    """The Python number a multiply ``find_scaled_operands`` found scales its input by."""
    return _scalar_factor(node)


def apply_scale(ops: list[dict], scale: float, node_name: str) -> None:
    """Put ``scale`` in front of the post-ops of the one matmul op lowered for the node."""
    from opforge.backends.cpu.lowering.core import LINEAR

    matmuls = [op for op in ops if op["kind"] == "matmul"]
    if len(matmuls) != 1:  # every matmul lowering emits one; an internal error otherwise
        raise AssertionError(f"{node_name}: {len(matmuls)} matmul ops for one scaled matmul")
    matmuls[0]["post"].insert(0, [0, LINEAR, scale, 0.0, -1])
    matmuls[0]["name"] += f" (x{scale:.6g})"
