"""Graph reading for the filled-attention match (lowering/attention.py): chains of views and
scalar scalings between a matmul and the tensor it reads, a constant computed in the graph,
and the slot bound a score mask puts on each query row.

Everything here answers from the graph alone (node targets, fake shapes, constants it can
compute); nothing is assumed about which library wrote the model.
"""

from __future__ import annotations

import math

import torch
import torch.fx

from opforge.backends.cpu.lowering.core import _val, aten
from opforge.backends.cpu.lowering.normalization import _only_user

__all__ = ["VIEWS", "RESHAPES", "HALF", "scale_of", "peel", "is_cast", "same_rows", "constant",
           "slot_bound"]

# view ops: the element at each index is some element of the input (no arithmetic)
VIEWS = {aten.unsqueeze.default, aten.expand.default, aten.clone.default, aten.view.default,
         aten._unsafe_view.default, aten.reshape.default, aten.permute.default,
         aten.transpose.int, aten.t.default, aten.alias.default, aten.contiguous.default,
         aten.squeeze.dim, aten.squeeze.dims}
# the views that keep the elements in their order (a permute does not)
RESHAPES = VIEWS - {aten.permute.default, aten.transpose.int, aten.t.default}
# the half-precision dtypes a KV cache may be stored in (the engine converts as it reads)
HALF = (torch.float16, torch.bfloat16)
_SCALES = (aten.mul.Tensor, aten.mul.Scalar, aten.div.Tensor, aten.div.Scalar)
# what a constant in the graph may be computed with (a slot table, a mask's fill values)
_CONSTANT_OPS = {aten.arange.default, aten.arange.start, aten.arange.start_step,
                 aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor, aten.unsqueeze.default,
                 aten.view.default, aten.expand.default, aten.clone.default, aten.alias.default,
                 aten._to_copy.default, aten.scalar_tensor.default, aten.full.default,
                 aten.lift_fresh_copy.default}


def scale_of(node) -> float | None:
    """The factor ``f`` when ``node`` is ``x * c`` (``f = c``) or ``x / c`` (``f = 1 / c``)
    of a float32 tensor ``x`` by a finite non-zero Python number ``c``, else None."""
    if not (isinstance(node, torch.fx.Node) and node.op == "call_function"
            and node.target in _SCALES and len(node.args) == 2 and not node.kwargs
            and isinstance(node.args[0], torch.fx.Node)):
        return None
    c = node.args[1]
    if isinstance(c, bool) or not isinstance(c, (int, float)) or not math.isfinite(c) or c == 0:
        return None
    fake, src = _val(node), _val(node.args[0])
    if fake is None or src is None or fake.dtype != torch.float32 or src.dtype != torch.float32:
        return None
    return 1.0 / float(c) if node.target in (aten.div.Tensor, aten.div.Scalar) else float(c)


def peel(node, user, *, views=VIEWS, scales: bool = False, converts: bool = False):
    """Walk from ``node`` (read by ``user``) back through view ops (and scalar scalings where
    ``scales``, casts to float32 where ``converts``), each read only by the next: (the first
    node that is none of them, the nodes walked, the scale factors met)."""
    nodes, factors = [], []
    while isinstance(node, torch.fx.Node) and node.op == "call_function" and _only_user(node, user):
        factor = scale_of(node) if scales else None
        if factor is not None:
            factors.append(node)
        elif node.target not in views and not (converts and is_cast(node)):
            break
        nodes.append(node)
        user, node = node, node.args[0]
    return node, nodes, factors


def is_cast(node) -> bool:
    """``node`` is ``x.to(float32)`` (``_to_copy`` with no other change)."""
    fake = _val(node)
    return (node.target is aten._to_copy.default and len(node.args) == 1 and fake is not None
            and fake.dtype == torch.float32
            and set(node.kwargs) <= {"dtype", "layout", "device", "memory_format"})


def _non_unit(shape) -> list[str]:
    return [str(d) for d in shape if not (isinstance(d, int) and d == 1)]


def same_rows(nodes, source) -> bool:
    """Each of ``nodes`` (a peeled chain, last first) keeps the elements of ``source`` in
    their order, only adding or dropping dims of size 1: a reshape that is the identity on
    memory, an expand to the same shape, a scaling. Sizes compare as text, so a symbolic
    size matches itself."""
    want = _non_unit(_val(source).shape)
    for n in nodes:
        fake = _val(n)
        if fake is None or _non_unit(fake.shape) != want:
            return False
        if n.target is aten.expand.default and [str(d) for d in fake.shape] != [
                str(d) for d in _val(n.args[0]).shape]:
            return False
        if n.target in (aten.permute.default, aten.transpose.int, aten.t.default):
            return False  # (a permute of unit dims only is rare; not worth proving)
    return True


def constant(node, constants: dict, depth: int = 0):
    """The value of ``node`` when the graph computes it from constants alone (a slot table
    ``arange(S) + 0``, a fill value ``scalar_tensor(-inf)``), else None."""
    if not isinstance(node, torch.fx.Node):
        return node
    if node.name in constants:
        return constants[node.name]
    if depth > 12 or node.op != "call_function" or node.target not in _CONSTANT_OPS:
        return None
    args = [constant(a, constants, depth + 1) if isinstance(a, torch.fx.Node) else a
            for a in node.args]
    if any(a is None for a in args) or any(isinstance(a, (list, tuple)) and any(
            isinstance(x, torch.fx.Node) for x in a) for a in args):
        return None
    fake = _val(node)
    if fake is None or not all(isinstance(d, int) for d in fake.shape) or fake.numel() > 1 << 22:
        return None
    return node.target(*args, **node.kwargs)


_RELATIONS = {aten.le.Tensor: "<=", aten.lt.Tensor: "<", aten.gt.Tensor: ">",
              aten.ge.Tensor: ">="}
_MIRROR = {"<=": ">=", "<": ">", ">": "<", ">=": "<="}


def slot_bound(cond, constants: dict, slots: int, rows, attend: bool):
    """For a boolean mask ``cond`` over the scores [.., rows, slots] (True = attend to the
    slot where ``attend``, True = masked otherwise): (``p``, ``bias``) when the slots row
    ``i`` attends to are exactly ``j < p[i] + bias`` — ``cond`` is a comparison of the slot
    table (a constant ``0..S-1`` along the last dim) with an int64 [rows] node ``p`` along
    the row dim, through views that add dims of size 1 — else None."""
    cmp = cond
    while isinstance(cmp, torch.fx.Node) and cmp.target in (
            aten.expand.default, aten.unsqueeze.default, aten.view.default) \
            and _last_two(cmp) is not None and _last_two(cmp) == _last_two(cmp.args[0]):
        cmp = cmp.args[0]  # (leading dims added or broadcast: every head reads one mask)
    if not (isinstance(cmp, torch.fx.Node) and cmp.target in _RELATIONS and len(cmp.args) == 2):
        return None
    relation = _RELATIONS[cmp.target]
    a, b = cmp.args
    table = constant(a, constants)
    if table is None:  # the slot table on the right: p (op) j is j (mirror op) p
        a, b, relation = b, a, _MIRROR[relation]
        table = constant(a, constants)
    if not (isinstance(table, torch.Tensor) and table.dtype in (torch.int64, torch.int32)
            and table.dim() >= 1 and table.shape[-1] == slots and table.numel() == slots
            and torch.equal(table.reshape(-1).long(), torch.arange(slots))):
        return None
    positions = _rows_column(b, rows)
    if positions is None:
        return None
    # j (relation) p: the slots attended are j <= p (bias 1) or j < p (bias 0)
    bias = {("<=", True): 1, ("<", True): 0, (">", False): 1, (">=", False): 0}.get(
        (relation, attend))
    return None if bias is None else (positions, bias)


def _last_two(node):
    fake = _val(node) if isinstance(node, torch.fx.Node) else None
    return None if fake is None or fake.dim() < 2 else [str(d) for d in fake.shape[-2:]]


def _rows_column(node, rows):
    """The int64 [rows] node ``p`` that ``node`` is ``p`` viewed [1.., rows, 1] (unsqueezes
    and views that add unit dims), else None."""
    fake = _val(node) if isinstance(node, torch.fx.Node) else None
    if fake is None or fake.dim() < 2 or not (isinstance(fake.shape[-1], int) and fake.shape[-1] == 1) \
            or str(fake.shape[-2]) != str(rows) or any(
                not (isinstance(d, int) and d == 1) for d in fake.shape[:-2]):
        return None
    while node.target in (aten.unsqueeze.default, aten.view.default, aten.expand.default) \
            and _val(node.args[0]) is not None and _non_unit(_val(node.args[0]).shape) == _non_unit(fake.shape) \
            and (node.target is not aten.expand.default
                 or list(_val(node.args[0]).shape) == list(fake.shape)):
        node = node.args[0]
        if _val(node).dim() == 1:
            break
    p = _val(node)
    if p is None or p.dtype != torch.int64 or p.dim() != 1 or str(p.shape[0]) != str(rows):
        return None
    return node
