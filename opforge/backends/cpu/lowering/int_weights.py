"""Linear layers and embeddings whose weights are integers dequantized per channel or per
block: the engine's ``int_matmul`` reads the integers packed (int8, or two int4 a byte)
and dequantizes them in registers, and ``int_embedding`` gathers rows of the integer table
and dequantizes them as it copies, instead of the weights being folded to float32 at export.

Taken: ``aten.linear(x, dequantize(q, ...), bias?)`` where the dequantize is
``quantized_decomposed.dequantize_per_channel`` (axis 0, zero zero points) or
``torchao.dequantize_affine`` (block ``(1, g)``, zero zero points) of a constant int8
``q`` of shape [N, K], bits 4 when every value (and the declared range) lies in [-8, 7],
else 8. The weights are what 16a8w, 16a4w, 16a4w_block, 8a4w and their weight-only forms
(``opforge.quantize.weights_only``) produce. The activation is whatever float32 the graph
gives the linear; when that is a 16-bit scheme's dequantized activation (a quantize-dequantize
per tensor of at most 2^16 steps, ``activation_grid`` in lowering/quantized.py) and the
weights are 4-bit in blocks of at most 4096, the op also gets ``fa [scale]``: the engine may
then take each row as int16 integers, exactly, and sum the blocks in int32 with AVX512-VNNI
(native/int_matmul16.cpp: the weight-only program's float path elsewhere).
``OPFORGE_CPU_INT16_ACTIVATIONS=0`` at export passes no grid.
``aten.embedding(dequantize(q), indices)`` with the same dequantizes (per row, or blocks
along a row) is taken likewise.

Exactness guard: the engine dequantizes each weight as float32(q) · scale, one rounding;
the lowering takes a weight only when that product reproduces, bit for bit, the float32
weight the export folded from the same dequantize (so a scale stored in float64, or a
dequantize computed another way, keeps the folded float path). The engine's sums then
differ from the lean runtime's only in their order (native/int_matmul.cpp says the bound).

``OPFORGE_CPU_INT_WEIGHTS=0`` at export keeps every such weight folded to float32 (the
path before this lowering: the A/B of ``bench/int_weights.py``).

Layout written into the blob (``int_matmul``'s contract): weights as panels of 16 output
columns, [P, K, 16] int8 or [P, ceil(K/2), 16] uint8 with q[2i] + 8 in the low nibble and
q[2i + 1] + 8 in the high one; scales [P, ceil(K/g), 16] float32; P = ceil(N/16), padding
columns zero.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.fx

from opforge.backends.cpu.lowering.core import Lowering, _val, same
from opforge.backends.cpu.lowering.quantized import activation_grid

LANES = 16


@dataclass(frozen=True)
class IntWeight:
    """A linear weight as integers: ``q`` int8 [N, K], ``scales`` float32 [N, G] (one per
    block of ``group`` along K; G = ceil(K / group)), ``bits`` 4 or 8."""

    q: torch.Tensor
    scales: torch.Tensor
    group: int
    bits: int

    def __post_init__(self) -> None:
        n, k = self.q.shape
        if self.scales.shape != (n, -(-k // self.group)) or self.bits not in (4, 8):
            raise ValueError("IntWeight: scales do not match q's blocks, or bits not 4/8")

    def dequantized(self) -> torch.Tensor:
        """float32(q) · scale, per element: what the engine computes in registers."""
        s = self.scales.repeat_interleave(self.group, dim=1)[:, :self.q.shape[1]]
        return self.q.float() * s

    def equals(self, folded: torch.Tensor, rows: int = 1024) -> bool:
        """``torch.equal(self.dequantized(), folded)``, ``rows`` rows at a time: the float
        temporaries of a few rows, not three of the whole weight's size."""
        if folded.shape != self.q.shape or folded.dtype != torch.float32:
            return False
        n, k = self.q.shape
        for start in range(0, n, rows):
            part = IntWeight(self.q[start:start + rows], self.scales[start:start + rows],
                             self.group, self.bits)
            if not torch.equal(part.dequantized(), folded[start:start + rows]):
                return False
        return True

    def packed(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights, scales) in the panel layout of the module docstring."""
        n, k = self.q.shape
        panels = -(-n // LANES)
        q = torch.zeros(panels * LANES, k, dtype=torch.int16)
        q[:n] = self.q.to(torch.int16)
        q = q.reshape(panels, LANES, k).permute(0, 2, 1)  # [P, K, 16]
        if self.bits == 8:
            weights = q.to(torch.int8).contiguous()
        else:
            nib = q + 8
            if k % 2:
                nib = torch.cat([nib, torch.full((panels, 1, LANES), 8, dtype=torch.int16)], 1)
            weights = (nib[:, 0::2, :] | (nib[:, 1::2, :] << 4)).to(torch.uint8).contiguous()
        s = torch.zeros(panels * LANES, self.scales.shape[1], dtype=torch.float32)
        s[:n] = self.scales
        scales = s.reshape(panels, LANES, -1).permute(0, 2, 1).contiguous()  # [P, G, 16]
        return weights, scales

    def rows_packed(self) -> torch.Tensor:
        """q as an embedding table: int8 [N, K], or uint8 [N, ceil(K/2)] with q[:, 2i] + 8
        in the low nibble and q[:, 2i + 1] + 8 in the high one."""
        if self.bits == 8:
            return self.q
        nib = self.q.to(torch.int16) + 8
        if nib.shape[1] % 2:
            nib = torch.cat([nib, torch.full((nib.shape[0], 1), 8, dtype=torch.int16)], 1)
        return (nib[:, 0::2] | (nib[:, 1::2] << 4)).to(torch.uint8).contiguous()


INT16_MAX_GROUP = 4096  # int_matmul's int16 mode: a block's int32 sum cannot overflow


def enabled() -> bool:
    return os.environ.get("OPFORGE_CPU_INT_WEIGHTS", "1") != "0"


def int16_enabled() -> bool:
    """``OPFORGE_CPU_INT16_ACTIVATIONS=0`` at export: no ``int_matmul`` gets its activations'
    grid (the float path everywhere: the A/B of bench/int_weights.py and the tests)."""
    return os.environ.get("OPFORGE_CPU_INT16_ACTIVATIONS", "1") != "0"


def _is(node, name: str) -> bool:
    if not isinstance(node, torch.fx.Node) or node.op != "call_function":
        return False
    schema = getattr(node.target, "_schema", None)
    return schema is not None and schema.name == name


def _constant(L: Lowering, value):
    entry = L.env.get(value.name) if isinstance(value, torch.fx.Node) else None
    if isinstance(entry, tuple) and len(entry) == 2 and entry[0] == "c":
        return entry[1]
    return None


def _zero(zp) -> bool:
    return zp is None or (isinstance(zp, torch.Tensor) and not bool((zp != 0).any())) \
        or (isinstance(zp, (int, float)) and zp == 0)


def match(L: Lowering, node) -> IntWeight | None:
    """The integer weight a dequantize node computes, when the engine may read it so."""
    if not enabled():
        return None
    fake = _val(node)
    if not isinstance(fake, torch.Tensor) or fake.dtype != torch.float32 or fake.dim() != 2:
        return None
    if _is(node, "quantized_decomposed::dequantize_per_channel"):
        args = list(node.args) + [None] * 7
        q, scales, zps = (_constant(L, a) for a in args[:3])
        axis, qmin, qmax, dtype = args[3:7]
        if axis != 0 or dtype != torch.int8 or q is None or scales is None \
                or node.kwargs.get("out_dtype") not in (None, torch.float32) \
                or not (_zero(zps) if args[2] is not None else True):
            return None
        scales = scales.reshape(-1, 1)
        group = q.shape[1] if q.dim() == 2 else 0
    elif _is(node, "torchao::dequantize_affine"):
        args = list(node.args) + [None] * 7
        q, block, scales = _constant(L, args[0]), args[1], _constant(L, args[2])
        zps, dtype, qmin, qmax = args[3], args[4], args[5], args[6]
        zps = _constant(L, zps) if isinstance(zps, torch.fx.Node) else zps
        if q is None or scales is None or dtype != torch.int8 or not _zero(zps) \
                or node.kwargs.get("output_dtype", torch.float32) != torch.float32 \
                or q.dim() != 2 or len(block) != 2 or block[0] != 1:
            return None
        group = int(block[1])
        scales = scales.reshape(q.shape[0], -1)
    else:
        return None
    if q.dtype != torch.int8 or q.dim() != 2 or group < 1 or min(q.shape) < 1:
        return None
    if not isinstance(qmin, int) or not isinstance(qmax, int):
        return None
    bits = 4 if qmin >= -8 and qmax <= 7 and int(q.min()) >= -8 and int(q.max()) <= 7 else 8
    if bits == 4 and group % 2 and group != q.shape[1]:
        return None
    if scales.dtype != torch.float32 or scales.shape[1] != -(-q.shape[1] // group):
        return None
    weight = IntWeight(q.contiguous(), scales.contiguous(), group, bits)
    folded = _constant(L, node)
    if folded is None or not weight.equals(folded):
        return None  # the exactness guard (module docstring)
    return weight


def _transposed(node):
    """The node a ``permute(·, [1, 0])`` or ``t`` node reads, else None."""
    if _is(node, "aten::t") or (_is(node, "aten::permute") and list(node.args[1]) == [1, 0]):
        return node.args[0]
    return None


def lower_linear(L: Lowering, node, name: str, args) -> tuple | None:
    """``linear(x, w, bias)``, ``addmm(bias, x, wᵀ)`` or ``mm(x, wᵀ)`` (what export makes
    of a linear) on an integer weight ``w`` as one ``int_matmul``; None: not taken (the
    caller checked addmm's alpha and beta are 1)."""
    from opforge.backends.cpu.lowering.matmul import _flat_rows

    if name == "aten::linear" and len(node.args) > 1:
        x, xnode, wnode, bias = args[0], node.args[0], node.args[1], args[2] if len(args) > 2 else None
    elif name == "aten::addmm" and len(node.args) >= 3:
        x, xnode, wnode, bias = args[1], node.args[1], _transposed(node.args[2]), args[0]
    elif name == "aten::mm" and len(node.args) == 2:
        x, xnode, wnode, bias = args[0], node.args[0], _transposed(node.args[1]), None
    else:
        return None
    weight = match(L, wnode) if wnode is not None else None
    if weight is None:
        return None
    if bias is not None and not (isinstance(bias, tuple) and bias[0] == "c" and bias[1].dim() == 1):
        return None
    ta = L.materialize(x)
    sa = L.spec(ta)
    if len(sa.dims) < 2 or sa.dtype != torch.float32:
        return None
    if not same(sa.strides[-1], 1):
        ta = L.contiguous(ta)
        sa = L.spec(ta)
    flat = _flat_rows(sa)
    if flat is None:
        ta = L.contiguous(ta)
        sa = L.spec(ta)
        flat = _flat_rows(sa)
    rows, k = flat
    n = weight.q.shape[0]
    fake = _val(node)
    out = L.new_tensor(fake.dtype, fake.shape)
    packed, scales = weight.packed()
    ins = [L.alias(ta, (rows, k), (sa.strides[-2], 1)), L.materialize(("c", packed)),
           L.materialize(("c", scales))]
    if bias is not None:
        ins.append(L.materialize(("c", bias[1].float().contiguous())))
    # activations on a 16-bit grid (a 16a4w/16a4w_block linear): the engine may sum them as
    # int16 integers against the 4-bit weights (int_matmul16.cpp; it decides by the CPU)
    grid = activation_grid(xnode) if weight.bits == 4 and weight.group <= INT16_MAX_GROUP \
        and int16_enabled() else None
    L.op("int_matmul", ins, [L.alias(out, (rows, n), (n, 1))], [weight.bits, weight.group],
         [grid] if grid is not None else [],
         name=f"linear (int{weight.bits} weights{', int16 activations' if grid else ''})")
    return ("t", out)


def lower_embedding(L: Lowering, node, indices) -> tuple | None:
    """``aten.embedding(dequantize(q), indices)`` as one ``int_embedding`` (rows gathered
    from the integer table and dequantized as copied); None: not taken."""
    weight = match(L, node.args[0])
    if weight is None:
        return None
    ix = L.contiguous(L.materialize(indices))
    if L.spec(ix).dtype not in (torch.int64, torch.int32):
        return None
    fake = _val(node)
    out = L.new_tensor(fake.dtype, fake.shape)
    ins = [L.materialize(("c", weight.rows_packed())), L.materialize(("c", weight.scales)), ix]
    L.op("int_embedding", ins, [out], [weight.bits, weight.group, weight.q.shape[1]],
         name=f"embedding (int{weight.bits} weights)")
    return ("t", out)
