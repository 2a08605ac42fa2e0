"""Linear layers on dynamically quantized int8 activations and int8/int4 block weights
(schemes 8da8w and 8da4w, ``opforge.quantize.dynamic``) as one ``int_dot_matmul`` each: the
engine quantizes the activation rows itself and sums each block's products as integers
(``native/int_dot_matmul.cpp``), instead of the float chain the graph spells out.

Taken, per linear (``linear(xd, w, bias)``, or ``addmm(bias, xd, wᵀ)`` / ``mm(xd, wᵀ)``)::

    s  = div(clamp(amax(abs(reshape(x, [..., K/g, g])), [-1]), eps), 127)
    z  = zeros_like(s, dtype=int32)      (or full_like(s, 0, ...), or no zero point)
    xq = torchao.quantize_affine(x, [1, .., g], s, z, int8, -127, 127)
    xd = torchao.dequantize_affine(xq, [1, .., g], s, z, int8, -127, 127)

with every inner node read only inside the chain (the dequantized ``xd`` may feed several
such linears: each re-quantizes its rows, a pass over M·K values), ``eps`` a float32 value in
(0, 1], and ``w`` an integer weight in the same blocks of ``g`` along K: torchao's
``dequantize_affine`` (block ``(1, g)``) or ``dequantize_per_channel`` (``g`` = K) of
constants, zero zero points, that ``lowering/int_weights.py``'s exactness guard accepts
(float32(q)·scale is the folded weight, bit for bit); 4 bits when its values and range lie
in [-8, 7]. The engine's arithmetic is then the chain's up to the order of the float sums
(native/int_dot_matmul.cpp states both and the bound). ``OPFORGE_CPU_INT_DOT=0`` at export
leaves the chain to the other lowerings (the A/B).

Layout written into the blob (``int_dot_matmul``'s contract): weights as panels of 16
output columns, per block ``g`` quads of 4 consecutive k of one column in each 32-bit lane,
stored unsigned (q + 128, or two nibbles q + 8 a byte, quads 2i and 2i + 1), panels in
chunks of 4, each chunk one stream ordered [block, quad, panel]; scales [P·K/g, 16] in the same
chunk order (a chunk's scales one stream ordered [block, panel]), float16 when every scale is a
float16 value (``opforge.quantize.dynamic`` rounds them so: 2 bytes a scale, Q4_0's), else
float32.
"""

from __future__ import annotations

import os

import torch
import torch.fx

from opforge.backends.cpu.lowering.core import (
    LOWERINGS, SYMBOLIC_SIZES, Lowering, Unsupported, _val, same,
)
from opforge.backends.cpu.lowering.int_weights import IntWeight, _is, _transposed

aten = torch.ops.aten
LANES = 16
MAX_GROUP = 65536


def enabled() -> bool:
    return os.environ.get("OPFORGE_CPU_INT_DOT", "1") != "0"


def pack(weight: IntWeight) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights uint8 [P, G, rows, 64], scales float16 or float32 [P·G, 16]) in the module
    docstring's layout (rows: ceil(g/4) quads, or ceil(g/8) quad pairs for 4 bits)."""
    n, k = weight.q.shape
    g = weight.group
    blocks, panels = k // g, -(-n // LANES)
    quads = -(-g // 4)
    if weight.bits == 4:
        quads += quads % 2
    q = torch.zeros(panels * LANES, blocks, quads * 4, dtype=torch.int16)
    q[:n, :, :g] = weight.q.to(torch.int16).reshape(n, blocks, g)
    q = q.reshape(panels, LANES, blocks, quads, 4).permute(0, 2, 3, 1, 4)  # [P, G, Q, 16, 4]
    if weight.bits == 8:
        packed = (q + 128).to(torch.uint8)
    else:
        nib = q + 8
        packed = (nib[:, :, 0::2] | (nib[:, :, 1::2] << 4)).to(torch.uint8)
    packed = _chunk_order(packed.reshape(panels, blocks, -1, 64)).reshape(panels, blocks, -1, 64)
    s = torch.zeros(panels * LANES, blocks, dtype=torch.float32)
    s[:n] = weight.scales
    scales = _chunk_order(s.reshape(panels, LANES, blocks).permute(0, 2, 1).unsqueeze(2))
    scales = scales.reshape(panels * blocks, LANES)
    if torch.equal(scales.half().float(), scales):  # every one a float16 value: exact in 2 bytes
        scales = scales.half()
    return packed, scales


def _chunk_order(t: torch.Tensor) -> torch.Tensor:
    """``t`` [P, G, R, 64 bytes or 16 floats] as chunks of 4 panels (the last may hold fewer),
    each one stream ordered [block, row, panel of the chunk]: flat, contiguous."""
    return torch.cat([t[c:c + 4].permute(1, 2, 0, 3).reshape(-1)
                      for c in range(0, t.shape[0], 4)]).contiguous()


class IntDot:
    """One linear of the pattern; ``chain`` the activation's nodes (shared by the linears
    reading the same ``xd``). The lowering computes the linear at its own node and marks
    the chain's nodes fused."""

    kind = "int_dot_matmul"

    def __init__(self, x, linear, weight: IntWeight, bias, eps: float) -> None:
        self.x, self.last, self.weight, self.bias, self.eps = x, linear, weight, bias, eps

    def lower(self, L: Lowering):
        return lower_int_dot(L, self)


def _only_users(node, allowed) -> bool:
    return isinstance(node, torch.fx.Node) and bool(node.users) and set(node.users) <= set(allowed)


def _float32_value(v) -> float | None:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        f = float(torch.tensor(float(v), dtype=torch.float32))
        return f if f == float(v) else None
    return None


def _activation_chain(xd):
    """(x, g, eps, chain nodes) of a dequantized dynamic activation ``xd``, else None."""
    if not _is(xd, "torchao::dequantize_affine") or len(xd.args) < 7:
        return None
    xq, block, s, z, dtype, qmin, qmax = xd.args[:7]
    if dtype != torch.int8 or (qmin, qmax) != (-127, 127) \
            or xd.kwargs.get("output_dtype", torch.float32) != torch.float32:
        return None
    if not _is(xq, "torchao::quantize_affine") or len(xq.args) < 7 or tuple(xq.args[1:7]) != (
            block, s, z, torch.int8, -127, 127) or xq.kwargs or list(xq.users) != [xd]:
        return None
    x = xq.args[0]
    fake = _val(x) if isinstance(x, torch.fx.Node) else None
    if fake is None or fake.dtype != torch.float32 or fake.dim() < 1:
        return None
    k = fake.shape[-1]
    block = list(block)
    if not isinstance(k, int) or len(block) != fake.dim() or any(b != 1 for b in block[:-1]):
        return None
    g = block[-1]
    if not isinstance(g, int) or not 1 <= g <= MAX_GROUP or k % g:
        return None
    chain = [xq, xd]
    if z is not None:
        zero = _is(z, "aten::zeros_like") or (_is(z, "aten::full_like") and len(z.args) == 2
                                             and z.args[1] == 0)
        if not (zero and z.args[0] is s and _only_users(z, [xq, xd])
                and z.kwargs.get("dtype") in (torch.int32, torch.int64, torch.int8)):
            return None
        chain.append(z)
    # s = div(clamp(amax(abs(reshape(x, [..., K/g, g])), [-1]), eps), 127)
    if not (_is(s, "aten::div") and len(s.args) == 2 and s.args[1] in (127, 127.0)
            and not s.kwargs and _only_users(s, chain)):
        return None
    c = s.args[0]
    if not (_is(c, "aten::clamp") and list(c.users) == [s] and len(c.args) >= 2
            and (len(c.args) < 3 or c.args[2] is None) and not c.kwargs):
        return None
    eps = _float32_value(c.args[1])
    if eps is None or not 0 < eps <= 1:
        return None
    a = c.args[0]
    if not (_is(a, "aten::amax") and list(a.users) == [c] and len(a.args) >= 2
            and list(a.args[1]) in ([-1], [fake.dim()]) and not (len(a.args) > 2 and a.args[2])):
        return None
    b = a.args[0]
    if not (_is(b, "aten::abs") and list(b.users) == [a]):
        return None
    v = b.args[0]
    if not ((_is(v, "aten::reshape") or _is(v, "aten::view") or _is(v, "aten::_unsafe_view"))
            and v.args[0] is x and list(v.users) == [b]):
        return None
    shape = list(v.args[1])
    if len(shape) != fake.dim() + 1 or shape[-2:] != [k // g, g]:
        return None
    return x, g, eps, chain + [s, c, a, b, v]


def _weight(sub, wnode, g: int) -> IntWeight | None:
    """The integer weight ``wnode`` dequantizes (constants, blocks of ``g`` along K, zero
    zero points), when float32(q)·scale reproduces the op's own result bit for bit."""
    consts = sub.constants

    def const(v):
        return consts.get(v.name) if isinstance(v, torch.fx.Node) and v.op == "placeholder" else None

    args = list(wnode.args) + [None] * 8 if isinstance(wnode, torch.fx.Node) else []
    if _is(wnode, "torchao::dequantize_affine"):
        q, block, scales, zp = const(args[0]), args[1], const(args[2]), args[3]
        qmin, qmax = args[5], args[6]
        if zp is not None:
            zp = const(zp)
            if zp is None or bool((zp != 0).any()):
                return None
        if q is None or scales is None or args[4] != torch.int8 or q.dim() != 2 \
                or list(block) != [1, g] or wnode.kwargs.get("output_dtype", torch.float32) != torch.float32:
            return None
        scales = scales.reshape(q.shape[0], -1)
    elif _is(wnode, "quantized_decomposed::dequantize_per_channel"):
        q, scales, zp = const(args[0]), const(args[1]), args[2]
        qmin, qmax = args[4], args[5]
        if zp is not None:
            zp = const(zp)
            if zp is None or bool((zp != 0).any()):
                return None
        if q is None or scales is None or args[3] != 0 or args[6] != torch.int8 or q.dim() != 2 \
                or g != q.shape[1] or wnode.kwargs.get("out_dtype") not in (None, torch.float32):
            return None
        scales = scales.reshape(-1, 1)
    else:
        return None
    if q.dtype != torch.int8 or scales.dtype != torch.float32 or q.shape[1] % g \
            or scales.shape != (q.shape[0], q.shape[1] // g) or not isinstance(qmin, int) \
            or not isinstance(qmax, int):
        return None
    bits = 4 if qmin >= -8 and qmax <= 7 and int(q.min()) >= -8 and int(q.max()) <= 7 else 8
    weight = IntWeight(q.contiguous(), scales.contiguous(), g, bits)
    folded_args = [consts.get(a.name) if isinstance(a, torch.fx.Node) else a for a in wnode.args]
    folded = wnode.target(*folded_args, **wnode.kwargs)
    return weight if weight.equals(folded) else None  # (row by row: no float copies)


def _linear_parts(node):
    """(xd, weight node, bias node or None) of a linear / addmm / mm node, else None."""
    if _is(node, "aten::linear") and len(node.args) >= 2:
        return node.args[0], node.args[1], node.args[2] if len(node.args) > 2 else None
    if _is(node, "aten::addmm") and len(node.args) == 3 and not node.kwargs:
        return node.args[1], _transposed(node.args[2]), node.args[0]
    if _is(node, "aten::mm") and len(node.args) == 2:
        return node.args[0], _transposed(node.args[1]), None
    return None


def find_int_dot(sub) -> dict[str, IntDot]:
    """Every linear of the pattern (module docstring), keyed by the name of each node it
    computes: the linear's own and its activation chain's."""
    found: dict[str, IntDot] = {}
    if not enabled():
        return found
    chains: dict[str, tuple] = {}
    for node in sub.graph_module.graph.nodes:
        parts = _linear_parts(node) if node.op == "call_function" else None
        if parts is None or not isinstance(parts[0], torch.fx.Node) or parts[1] is None:
            continue
        xd, wnode, bias = parts
        if xd.name not in chains:
            chains[xd.name] = _activation_chain(xd)
        chain = chains[xd.name]
        if chain is None:
            continue
        x, g, eps, nodes = chain
        if bias is not None and not (isinstance(bias, torch.fx.Node) and bias.op == "placeholder"
                                     and bias.name in sub.constants
                                     and sub.constants[bias.name].dim() == 1):
            continue
        weight = _weight(sub, wnode, g)
        if weight is None or weight.q.shape[1] != _val(x).shape[-1]:
            continue
        group = IntDot(x, node, weight, bias, eps)
        found[node.name] = group
        for n in nodes:
            found.setdefault(n.name, group)
    # a chain is fused only when every reader of its xd was taken (else xd is needed)
    for chain in chains.values():
        if chain is None:
            continue
        xd = chain[3][1]
        if not all(u.name in found and found[u.name].last is u for u in xd.users):
            for u in xd.users:
                if u.name in found and found[u.name].last is u:
                    del found[u.name]
            for n in chain[3]:
                found.pop(n.name, None)
    return found


def lower_int_dot(L: Lowering, dot: IntDot):
    """The linear's node: one ``int_dot_matmul`` over the rows of x."""
    from opforge.backends.cpu.lowering.matmul import _flat_rows

    ta = L.materialize(L.env[dot.x.name])
    sa = L.spec(ta)
    if sa.dtype != torch.float32:
        raise Unsupported("op", "int_dot_matmul: the activation is not float32")
    if len(sa.dims) < 2 or not same(sa.strides[-1], 1):
        ta = L.contiguous(ta)
        sa = L.spec(ta)
    flat = _flat_rows(sa) if len(sa.dims) >= 2 else None
    if flat is None:
        ta = L.contiguous(ta)
        sa = L.spec(ta)
        flat = _flat_rows(sa) if len(sa.dims) >= 2 else (1, sa.dims[0])
    rows, k = flat
    row_stride = sa.strides[-2] if len(sa.dims) >= 2 else k
    n = dot.weight.q.shape[0]
    fake = _val(dot.last)
    out = L.new_tensor(fake.dtype, fake.shape)
    packed, scales = pack(dot.weight)
    ins = [L.alias(ta, (rows, k), (row_stride, 1)), L.materialize(("c", packed)),
           L.materialize(("c", scales))]
    if dot.bias is not None:
        ins.append(L.materialize(("c", L.env[dot.bias.name][1].float().contiguous())))
    L.op("int_dot_matmul", ins, [L.alias(out, (rows, n), (n, 1))],
         [dot.weight.bits, dot.weight.group], [dot.eps],
         name=f"linear (int8 activations, int{dot.weight.bits} weights)")
    return ("t", out)


def _only_in_a_group(L, node, args, kwargs):
    raise Unsupported("op", f"{node.target}: the cpu backend runs it only as part of a linear "
                            "on dynamically quantized activations (lowering/int_dot.py)")


# the chain's torchao ops have no lowering of their own; registered so that a dynamic
# method's size check lets the group take them (core.Lowering._lower)
for _name in ("torchao::quantize_affine", "torchao::dequantize_affine"):
    LOWERINGS.setdefault(_name, _only_in_a_group)
SYMBOLIC_SIZES.add(_only_in_a_group)
