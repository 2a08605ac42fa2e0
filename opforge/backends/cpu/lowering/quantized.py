"""quantize/dequantize per tensor (quantized_decomposed's float32 arithmetic) and the 8a8w
patterns (dequantize → convolution/linear [→ relu] → quantize) lowered to oneDNN int8.

An activation quantized on its own (convolution → quantize → dequantize → relu/hardtanh →
quantize, what per-op annotation gives a conv-bn-relu) joins its convolution/linear: the
intermediate quantize/dequantize pair becomes post-ops on the primitive's float32
accumulator (× 1/scale, round half to even, clip to the uint8 range less the zero point,
× scale), then the activation, then the primitive's own output scale. The activation stays
uint8 from one primitive to the next, and the arithmetic is the pair's own: the result is
lean's, with the same one-step freedom at rounding boundaries the plain pattern has.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.fx

from opforge.backends.partition import op_name
from opforge.backends.cpu.lowering.core import (
    B_ADD, CLIP, LINEAR, LOWERINGS, RELU, ROUND, SYMBOLIC_SIZES, Lowering, Unsupported,
    _dense_operand, _val, aten,
)
from opforge.backends.cpu.lowering.layouts import channels_last


_qd = getattr(torch.ops, "quantized_decomposed", None)


def _qop(name):
    try:
        return getattr(getattr(torch.ops.quantized_decomposed, name), "default")
    except (AttributeError, RuntimeError):
        return None


QUANT_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32)


def lower_quant(L: Lowering, node, args, kwargs):
    """Per-tensor quantize/dequantize with scalar parameters, as quantized_decomposed
    computes them (exact: the same float32 operations)."""
    name = op_name(node)
    quantize = name.startswith("quantized_decomposed::quantize_per_tensor")
    x, scale, zp, qmin, qmax, dtype = (list(args) + [None] * 6)[:6]
    if not all(isinstance(v, (int, float)) for v in (scale, zp, qmin, qmax)):
        raise Unsupported("op", f"{name} with tensor parameters; stays on the kernels")
    if dtype not in QUANT_DTYPES or kwargs.get("out_dtype") not in (None, torch.float32):
        raise Unsupported("dtype", f"{name} with {dtype}; stays on the kernels")
    round_trip = None if quantize else _round_trip(node)
    memo = L.round_trips
    if round_trip is not None and round_trip.name in memo:
        return memo[round_trip.name]  # the same quantized value dequantized again
    source = L.env.get(round_trip.args[0].name) if round_trip is not None else None
    if isinstance(source, tuple) and source[:1] == ("t",) and L.spec(source[1]).dtype == torch.float32:
        x = source  # dequantize(quantize(v)) of one set of parameters, from v
        if _on_grid(round_trip.args[0], tuple(round_trip.args[1:6])):
            memo[round_trip.name] = source  # gives v back bit for bit: no op (_on_grid)
            return source
    else:
        round_trip = None
    src = _dense_operand(L, L.materialize(x))
    fake = _val(node)
    out = L.new_tensor(fake.dtype, fake.shape, strides=L.spec(src).strides)  # same layout
    mode = 0 if quantize else 2 if round_trip is not None else 1
    L.op("quant", [src], [out], [mode, int(qmin), int(qmax)], [float(scale), float(zp)],
         name=("quantize", "dequantize", "quantize-dequantize")[mode])
    if round_trip is not None:
        memo[round_trip.name] = ("t", out)
    return ("t", out)


def _round_trip(dq):
    """The quantize node a per-tensor dequantize reads, when it has the dequantize's
    parameters: the pair is one engine op (mode 2: the integer stays in registers, the
    same float32 arithmetic), and every dequantize of that quantize shares its result (the
    quantize itself is pruned unless something else reads its integers)."""
    q = dq.args[0]
    if not (isinstance(q, torch.fx.Node) and q.op == "call_function"
            and q.target == _qop("quantize_per_tensor")):
        return None
    if tuple(q.args[1:6]) != tuple(dq.args[1:6]) or q.kwargs or dq.kwargs.get("out_dtype") not in (None, torch.float32):
        return None
    return q


# ops whose every output element is an element of their first input, unchanged
_MOVES = frozenset(f"aten::{n}" for n in (
    "view", "reshape", "_unsafe_view", "permute", "transpose", "t", "expand", "clone",
    "contiguous", "unsqueeze", "squeeze", "slice", "select", "alias", "repeat", "flatten",
    "unflatten", "index_select"))


def _grid_source(v):
    """The per-tensor dequantize of a quantize-dequantize round trip that ``v`` is (moved
    unchanged from), else None."""
    while isinstance(v, torch.fx.Node) and v.op == "call_function" \
            and op_name(v).split(".")[0] in _MOVES:
        v = v.args[0]
    if isinstance(v, torch.fx.Node) and v.op == "call_function" \
            and v.target == _qop("dequantize_per_tensor") and _round_trip(v) is not None:
        return v
    return None


def _on_grid(v, params: tuple) -> bool:
    """``v`` is (moved unchanged from) the result of a quantize-dequantize with ``params``
    (scale, zero point, qmin, qmax, dtype) spanning at most 2^16 steps: then quantize-
    dequantize of ``v`` with the same ``params`` is ``v`` bit for bit, in the engine and
    in lean alike. Each element is y = fl(i·s) for an integer i = q - zp, |i| ≤ 2^16 (a NaN
    became qmin); fl(y · fl(1/s)) = i·(1 + δ), |δ| ≤ 3·2^-24, lies within 0.012 of i and
    rounds to it, i + zp = q is within [qmin, qmax] and dequantizes to y again. (A 16-bit
    decoder's attention re-quantizes the cache after each view, expand and transpose with
    the cache's own parameters: 5 of its 8 quantize-dequantizes a layer are these.)"""
    v = _grid_source(v)
    if v is None:
        return False
    scale, zp, qmin, qmax = (list(params) + [None] * 4)[:4]
    return tuple(v.args[1:6]) == params and isinstance(qmin, int) and isinstance(qmax, int) \
        and 0 <= qmax - qmin <= 1 << 16


def activation_grid(v) -> float | None:
    """The scale s when every value of ``v`` is (moved unchanged from) a per-tensor
    dequantize of a quantize with the same parameters, spanning at most 2^16 steps: each
    value is then fl(i·s) for an integer i, |i| <= 2^16 (_on_grid), and fl(v · fl(1/s))
    rounds back to i. What ``int_matmul``'s int16 mode needs of its activations (a 16-bit
    scheme's linear input; lowering/int_weights.py)."""
    v = _grid_source(v)
    if v is None:
        return None
    scale = v.args[1] if len(v.args) > 1 else None
    return float(scale) if isinstance(scale, float) and scale > 0 and _on_grid(v, tuple(v.args[1:6])) \
        else None


def _peel_relu(node):
    """(the relu, its input) when ``node`` is a relu read once, else (None, ``node``)."""
    if _is(node, aten.relu.default) and len(node.users) == 1:
        return node, node.args[0]
    return None, node


@dataclass
class Int8Pattern:
    dequant: Any
    compute: Any
    relu: Any
    quant: Any
    conv: bool
    weight: torch.Tensor      # int8, oneDNN's layout (conv: O,I,k..; matmul: K,N)
    scales: torch.Tensor      # float32 per output channel
    bias: torch.Tensor | None
    x_scale: float
    x_zp: int
    y_scale: float
    y_zp: int
    mask: int
    conv_ia: list
    output: int = -1
    # the requantized activation joined to the primitive (module docstring): the nodes of
    # quantize → dequantize → activation, and the post-ops they become
    joined: tuple = ()
    joined_add: tuple = ()  # quantize → dequantize → add [→ relu] (a residual add)
    post: list = field(default_factory=list)

    def post_ops(self, operand: Callable[[Any], int]) -> list[list]:
        """The post-op list, a binary post-op's operand node made a tensor id by ``operand``."""
        post = [[0, RELU, 0.0, 0.0, -1]] if self.relu is not None else []
        return post + [[*p[:4], operand(p[4])] if p[0] == 1 else p for p in self.post]


def fold_scales(post: list[list], x_scale: float, y_scale: float, bias: torch.Tensor | None):
    """The same arithmetic in fewer post-ops, for an int8 op computing
    q = round(P(acc · x_scale · w_scale + bias) / y_scale) + zp_y with post-op chain P:

    - a leading ``linear(a, 0)``, a > 0, joins the scales: x_scale · a, bias · a;
    - a trailing ``linear(c, 0)``, c > 0, joins the output scale (y_scale / c), and one
      followed by a clip or relu first trades places with it (clip(c·g, lo, hi) is
      c · clip(g, lo/c, hi/c));
    - two clips in a row whose ranges meet are one clip.

    A joined activation's requantization (× 1/s, round, clip, × s, relu6) is then round and
    clip: oneDNN's epilogue per output vector shrinks by three operations (MobileNetV2's
    1×1 convolution 16→96 at 112×112: 162 → 136 µs, one thread). In real numbers each
    rewrite is an identity; in float32 a product is rounded in another order, as oneDNN's
    own order already differs from lean's: a value on a rounding boundary may move one
    step. Returns (post, x_scale, y_scale, bias)."""
    post = [list(p) for p in post]

    def linear(p) -> float | None:  # a > 0 of a linear(a, 0) post-op, else None
        ok = p[0] == 0 and p[1] == LINEAR and p[3] == 0.0 and 0.0 < p[2] < float("inf")
        return float(p[2]) if ok else None

    def bounds(p) -> tuple[float, float] | None:
        if p[0] == 0 and p[1] == CLIP and p[2] <= p[3]:
            return float(p[2]), float(p[3])
        if p[0] == 0 and p[1] == RELU and p[2] == 0.0:
            return 0.0, float("inf")
        return None

    while post and (a := linear(post[0])) is not None:
        x_scale, bias = x_scale * a, None if bias is None else (bias.double() * a).float()
        post.pop(0)
    changed = True
    while changed:
        changed = False
        last = bounds(post[-1]) if post else None
        if len(post) >= 2 and (c := linear(post[-2])) is not None and last:
            post[-2:] = [[0, CLIP, max(last[0] / c, -3.0e38), min(last[1] / c, 3.0e38), -1], post[-2]]
            changed = True
        elif post and (c := linear(post[-1])) is not None:
            y_scale /= c
            post.pop()
            changed = True
        elif len(post) >= 2 and last and (before := bounds(post[-2])) \
                and max(before[0], last[0]) <= min(before[1], last[1]):
            post[-2:] = [[0, CLIP, max(before[0], last[0]), min(before[1], last[1], 3.0e38), -1]]
            changed = True
    return post, x_scale, y_scale, bias


def _is(node, op) -> bool:
    return isinstance(node, torch.fx.Node) and node.op == "call_function" and op is not None \
        and node.target == op


def _const(sub, node):
    if isinstance(node, torch.fx.Node) and node.op == "placeholder":
        return sub.constants.get(node.name)
    return None


def _per_tensor_u8(node, quantize: bool) -> tuple[float, int] | None:
    op = _qop("quantize_per_tensor" if quantize else "dequantize_per_tensor")
    if not _is(node, op) or node.kwargs.get("out_dtype") not in (None, torch.float32):
        return None
    _, scale, zp, qmin, qmax, dtype = (list(node.args) + [None] * 6)[:6]
    if dtype != torch.uint8 or qmin != 0 or qmax != 255 or not isinstance(scale, float) \
            or not isinstance(zp, int):
        return None
    return scale, zp


def _int8_weight(sub, node):
    """(int8 weight, float32 scales) of a per-channel dequantize of a constant along axis 0
    with zero zero-points, else None."""
    if not _is(node, _qop("dequantize_per_channel")):
        return None
    w, scales, zps, axis, qmin, qmax, dtype = (list(node.args) + [None] * 7)[:7]
    w, scales, zps = _const(sub, w), _const(sub, scales), _const(sub, zps)
    if w is None or scales is None or w.dtype != torch.int8 or dtype != torch.int8 or axis != 0:
        return None
    if zps is not None and bool((zps != 0).any()):
        return None
    return w, scales.float().contiguous()


def find_int8_patterns(sub) -> dict[str, Int8Pattern]:
    """``dequantize_per_tensor(u8) → convolution/addmm/mm [→ relu] → quantize_per_tensor(u8)``
    with per-channel int8 weights (convolutions grouped or not), and an activation joined
    after it (module docstring): the 8a8w patterns oneDNN runs in int8. Keyed by the name
    of every node in each pattern."""
    found: dict[str, Int8Pattern] = {}
    if _qop("dequantize_per_channel") is None:
        return found
    for node in sub.graph_module.graph.nodes:
        q = _per_tensor_u8(node, quantize=True)
        if q is None:
            continue
        relu, src = _peel_relu(node.args[0])
        if not isinstance(src, torch.fx.Node) or len(src.users) != 1:
            continue
        pattern = _match_compute(sub, src)
        if pattern is None:
            continue
        dq, conv, weight, scales, bias, mask, conv_ia = pattern
        x = _per_tensor_u8(dq, quantize=False)
        if x is None:
            continue
        p = Int8Pattern(dq, src, relu, node, conv, weight, scales, bias, x[0], x[1], q[0], q[1],
                        mask, conv_ia)
        for n in (src, relu, node):
            if n is not None:
                found[n.name] = p
    for node in sub.graph_module.graph.nodes:
        _join_activation(found, node)
    order = {n: i for i, n in enumerate(sub.graph_module.graph.nodes)}
    for node in sub.graph_module.graph.nodes:
        _join_residual_add(found, node, order)
    for node in sub.graph_module.graph.nodes:  # a relu quantized on its own after the add
        _join_activation(found, node)
    return found


def _requantize(scale: float, zp: int) -> list[list]:
    """Post-ops doing ``dequantize(quantize(x))`` on float32 x: quantize is
    round_half_even(x · float32(1/scale)) + zp clamped to [0, 255], i.e. the rounded value
    clamped to [-zp, 255 - zp]; dequantize is (q - zp) · scale."""
    return [[0, LINEAR, float(torch.tensor(1.0 / scale, dtype=torch.float32)), 0.0, -1],
            [0, ROUND, 0.0, 0.0, -1],
            [0, CLIP, float(-zp), float(255 - zp), -1],
            [0, LINEAR, scale, 0.0, -1]]


def _joinable(found: dict[str, Int8Pattern], dq) -> Int8Pattern | None:
    """The pattern whose quantize ``dq`` (a u8 dequantize read by one node) alone reads."""
    if _per_tensor_u8(dq, quantize=False) is None or len(dq.users) != 1:
        return None
    q = dq.args[0]
    pattern = found.get(getattr(q, "name", ""))
    if pattern is None or pattern.quant is not q or len(q.users) != 1:
        return None
    return pattern if (pattern.y_scale, pattern.y_zp) == _per_tensor_u8(dq, quantize=False) else None


def _join_residual_add(found: dict[str, Int8Pattern], node, order: dict) -> None:
    """``pattern.quant → dequantize → add(·, dequantize(b)) [→ relu] → quantize(u8)``: a
    residual add of two uint8 tensors joins the pattern that computes one of them. After
    the pattern's own post-ops and its requantization (``_requantize``), the other operand
    ``b`` (uint8, computed before the pattern's convolution) is added as a binary post-op:
    x + (b - zp_b)·scale_b as ((x · 1/scale_b - zp_b) + b) · scale_b, float32 sums in
    another order than lean's, so a value on a rounding boundary may move one step."""
    out = _per_tensor_u8(node, quantize=True)
    if out is None:
        return
    relu, top = _peel_relu(node.args[0])
    if not _is(top, aten.add.Tensor) or len(top.users) != 1 or len(top.args) != 2 \
            or top.kwargs.get("alpha", 1) != 1:
        return
    for mine, other in (top.args, top.args[::-1]):
        pattern = _joinable(found, mine)
        other_q = _per_tensor_u8(other, quantize=False)
        if pattern is None or other_q is None or pattern.joined_add:
            continue
        b = other.args[0]
        fake_b, fake_out = _val(b), _val(node)
        if not isinstance(b, torch.fx.Node) or fake_b is None or fake_out is None \
                or tuple(fake_b.shape) != tuple(fake_out.shape) or order[b] >= order[pattern.compute]:
            continue
        scale_b, zp_b = other_q
        pattern.post = pattern.post + _requantize(pattern.y_scale, pattern.y_zp) + [
            [0, LINEAR, float(torch.tensor(1.0 / scale_b, dtype=torch.float32)), float(-zp_b), -1],
            [1, B_ADD, 0.0, 0.0, b],
            [0, LINEAR, scale_b, 0.0, -1]]
        if relu is not None:
            pattern.post.append([0, RELU, 0.0, 0.0, -1])
        q, dq = mine.args[0], mine
        pattern.joined_add = (q, dq, top, relu)
        pattern.quant = node
        pattern.y_scale, pattern.y_zp = out
        for n in (q, dq, top, relu, node) + ((other,) if len(other.users) == 1 else ()):
            if n is not None:
                found[n.name] = pattern
        return


def _activation(node) -> tuple[float, float] | None:
    """(low, high) of a relu / hardtanh / clamp with number bounds, else None."""
    if _is(node, aten.relu.default):
        return 0.0, float("inf")
    if _is(node, aten.hardtanh.default):
        low, high = (list(node.args[1:]) + [-1.0, 1.0][len(node.args) - 1:])[:2]
        return float(low), float(high)
    if _is(node, aten.clamp.default):
        low, high = (list(node.args[1:]) + [None, None])[:2]
        if all(v is None or isinstance(v, (int, float)) for v in (low, high)) and not node.kwargs:
            return (float("-inf") if low is None else float(low),
                    float("inf") if high is None else float(high))
    return None


def _join_activation(found: dict[str, Int8Pattern], node) -> None:
    """``pattern.quant → dequantize → relu/hardtanh/clamp → quantize(u8)``, each node read
    by the next alone: the pattern takes the three nodes after its quantize (the module
    docstring says how)."""
    out = _per_tensor_u8(node, quantize=True)
    act = node.args[0] if out is not None else None
    bounds = _activation(act)
    if bounds is None or len(act.users) != 1:
        return
    dq = act.args[0]
    mid = _per_tensor_u8(dq, quantize=False)
    if mid is None or len(dq.users) != 1:
        return
    q = dq.args[0]
    pattern = found.get(getattr(q, "name", ""))
    if pattern is None or pattern.quant is not q or len(q.users) != 1 or pattern.joined:
        return
    if (pattern.y_scale, pattern.y_zp) != mid:
        return
    low, high = bounds
    pattern.post = pattern.post + _requantize(*mid)
    if low == 0.0 and high == float("inf"):
        pattern.post.append([0, RELU, 0.0, 0.0, -1])
    else:
        pattern.post.append([0, CLIP, max(low, -3.0e38), min(high, 3.0e38), -1])
    pattern.joined = (q, dq, act)
    pattern.quant = node
    pattern.y_scale, pattern.y_zp = out
    for n in (dq, act, node):
        found[n.name] = pattern


def _match_compute(sub, node):
    if _is(node, aten.convolution.default):
        x, w, b, stride, padding, dilation, transposed, output_padding, groups = node.args[:9]
        wq = _int8_weight(sub, w)
        if wq is None or transposed or (b is not None and _const(sub, b) is None):
            return None
        weight, scales = wq
        if weight.shape[0] % groups:
            return None
        nsp = weight.dim() - 2
        fake_in, fake_out = _val(x), _val(node)
        if fake_in is None or fake_out is None or fake_in.dim() != nsp + 2:
            return None
        pads_r = []
        for k in range(nsp):
            kernel = (weight.shape[2 + k] - 1) * dilation[k] + 1
            pads_r.append((fake_out.shape[2 + k] - 1) * stride[k] + kernel - fake_in.shape[2 + k] - padding[k])
        ia = [nsp, *stride, *padding, *pads_r, *dilation]
        bias = _const(sub, b) if b is not None else None
        if groups == 1:
            return x, True, weight.contiguous(), scales, bias, 1, ia
        # grouped (depthwise): oneDNN's (groups, out/groups, in/groups, k...) weights, one
        # scale per output channel, i.e. over the first two dims (mask 0b11)
        grouped = weight.reshape(groups, weight.shape[0] // groups, *weight.shape[1:])
        return x, True, grouped.contiguous(), scales, bias, 0b11, ia
    linear = _is(node, aten.linear.default)  # the portable kernel set keeps linear
    addmm = _is(node, aten.addmm.default)
    if linear or addmm or _is(node, aten.mm.default):
        if linear:  # x @ w.t() + b, w as it is stored ([out, in])
            x, w, b = (list(node.args) + [None])[:3]
        else:  # addmm(b, x, wt) / mm(x, wt) with wt a transpose node of w
            b, x, wt = node.args[:3] if addmm else (None, *node.args[:2])
            if len(node.args) > (3 if addmm else 2) or not (
                    (_is(wt, aten.permute.default) and list(wt.args[1]) == [1, 0])
                    or _is(wt, aten.t.default)):
                return None
            w = wt.args[0]
        bias = None if b is None else _const(sub, b)
        wq = _int8_weight(sub, w)
        if node.kwargs or (b is not None and bias is None) or wq is None or _val(x) is None \
                or _val(x).dim() != 2:
            return None
        weight, scales = wq  # [out, in]: oneDNN's K×N is its transpose
        return x, False, weight.t().contiguous(), scales, bias, 1 << 1, []
    return None


class Uint8MaxPool:
    """``dequantize(u8) → max_pool [→ getitem 0] → quantize(u8)`` with one scale (> 0) and
    zero point, each node read by the next alone: max pooling commutes with the dequantize
    (an increasing map) and that quantize gives back the integers it started from (|q - zp|
    <= 255 comes back within far less than half a step), so the engine pools the uint8
    tensor itself: one pass over a quarter of the bytes, no float32 temporaries (resnet18's
    stem at 224: dequantize 98 µs, float32 pooling 187 µs and quantize 58 µs before)."""

    kind = "uint8 max pooling"

    def __init__(self, dq, pool, nodes: list) -> None:
        self.dq, self.pool, self.nodes = dq, pool, nodes
        self.last = nodes[-1]

    def lower(self, L: Lowering):
        from opforge.backends.cpu.lowering.pooling import lower_pool

        source = L.materialize(L.env[self.dq.args[0].name])
        if L.spec(source).dtype != torch.uint8:
            raise Unsupported("dtype", "a uint8 max pooling whose source is not uint8")
        args = [None] + [L.arg(a) for a in self.pool.args[1:]]
        value = lower_pool(L, self.pool, args, {}, source=source)
        return value[0] if isinstance(value[0], tuple) else value


def find_uint8_max_pools(sub) -> dict[str, Uint8MaxPool]:
    """Every ``Uint8MaxPool`` of the subgraph, keyed by the name of each of its nodes."""
    found: dict[str, Uint8MaxPool] = {}
    pools = (aten.max_pool2d.default, aten.max_pool2d_with_indices.default)
    for q in sub.graph_module.graph.nodes:
        params = _per_tensor_u8(q, quantize=True)
        if params is None or params[0] <= 0:
            continue
        top = q.args[0]
        getitem = None
        if isinstance(top, torch.fx.Node) and top.target is operator.getitem and top.args[1] == 0:
            getitem, top = top, top.args[0]
        if not _is(top, pools[1] if getitem is not None else pools[0]) or \
                len(top.users) != 1 or (getitem is not None and len(getitem.users) != 1):
            continue
        dq = top.args[0]
        if _per_tensor_u8(dq, quantize=False) != params or len(dq.users) != 1:
            continue
        group = Uint8MaxPool(dq, top, [n for n in (dq, top, getitem, q) if n is not None])
        for n in group.nodes:
            found[n.name] = group
    return found


LOWERINGS["quantized_decomposed::quantize_per_tensor"] = lower_quant
LOWERINGS["quantized_decomposed::dequantize_per_tensor"] = lower_quant
SYMBOLIC_SIZES.add(lower_quant)  # one elementwise pass: any sizes (a quantized decoder's prefill)


# --- 8a8w convolution / linear on oneDNN int8 ---------------------------------------------
def lower_int8(L: Lowering, node):
    """A node of an int8 pattern: the convolution/matmul emits the int8 op (reading the
    dequantize's integer input, writing the quantize's integer output); the relu between
    them is its post-op; the quantize returns that output."""
    pattern = L.int8[node.name]
    if node is not pattern.compute:
        return ("t", pattern.output) if node is pattern.quant else ("q8", node.name)
    x = L.materialize(L.env[pattern.dequant.args[0].name])
    if L.spec(x).dtype != torch.uint8:
        raise Unsupported("dtype", "an int8 pattern whose activation is not uint8")
    x = L.contiguous(x) if not pattern.conv else x
    fake = _val(pattern.quant)
    ins = [x]
    if pattern.conv:
        sx = L.spec(x)
        if sx.strides != channels_last(sx.dims):
            cl = L.new_tensor(sx.dtype, sx.dims, strides=channels_last(sx.dims))
            L.copy(x, cl)
            ins = [cl]
        out = L.new_tensor(torch.uint8, fake.shape, strides=channels_last(fake.shape))
    else:
        out = L.new_tensor(torch.uint8, fake.shape)
    ins += [L.materialize(("c", pattern.weight)), L.materialize(("c", pattern.scales))]
    post, x_scale, y_scale, bias = fold_scales(
        pattern.post_ops(lambda b: _residual_operand(L, b, out)), pattern.x_scale,
        pattern.y_scale, pattern.bias)
    if bias is not None:
        if not pattern.conv:
            bias = bias.reshape(1, -1)
        ins.append(L.materialize(("c", bias.float().contiguous())))
    ia = [pattern.x_zp, pattern.y_zp, pattern.mask, int(pattern.bias is not None), *pattern.conv_ia]
    L.op("qconv" if pattern.conv else "qmatmul", ins, [out], ia, [x_scale, y_scale],
            name="int8 " + ("convolution" if pattern.conv else "matmul"), post=post)
    pattern.output = out
    L.plan.impls.append({"node": node.name, "op": op_name(node),
                            "impl": "oneDNN int8 " + ("convolution" if pattern.conv else "matmul")})
    return ("q8", node.name)

def _residual_operand(L: Lowering, node, out: int) -> int:
    """A residual add's uint8 operand joined to an int8 op: in its output's layout
    (oneDNN's fast kernels read binary post-op operands in the destination's)."""
    b = L.materialize(L.env[node.name])
    sb, so = L.spec(b), L.spec(out)
    if sb.dtype != torch.uint8:
        raise Unsupported("dtype", "a residual add joined to an int8 op whose other operand "
                          "is not uint8")
    if sb.strides != so.strides:
        same = L.new_tensor(sb.dtype, sb.dims, strides=so.strides)
        L.copy(b, same)
        b = same
    return b
