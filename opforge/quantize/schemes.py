"""Quantization schemes and configs: what ``"16a8w"`` means as torchao quantization specs.

A scheme fixes the integer types of activations and weights (ExecuTorch's Qualcomm names):

======== ================================== =========================================
scheme   activations                        weights (conv / linear)
======== ================================== =========================================
8a8w     uint8 [0, 255] (int8 if symmetric) int8 [-127, 127], per channel by default
16a16w   int32 storage, [0, 65535]          int16 [-32767, 32767], per channel
16a8w    int32 storage, [0, 65535]          int8 [-127, 127], per channel
16a4w    int32 storage, [0, 65535]          int8 storage, [-7, 7], per channel
16a4w_block  int32 storage, [0, 65535]      int8 storage, [-7, 7], per block (block-size map)
8a4w     uint8 [0, 255]                     int8 storage, [-7, 7], per channel
w8       float (not quantized)              int8 [-127, 127], per channel
w8_block float (not quantized)              int8 [-127, 127], per block of 32 along K
w4       float (not quantized)              int8 storage, [-7, 7], per block of 32 along K
======== ================================== =========================================

The weight-only schemes (``w8``, ``w8_block``, ``w4``; float activations) are what
llama.cpp's Q8_0 / Q4_0 and torchao's ``Int8WeightOnlyConfig`` / ``Int4WeightOnlyConfig``
mean: only weights (linear, convolution, embedding tables) are quantized, so nothing is
observed and no calibration data is needed. ``QuantConfig.group_size`` picks the block
along the input channels (K) of a block-wise scheme: 32 (``w4``'s default, as Q4_0), 64,
128. An embedding table under a 4-bit scheme stays 8-bit per row (``Scheme.table_scheme``).

Weights are always symmetric (zero point 0), so a backend can use integer matmuls without
a zero-point correction on the weight side. 16-bit activations use int32 storage because
``quantized_decomposed`` works on it (uint16 is not one of its dtypes); the values stay
within 16 bits. Biases stay float32: the dequantized product needs no integer bias, and a
backend that lowers to integer kernels derives an int32 bias (scale ``s_in * s_w``) itself.

Example::

    >>> cfg = QuantConfig("16a8w")
    >>> cfg.activation_bits, cfg.weight_bits
    (16, 8)
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

from opforge.errors import OpforgeError

__all__ = ["SCHEMES", "Scheme", "QuantConfig", "QuantizeError", "OBSERVERS", "default_headroom"]


class QuantizeError(OpforgeError, ValueError):
    """A user error in a quantization request (scheme, config, contract or data)."""


@dataclass(frozen=True)
class Scheme:
    """What a scheme name means.

    ``activations``: ``"static"`` (ranges observed on calibration data, fixed in the
    program), ``"float"`` (activations not quantized: weight-only; ``activation_bits`` is
    None) or ``"dynamic"`` (ranges measured on each call). ``block_wise``: weights per block
    along the input channels, ``group_size`` the default block (None: the largest of
    128/64/32/16/8 dividing K). ``table_scheme``: the scheme of an embedding table (None:
    this one); 4-bit schemes keep 8-bit tables (a looked-up row is used as is, no sum over
    many weights averages its error out: 4-bit tables cost gpt_decoder ~5 dB).
    """

    activation_bits: int | None
    weight_bits: int
    block_wise: bool = False
    activations: str = "static"
    group_size: int | None = None
    table_scheme: str | None = None

    def __post_init__(self) -> None:
        assert self.activations in ("static", "float", "dynamic"), self.activations
        assert (self.activation_bits is None) == (self.activations == "float"), self


SCHEMES: dict[str, Scheme] = {
    "8a8w": Scheme(8, 8),
    "16a16w": Scheme(16, 16),
    "16a8w": Scheme(16, 8),
    "16a4w": Scheme(16, 4, table_scheme="16a8w"),
    "16a4w_block": Scheme(16, 4, block_wise=True, table_scheme="16a8w"),
    "8a4w": Scheme(8, 4, table_scheme="8a8w"),
    "w8": Scheme(None, 8, activations="float"),
    "w8_block": Scheme(None, 8, block_wise=True, activations="float", group_size=32),
    "w4": Scheme(None, 4, block_wise=True, activations="float", group_size=32, table_scheme="w8"),
}

# name -> how activations are observed during calibration (PTQ)
OBSERVERS = ("minmax", "moving_average", "histogram")


def default_headroom(activation_bits: int | None) -> float:
    """How much wider than the calibration's range an activation's integer range is.

    An observer's range is what the calibration samples showed; other inputs go past it
    (a token the samples did not hold, another context), and past it values clip: the
    error is the whole excess, not a rounding step. On the bundled decoder, held-out
    prompts went up to 1.25x past the calibrated bounds, and the clipping cost 16a16w 25 dB
    at 1 layer and 27 dB at 8 (docs/quantization.md, "Decoders"). A 16-bit range has
    65,536 steps: widening it 1.5x costs 3.5 dB of rounding noise (from ~90 dB per tensor)
    and holds excursions up to 1.5x; 2x cost 2.2 dB more on every prompt, and saved one
    prompt in 15 at 8 layers (a SwiGLU product 1.69x past its bound: 37.8 dB at 1.5x). An 8-bit
    range has 256 steps, and its rounding noise is already the larger error: widening it
    costs as much as the clipping it saves, so 8-bit ranges stay as observed.
    """
    return 1.5 if activation_bits is not None and activation_bits >= 16 else 1.0


def _check_scheme(scheme: str) -> None:
    if scheme not in SCHEMES:
        raise QuantizeError(
            f"`opforge.quantize.QuantConfig(scheme={scheme!r})`: scheme — unknown — "
            f"valid: {', '.join(SCHEMES)} — fix: pick one of them (e.g. '8a8w')"
        )


@dataclass(frozen=True)
class QuantConfig:
    """How one part of a model is quantized.

    ``scheme`` is one of :data:`SCHEMES`. ``per_channel_conv`` / ``per_channel_linear``
    give each output channel of a convolution / linear weight its own scale (default on:
    per-tensor 8-bit weights lose 5-15 dB on the zoo models). ``act_symmetric`` makes
    activations symmetric (zero point 0, signed storage). ``act_observer`` is one of
    :data:`OBSERVERS` or an observer class (``torchao.quantization.pt2e`` observers).
    ``is_qat`` inserts fake-quantize modules instead of observers (train, then convert).
    ``block_size`` is the default block of block-wise weights (``16a4w_block``), e.g.
    ``(1, 32)`` for a linear weight or ``(1, 32, 1, 1)`` for a convolution's;
    ``Quantizer.set_block_size_map`` overrides it per node. ``act_headroom`` widens every
    observed activation range by that factor (zero stays where it was): ``None`` means 1.5
    for 16-bit activations and 1 for 8-bit ones (see :func:`default_headroom`).
    ``group_size`` is the block along the input channels of a block-wise scheme's weights
    (``w4``, ``w8_block``, ``16a4w_block``): 32, 64, 128... dividing K; None: the scheme's
    default. A group size that does not divide a weight's input channels is refused.
    """

    scheme: str = "8a8w"
    per_channel_conv: bool = True
    per_channel_linear: bool = True
    act_symmetric: bool = False
    act_observer: str | Callable = "minmax"
    is_qat: bool = False
    block_size: tuple[int, ...] | None = None
    eps: float = 2**-20
    act_headroom: float | None = None
    group_size: int | None = None

    def __post_init__(self) -> None:
        _check_scheme(self.scheme)
        self._check_group_size()
        if self.act_headroom is not None and not self.act_headroom >= 1.0:
            raise QuantizeError(
                f"`opforge.quantize.QuantConfig(act_headroom={self.act_headroom!r})`: headroom — "
                "below 1 — valid: a factor >= 1 (1: the observed range as it is) or None (the "
                "scheme's default) — fix: pass e.g. 2.0, or leave it out")
        if isinstance(self.act_observer, str) and self.act_observer not in OBSERVERS:
            raise QuantizeError(
                f"`opforge.quantize.QuantConfig(act_observer={self.act_observer!r})`: observer — "
                f"unknown — valid: {', '.join(OBSERVERS)} or an observer class — fix: pick one"
            )
        if self.block_size is not None:
            object.__setattr__(self, "block_size", tuple(int(b) for b in self.block_size))

    def _check_group_size(self) -> None:
        if self.group_size is None:
            return
        api = f"`opforge.quantize.QuantConfig(scheme={self.scheme!r}, group_size={self.group_size!r})`"
        if not SCHEMES[self.scheme].block_wise:
            block_wise = ", ".join(n for n, s in SCHEMES.items() if s.block_wise)
            raise QuantizeError(
                f"{api}: group size — given for a per-channel scheme — valid: a group size "
                f"only with a block-wise scheme ({block_wise}) — fix: leave group_size out, "
                "or pick a block-wise scheme (e.g. 'w4')")
        if isinstance(self.group_size, bool) or not isinstance(self.group_size, int) or self.group_size < 1:
            raise QuantizeError(
                f"{api}: group size — not a positive integer — valid: e.g. 32, 64 or 128 "
                "(dividing the weights' input channels) — fix: pass one of them")
        if self.block_size is not None:
            raise QuantizeError(
                f"{api}: group size — given with block_size={self.block_size!r} — valid: one of "
                "the two (group_size g means block (1, g) along the input channels) — fix: "
                "drop one")

    @property
    def spec(self) -> Scheme:
        """The :class:`Scheme` named by ``scheme``."""
        return SCHEMES[self.scheme]

    @property
    def activation_bits(self) -> int | None:
        """Activation bits; None when activations stay float (weight-only schemes)."""
        return SCHEMES[self.scheme].activation_bits

    @property
    def weight_bits(self) -> int:
        return SCHEMES[self.scheme].weight_bits

    @property
    def block_wise(self) -> bool:
        return SCHEMES[self.scheme].block_wise

    @property
    def needs_calibration(self) -> bool:
        """True when activation ranges are observed (static schemes): weight-only and
        dynamic schemes quantize without calibration data."""
        return SCHEMES[self.scheme].activations == "static"

    @property
    def weight_group_size(self) -> int | None:
        """The block along the input channels of block-wise weights: ``group_size`` or the
        scheme's default (None: the largest of 128/64/32/16/8 dividing K)."""
        return self.group_size if self.group_size is not None else SCHEMES[self.scheme].group_size

    @property
    def headroom(self) -> float:
        """The factor observed activation ranges are widened by (``act_headroom`` or the
        scheme's default)."""
        return default_headroom(self.activation_bits) if self.act_headroom is None else self.act_headroom

    def with_(self, **changes: Any) -> "QuantConfig":
        """A copy with ``changes`` (``cfg.with_(scheme="16a8w")``)."""
        return replace(self, **changes)
