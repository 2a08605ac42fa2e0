"""Dynamic int8 activations with int8 or int4 weights: ``8da8w`` and ``8da4w``.

What llama.cpp's Q8_0 and Q4_0 matmuls compute: every linear's activation row is quantized
at run time to int8 in blocks of ``g`` along K (``g`` = 32, or K when 32 does not divide
it), one float32 scale per block, and its weights are int8 (``8da8w``) or int4
(``8da4w``) in the same blocks along K, one scale per output channel and block. A backend
can then run each block as an integer dot product (``int_dot_matmul`` on the cpu backend)
and scale the block's int32 sum by ``scale_a · scale_w``.

Why blocks for the 8-bit weights too (not one scale per output channel): the weights and
the activations then share their blocks, so both schemes have one kernel and one epilogue
(per block, ``scale_a · scale_w`` times the integer sum) and Q8_0's accuracy (a block's
outlier costs only its block), at 4 bytes of scale per 32 weights.

No calibration: the activation scales are computed from the values themselves, so the
model is a module swap (``nn.Linear`` → :class:`DynamicQuantLinear`) that exports as it is.
In the exported program one linear reads, with ops every runtime already runs::

    s  = clamp(amax(abs(view(x, [..., K/g, g])), -1), min=EPS) / 127     # float32
    z  = zeros_like(s, dtype=int32)
    xq = torchao.quantize_affine(x, [1, .., g], s, z, int8, -127, 127)
    xd = torchao.dequantize_affine(xq, [1, .., g], s, z, int8, -127, 127)
    y  = linear(xd, torchao.dequantize_affine(q, [1, g], scales, None, int8, qmin, qmax), b)

``quantize_affine`` is ``clamp(round_half_even(x · float32(1 / s)), -127, 127)``. A block of
zeros gets scale EPS / 127 and integers 0. 4-bit weights are Q4_0's: per block the value
of largest magnitude ``m`` gives the scale ``m / -8`` (negative when ``m`` is positive), so
``m`` itself is -8 exactly and the rest round into [-8, 7].

>>> from opforge.quantize.dynamic import quantize_dynamic           # doctest: +SKIP
>>> model = quantize_dynamic(model, "8da4w")                         # doctest: +SKIP
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["DYNAMIC_SCHEMES", "DynamicQuantLinear", "QuantEmbedding", "quantize_dynamic", "block_of",
           "EPS"]

# scheme -> weight bits
DYNAMIC_SCHEMES: dict[str, int] = {"8da8w": 8, "8da4w": 4}

BLOCK = 32
EPS = 2.0 ** -64  # a float32 power of two: clamp compares against it exactly everywhere
_RANGE = {8: (-127, 127), 4: (-8, 7)}


def block_of(k: int, block: int = BLOCK) -> int:
    """The block along K: ``block`` where it divides K, else K (one block per row)."""
    return block if k % block == 0 else k


def _ops():
    import torchao.quantization.quant_primitives  # noqa: F401  defines torch.ops.torchao

    return torch.ops.torchao


def quantize_weight(w: torch.Tensor, bits: int, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(q int8 [N, K], scales float32 [N, K / group]) of a float weight [N, K], ``ROWS`` rows
    at a time (``_quantize_rows``: every step is per block, so the values are the whole
    weight's at once, with float temporaries of ``ROWS`` rows instead of the weight's size:
    a 1B decoder's output projection is 1 GB of float32). Kept above the modules at the
    size it had: the exported programs' debug tables name their source lines."""
    n, k = w.shape
    q = torch.empty(n, k, dtype=torch.int8)
    scales = torch.empty(n, k // group, dtype=torch.float32)
    for start in range(0, n, ROWS):
        rows = slice(start, min(start + ROWS, n))
        q[rows], scales[rows] = _quantize_rows(w[rows], bits, group)
    return q, scales


# rows of a weight quantized at a time: a 1B decoder's embedding (128256 x 2048) then
# makes float temporaries of 32 MB, not of its 1 GB (the module swap holds the model's
# float weights once; each of its own copies is a chunk's)
ROWS = 4096


class DynamicQuantLinear(nn.Module):
    """A linear whose activations are quantized at run time (module docstring)."""

    def __init__(self, linear: nn.Linear, bits: int, block: int = BLOCK) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.bits, self.group = bits, block_of(linear.in_features, block)
        q, scales = quantize_weight(linear.weight, bits, self.group)
        self.register_buffer("q", q)
        self.register_buffer("scales", scales)
        bias = None if linear.bias is None else linear.bias.detach().float().clone()
        self.register_buffer("bias", bias)

    def weight(self) -> torch.Tensor:
        qmin, qmax = _RANGE[self.bits]
        return _ops().dequantize_affine(self.q, [1, self.group], self.scales, None, torch.int8,
                                        qmin, qmax)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g, k = self.group, self.in_features
        block = [1] * (x.dim() - 1) + [g]
        s = x.reshape(*x.shape[:-1], k // g, g).abs().amax(-1).clamp(min=EPS) / 127
        zero = torch.zeros_like(s, dtype=torch.int32)  # torchao's quantize_affine needs one
        xq = _ops().quantize_affine(x, block, s, zero, torch.int8, -127, 127)
        xd = _ops().dequantize_affine(xq, block, s, zero, torch.int8, -127, 127)
        return F.linear(xd, self.weight(), self.bias)

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}, int{self.bits} weights, block {self.group}"


class QuantEmbedding(nn.Module):
    """An embedding table of integers in the scheme's weight blocks along a row (float
    rows out: what a gather needs, no activation to quantize)."""

    def __init__(self, embedding: nn.Embedding, bits: int, block: int = BLOCK) -> None:
        super().__init__()
        self.bits, self.group = bits, block_of(embedding.embedding_dim, block)
        q, scales = quantize_weight(embedding.weight, bits, self.group)
        self.register_buffer("q", q)
        self.register_buffer("scales", scales)

    def forward(self, indices: torch.Tensor) -> torch.Tensor:
        qmin, qmax = _RANGE[self.bits]
        table = _ops().dequantize_affine(self.q, [1, self.group], self.scales, None, torch.int8,
                                         qmin, qmax)
        return F.embedding(indices, table)


def quantize_dynamic(model: nn.Module, scheme: str, *, block: int = BLOCK,
                     skip=(), embedding: bool = True, inplace: bool = False) -> nn.Module:
    """``model`` with every ``nn.Linear`` (but those named in ``skip``) made a
    :class:`DynamicQuantLinear` of ``scheme`` (``8da8w`` or ``8da4w``), and with
    ``embedding`` every plain ``nn.Embedding`` a :class:`QuantEmbedding` of its weights'
    bits (as llama.cpp's Q8_0 / Q4_0 files hold the token embedding).

    ``inplace=False`` (the default) swaps the modules of a deep copy: ``model`` stays as
    it was, and its float weights stay in memory beside the copy's integers while the
    caller holds it. ``inplace=True`` swaps them in ``model`` itself and returns it: each
    float weight is let go as soon as its integers exist, so quantizing holds the float
    weights once (a 1B decoder: 6 GB of float32 weights, not 12); use it when the float
    model is not needed again (exporting it: ``opforge quantize`` does)."""
    if scheme not in DYNAMIC_SCHEMES:
        from opforge.quantize.schemes import QuantizeError

        raise QuantizeError(
            f"`opforge.quantize.dynamic.quantize_dynamic(scheme={scheme!r})`: scheme — unknown — "
            f"valid: {', '.join(DYNAMIC_SCHEMES)} — fix: pick one of them")
    bits = DYNAMIC_SCHEMES[scheme]
    if not inplace:
        model = copy.deepcopy(model)
    # names, not modules: a list of the float modules would hold every float weight until
    # the last swap
    swaps = [(name, child_name) for name, module in model.named_modules()
             for child_name, child in module.named_children()
             if (f"{name}.{child_name}" if name else child_name) not in skip
             and (type(child) is nn.Linear or (type(child) is nn.Embedding and embedding
                                               and child.max_norm is None))]
    for name, child_name in swaps:
        module = model.get_submodule(name)
        child = getattr(module, child_name)
        swapped = (DynamicQuantLinear if type(child) is nn.Linear else QuantEmbedding)(child, bits, block)
        del child
        setattr(module, child_name, swapped)
    return model


def _quantize_rows(w: torch.Tensor, bits: int, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    n, k = w.shape
    blocks = w.detach().float().reshape(n, k // group, group)
    if bits == 8:
        scales = blocks.abs().amax(-1).clamp(min=EPS) / 127
    else:  # Q4_0: the signed value of largest magnitude maps to -8
        idx = blocks.abs().argmax(-1, keepdim=True)
        m = blocks.gather(-1, idx).squeeze(-1)
        scales = torch.where(m == 0, torch.full_like(m, EPS), m) / -8
    # rounded to float16 values (as Q4_0 / Q8_0 store their scales) where float16 holds them as
    # normal numbers, before the integers are computed from them: a backend may store them in
    # 2 bytes (the cpu backend does: a decode step then reads 0.5625 bytes per 4-bit weight,
    # not 0.625); a scale float16 cannot hold (an all-zero block's EPS) stays float32
    half = scales.half().float()
    scales = torch.where(torch.isfinite(half) & (half.abs() >= 2.0 ** -14), half, scales)
    qmin, qmax = _RANGE[bits]
    q = torch.clamp(torch.round(blocks * (1.0 / scales)[..., None]), qmin, qmax)
    return q.to(torch.int8).reshape(n, k), scales.float()
