"""Batch norm (folded into a convolution only it reads, else a binary with a post-op),
layer norm, group norm, softmax, log-softmax, and two groups of nodes that are one engine
op each: attention's safe softmax and RMSNorm.
"""

from __future__ import annotations

import math

import torch
import torch.fx

from opforge.backends.partition import op_name
from opforge.backends.cpu.lowering.core import (
    SYMBOLIC_SIZES,
    B_ADD, B_MUL, LOWERINGS, Lowering, Unsupported, _dense_operand, _need_f32,
    _is_one, _post_operand_misread, _uses_output, _val, aten, row_major, same,
)


def lower_batch_norm(L: Lowering, node, args, kwargs):
    _need_f32(node)
    x, w, b, mean, var, momentum, eps = args[:7]
    if not all(v is None or (isinstance(v, tuple) and v[0] == "c") for v in (w, b, mean, var)):
        raise Unsupported("layout", "batch norm with run-time statistics")
    if _uses_output(node, 1) or _uses_output(node, 2):
        raise Unsupported("op", "batch norm whose saved statistics are used")
    mean, var = mean[1].double(), var[1].double()
    scale = 1.0 / torch.sqrt(var + eps)
    if w is not None:
        scale = scale * w[1].double()
    shift = -mean * scale + (b[1].double() if b is not None else 0)
    src = L.materialize(x)
    spec = L.spec(src)
    # fold into the convolution that produced x, when nothing else reads it
    writer = next((op for op in reversed(L.plan.ops) if src in op["out"]), None)
    if (writer is not None and writer["kind"] == "conv" and not writer["post"]
            and L.users.get(node.args[0].name, 0) == 1 and spec.role == "temp"):
        wt = L.plan.tensors[writer["in"][1]]
        weight = torch.frombuffer(bytearray(wt.data), dtype=torch.float32).reshape(wt.dims).double()
        weight = weight * scale.reshape(-1, *([1] * (weight.dim() - 1))) if weight.dim() == len(spec.dims) \
            else weight * scale.reshape(weight.shape[0], -1, *([1] * (weight.dim() - 2)))
        bias = shift.clone()
        if len(writer["in"]) == 3:
            bt = L.plan.tensors[writer["in"][2]]
            bias = torch.frombuffer(bytearray(bt.data), dtype=torch.float32).double() * scale + shift
        writer["in"][1] = L.materialize(("c", weight.float().contiguous()))
        if len(writer["in"]) == 3:
            writer["in"][2] = L.materialize(("c", bias.float().contiguous()))
        else:
            writer["in"].append(L.materialize(("c", bias.float().contiguous())))
            writer["ia"][-1] = 1
        return (("t", src), None, None)
    # per-channel scale and shift broadcast along dim 1: dims (1, C, 1, ...), strides (0, 1, 0, ...)
    channel_dims = tuple(spec.dims[1] if i == 1 else 1 for i in range(len(spec.dims)))
    channel_strides = tuple(1 if i == 1 else 0 for i in range(len(spec.dims)))
    ts = L.alias(L.materialize(("c", scale.float().contiguous())), channel_dims, channel_strides)
    tb = L.alias(L.materialize(("c", shift.float().contiguous())), channel_dims, channel_strides)
    out = L.new_tensor(torch.float32, spec.dims, strides=spec.strides)
    if _post_operand_misread(spec.dims, channel_dims):
        scaled = L.new_tensor(torch.float32, spec.dims, strides=spec.strides)
        L.op("binary", [src, ts], [scaled], [B_MUL], name="batch_norm")
        L.op("binary", [scaled, tb], [out], [B_ADD], name="batch_norm shift")
        return (("t", out), None, None)
    L.op("binary", [src, ts], [out], [B_MUL], post=[[1, B_ADD, 0.0, 0.0, tb]], name="batch_norm")
    return (("t", out), None, None)


def lower_layer_norm(L: Lowering, node, args, kwargs):
    _need_f32(node)
    x, shape, w, b, eps = args[:5]
    if _uses_output(node, 1) or _uses_output(node, 2):
        raise Unsupported("op", "layer norm whose mean/rstd outputs are used")
    src = L.contiguous(L.materialize(x))
    spec = L.spec(src)
    inner = math.prod(shape)
    outer = math.prod(spec.dims) // max(inner, 1)
    flat = L.alias(src, (outer, inner), (inner, 1))
    out = L.new_tensor(torch.float32, spec.dims)
    flat_out = L.alias(out, (outer, inner), (inner, 1))
    ins = [flat]
    for v in (w, b):
        if v is not None:
            t = L.materialize(v)
            ins.append(L.alias(t, (inner,), (1,)) if L.spec(t).dims != (inner,) else t)
    L.op("layer_norm", ins, [flat_out], [w is not None, b is not None], [eps], name="layer_norm")
    return (("t", out), None, None)


def lower_group_norm(L: Lowering, node, args, kwargs):
    _need_f32(node)
    x, w, b, n, c, hw, groups, eps = args[:8]
    if _uses_output(node, 1) or _uses_output(node, 2):
        raise Unsupported("op", "group norm whose mean/rstd outputs are used")
    src = L.contiguous(L.materialize(x))
    ins = [src] + [L.materialize(v) for v in (w, b) if v is not None]
    out = L.new_tensor(torch.float32, L.spec(src).dims)
    L.op("group_norm", ins, [out], [groups, w is not None, b is not None], [eps], name="group_norm")
    return (("t", out), None, None)


# A softmax over an axis that is not innermost in memory (CoaT's softmax over the tokens of
# k [B, heads, N, C/heads], a permuted view's) runs on rows: the source is copied once into
# the layout whose innermost dim is the axis (the other dims in the source's memory order),
# the softmax runs there on a row-major view with the axis last, and its result keeps that
# layout (a reader that wants another copies it, as for any strided tensor; CoaT's next
# matmul reads k's transpose, which is then row-major). oneDNN (2023.2) has no jit softmax
# for a strided axis: its reference kernel took 28.8 ms on [1, 8, 3137, 8] over dim 2 (one
# thread, AMD EPYC Zen 4), the copy about 0.04 ms and the row kernel 0.07 ms (oneDNN's jit
# softmax, without the engine's own kernels, 0.16 ms; bench/results/reference_cliffs.md).
# An own kernel over the strided axis would save the copy, not the next matmul's transpose.
def _axis_innermost(spec, dim: int) -> list[int] | None:
    """The dim order (outermost first) of a layout whose innermost dim is ``dim``, the rest
    in ``spec``'s memory order (in their logical order where sizes are symbolic: strides
    that depend on a size cannot be ranked for every value); None when ``dim`` is innermost
    already."""
    if any(type(v) is not int for v in (*spec.dims, *spec.strides)):
        if _is_one(spec.dims[dim]) or same(spec.strides[dim], 1):
            return None
        # a symbolic size: oneDNN's reference softmax took 8.5 ms on a [2, 8, 40, 6] view
        # over dim 2 (one thread), the copy and the row kernel microseconds
        return [*(k for k in range(len(spec.dims)) if k != dim), dim]
    if spec.dims[dim] <= 1 or spec.strides[dim] == 1:
        return None  # (a gapped source with the axis innermost: its row-major copy, as before)
    rest = sorted((k for k in range(len(spec.dims)) if k != dim),
                  key=lambda k: (-spec.strides[k], k))
    return [*rest, dim]


def lower_softmax(L, node, args, kwargs):
    _need_f32(node)
    src = L.materialize(args[0])
    dim = args[1] % max(len(L.spec(src).dims), 1)
    order = _axis_innermost(L.spec(src), dim) if len(L.spec(src).dims) > 1 else None
    if order is None:
        src = _dense_operand(L, src)
        spec = L.spec(src)
        out = L.new_tensor(torch.float32, spec.dims, strides=spec.strides)
        ins, outs = [src], [out]
    else:  # a row-major view of the rows layout, axis last
        dims = L.spec(src).dims
        view_dims = tuple(dims[k] for k in order)
        view_strides = row_major(view_dims)
        strides = [0] * len(dims)
        for k, s in zip(order, view_strides):
            strides[k] = s
        rows = L.new_tensor(torch.float32, dims, strides=strides)
        L.copy(src, rows)
        out = L.new_tensor(torch.float32, dims, strides=strides)
        ins, outs = [L.alias(rows, view_dims, view_strides)], [L.alias(out, view_dims, view_strides)]
        dim = len(dims) - 1
    log = op_name(node).startswith("aten::_log_softmax")
    if L.safe_softmax.get(node.name) is node:
        L.op("softmax", ins, outs, [dim, 0, 1], name="safe softmax")
    else:
        L.op("softmax", ins, outs, [dim, int(log)], name="log_softmax" if log else "softmax")
    return ("t", out)


def find_safe_softmax(sub) -> dict[str, torch.fx.Node]:
    """torch's ``_safe_softmax`` as ``scaled_dot_product_attention`` decomposes into it:

        p = _softmax(s, d); all_masked = logical_not(any(logical_not(eq(s, -inf)), d, True))
        out = where(all_masked, full_like(p, 0), p)

    (or, less decomposed, ``where(all(eq(s, -inf), d, True), zeros_like(p), p)``): that is
    one engine op (softmax with ``safe``: a row of only -inf gives zeros), instead of five
    passes over the score matrix. Keyed by the name of every node of each match, each to
    its softmax node; a match needs each inner node read only inside it, so no other node
    sees a value the fused op does not compute."""
    found: dict[str, torch.fx.Node] = {}
    for w in sub.graph_module.graph.nodes:
        match = _safe_softmax_match(w)
        if match is not None:
            for n in match:
                found[n.name] = match[0]
    return found


def _only_user(node, user) -> bool:
    return isinstance(node, torch.fx.Node) and list(node.users) == [user]


def _safe_softmax_match(w):
    if w.op != "call_function" or w.target is not aten.where.self or len(w.args) != 3:
        return None
    cond, zeros, p = w.args
    if not (isinstance(p, torch.fx.Node) and p.target is aten._softmax.default
            and len(p.args) == 3 and p.args[2] is False and not p.kwargs):
        return None
    if not (_only_user(zeros, w) and set(p.users) == {zeros, w} and (
            (zeros.target is aten.full_like.default and zeros.args[:2] == (p, 0))
            or (zeros.target is aten.zeros_like.default and zeros.args[:1] == (p,)))
            and zeros.kwargs.get("dtype") in (None, torch.float32)):
        return None
    s, dim = p.args[0], p.args[1]
    rank = len(_val(p).shape)
    inner = _all_masked(cond, w, s, dim % rank, rank)
    return None if inner is None else (p, *inner, zeros, w)


def _all_masked(cond, w, s, dim: int, rank: int):
    """The nodes of ``cond`` = "every element of the row is -inf" over ``dim`` of ``s``, in
    either form torch writes: ``all(eq(s, -inf), dim, True)`` (``_safe_softmax`` itself), or
    ``logical_not(any(logical_not(eq(s, -inf)), dim, True))`` (its decomposition)."""
    def reduces(node, op, user):
        return (_only_user(node, user) and node.target is op and len(node.args) == 3
                and node.args[2] is True and isinstance(node.args[1], int)
                and node.args[1] % rank == dim)

    def is_eq(node, user):
        return (_only_user(node, user) and node.target is aten.eq.Scalar and node.args[0] is s
                and node.args[1] == float("-inf"))

    if reduces(cond, aten.all.dim, w) and is_eq(cond.args[0], cond):
        return (cond.args[0], cond)
    if not (_only_user(cond, w) and cond.target is aten.logical_not.default):
        return None
    any_ = cond.args[0]
    if not reduces(any_, aten.any.dim, cond):
        return None
    not_eq = any_.args[0]
    if not (_only_user(not_eq, any_) and not_eq.target is aten.logical_not.default):
        return None
    eq = not_eq.args[0]
    return (eq, not_eq, any_, cond) if is_eq(eq, not_eq) else None


class RmsNorm:
    """One RMSNorm as torch decomposes it: ``y = x * rsqrt(mean(pow(x, 2), -1, True) + eps)``
    and optionally ``y * w`` (either operand order), ``w`` a constant of the last dim's
    size. ``nodes`` are every node of it in graph order; ``last`` computes the result."""

    kind = "rms_norm"

    def __init__(self, x, eps: float, weight, nodes: list) -> None:
        self.x, self.eps, self.weight, self.nodes = x, eps, weight, nodes
        self.last = nodes[-1]

    def lower(self, L: Lowering):
        return lower_rms_norm(L, self)


def find_rms_norm(sub) -> dict[str, RmsNorm]:
    """Every RMSNorm of the subgraph, keyed by the name of each of its nodes: one engine op
    (``rms_norm``: a pass to sum the squares and one to write, per row) instead of five
    passes and three temporaries. A match needs each inner node read only inside it."""
    found: dict[str, RmsNorm] = {}
    for node in sub.graph_module.graph.nodes:
        match = _rms_norm_match(node, sub.constants)
        if match is not None:
            for n in match.nodes:
                found[n.name] = match
    return found


def _other(node, first):
    """The operand of binary ``node`` that is not ``first`` (None unless exactly one is)."""
    a, b = node.args[:2]
    return b if a is first and b is not first else a if b is first and a is not first else None


def _rms_norm_match(r, constants) -> RmsNorm | None:
    if r.op != "call_function" or r.target is not aten.rsqrt.default:
        return None
    (a,) = r.args
    if not (isinstance(a, torch.fx.Node) and _only_user(a, r) and a.target in (
            aten.add.Tensor, aten.add.Scalar) and len(a.args) == 2 and not a.kwargs
            and isinstance(a.args[1], float)):
        return None
    m = a.args[0]
    if not (_only_user(m, a) and m.target is aten.mean.dim and len(m.args) == 3
            and m.args[2] is True and m.kwargs.get("dtype") is None):
        return None
    p = m.args[0]
    if not (_only_user(p, m) and p.target is aten.pow.Tensor_Scalar and p.args[1] in (2, 2.0)):
        return None
    x = p.args[0]
    fake = _val(x) if isinstance(x, torch.fx.Node) else None
    if fake is None or fake.dtype != torch.float32 or fake.dim() < 1 \
            or list(m.args[1]) not in ([-1], [fake.dim() - 1]):
        return None
    y = next(iter(r.users), None)
    if not (len(r.users) == 1 and y.target is aten.mul.Tensor and not y.kwargs
            and _other(y, r) is x):
        return None
    nodes, weight = [p, m, a, r, y], None
    w_mul = next(iter(y.users), None) if len(y.users) == 1 else None
    if w_mul is not None and w_mul.target is aten.mul.Tensor and not w_mul.kwargs:
        w = _other(w_mul, y)
        if isinstance(w, torch.fx.Node) and w.op == "placeholder" and w.name in constants \
                and tuple(constants[w.name].shape) == (fake.shape[-1],) \
                and constants[w.name].dtype == torch.float32:
            nodes.append(w_mul)
            weight = w
    return RmsNorm(x, a.args[1], weight, nodes)


def lower_rms_norm(L: Lowering, norm: RmsNorm):
    """The group's last node: one ``rms_norm`` over rows of the last dim."""
    src = L.contiguous(L.materialize(L.env[norm.x.name]))
    spec = L.spec(src)
    inner = spec.dims[-1]
    outer = math.prod(spec.dims[:-1])
    ins = [L.alias(src, (outer, inner), (inner, 1))]
    out = L.new_tensor(torch.float32, spec.dims)
    if norm.weight is not None:
        w = L.materialize(L.env[norm.weight.name])
        ins.append(w if L.spec(w).dims == (inner,) else L.alias(w, (inner,), (1,)))
    L.op("rms_norm", ins, [L.alias(out, (outer, inner), (inner, 1))], [int(len(ins) == 2)],
         [norm.eps], name="rms_norm")
    return ("t", out)


LOWERINGS["aten::_native_batch_norm_legit_no_training"] = lower_batch_norm
LOWERINGS["aten::native_layer_norm"] = lower_layer_norm
LOWERINGS["aten::native_group_norm"] = lower_group_norm
LOWERINGS["aten::_softmax"] = lower_softmax
LOWERINGS["aten::_log_softmax"] = lower_softmax
SYMBOLIC_SIZES.update({lower_layer_norm, lower_softmax})
