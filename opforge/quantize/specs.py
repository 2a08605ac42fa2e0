"""A :class:`QuantConfig` → torchao ``QuantizationSpec`` objects (activations, weights).

Observers for PTQ, fake-quantize modules for QAT; per-channel weights observe axis 0 (the
output channels of ``conv`` / ``linear`` weights), block-wise weights use torchao's affine
observer with a ``PerBlock`` granularity and become ``torchao::dequantize_affine`` nodes.
"""

from __future__ import annotations

import torch
from torchao.quantization.pt2e import (
    FakeQuantize, HistogramObserver, MinMaxObserver, MovingAverageMinMaxObserver,
    MovingAveragePerChannelMinMaxObserver, PerBlock, PerChannelMinMaxObserver,
)
from torchao.quantization.pt2e._affine_quantization import AffineQuantizedMinMaxObserver
from torchao.quantization.pt2e.quantizer import QuantizationSpec
from torchao.quantization.quant_primitives import MappingType

from opforge.quantize.schemes import QuantConfig

__all__ = ["activation_spec", "weight_spec", "activation_range", "weight_range"]

_ACT_OBSERVERS = {
    "minmax": MinMaxObserver,
    "moving_average": MovingAverageMinMaxObserver,
    "histogram": HistogramObserver,
}


def _widened(observer: type, factor: float) -> type:
    """``observer`` whose qparams cover ``factor`` times the observed range (both bounds
    scaled, so real 0 keeps its integer; ``schemes.default_headroom`` says why)."""
    if factor == 1.0:
        return observer
    key = (observer, factor)
    if key not in _WIDENED:
        def _calculate_qparams(self, min_val, max_val):
            return super(cls, self)._calculate_qparams(min_val * factor, max_val * factor)

        cls = type(f"{observer.__name__}Headroom{factor:g}", (observer,),
                   {"_calculate_qparams": _calculate_qparams, "headroom": factor,
                    "__module__": __name__})
        _WIDENED[key] = cls
    return _WIDENED[key]


_WIDENED: dict[tuple[type, float], type] = {}


def activation_range(cfg: QuantConfig) -> tuple[torch.dtype, int, int]:
    """(storage dtype, quant_min, quant_max) of the activations of ``cfg``."""
    if cfg.activation_bits == 8:
        return (torch.int8, -128, 127) if cfg.act_symmetric else (torch.uint8, 0, 255)
    return (torch.int32, -32768, 32767) if cfg.act_symmetric else (torch.int32, 0, 65535)


def weight_range(cfg: QuantConfig) -> tuple[torch.dtype, int, int]:
    """(storage dtype, quant_min, quant_max) of the weights of ``cfg`` (symmetric)."""
    bits = cfg.weight_bits
    if bits == 16:
        return torch.int16, -32767, 32767
    if bits == 8:
        return torch.int8, -127, 127
    return torch.int8, -7, 7


def activation_spec(cfg: QuantConfig) -> QuantizationSpec | None:
    """The activation spec of ``cfg``; None when activations stay float (weight-only)."""
    if cfg.activation_bits is None:
        return None
    dtype, qmin, qmax = activation_range(cfg)
    qscheme = torch.per_tensor_symmetric if cfg.act_symmetric else torch.per_tensor_affine
    observer = cfg.act_observer
    if isinstance(observer, str):
        observer = _ACT_OBSERVERS[observer]
    if cfg.is_qat and observer is MinMaxObserver:  # QAT tracks a moving range while the weights move
        observer = MovingAverageMinMaxObserver
    observer = _widened(observer, cfg.headroom)
    if cfg.is_qat:
        ctr = FakeQuantize.with_args(observer=observer, quant_min=qmin, quant_max=qmax,
                                     dtype=dtype, qscheme=qscheme, eps=cfg.eps)
    else:
        ctr = observer.with_args(eps=cfg.eps)
    return QuantizationSpec(dtype=dtype, quant_min=qmin, quant_max=qmax, qscheme=qscheme,
                            is_dynamic=False, observer_or_fake_quant_ctr=ctr)


def weight_spec(cfg: QuantConfig, per_channel: bool,
                block_size: tuple[int, ...] | None = None) -> QuantizationSpec:
    """The weight spec: per block when ``block_size`` is given, else per channel (axis 0)
    or per tensor."""
    dtype, qmin, qmax = weight_range(cfg)
    if block_size is not None:
        ctr = AffineQuantizedMinMaxObserver.with_args(
            mapping_type=MappingType.SYMMETRIC, target_dtype=dtype,
            granularity=PerBlock(tuple(block_size)), quant_min=qmin, quant_max=qmax,
            eps=cfg.eps, scale_dtype=torch.float32, zero_point_dtype=torch.int32,
        )
        return QuantizationSpec(dtype=dtype, quant_min=qmin, quant_max=qmax,
                                qscheme=None, observer_or_fake_quant_ctr=ctr)
    if per_channel:
        qscheme, observer = torch.per_channel_symmetric, PerChannelMinMaxObserver
        if cfg.is_qat:
            ctr = FakeQuantize.with_args(observer=MovingAveragePerChannelMinMaxObserver,
                                         quant_min=qmin, quant_max=qmax, dtype=dtype,
                                         qscheme=qscheme, ch_axis=0, eps=cfg.eps)
        else:
            ctr = observer.with_args(eps=cfg.eps)
        return QuantizationSpec(dtype=dtype, quant_min=qmin, quant_max=qmax, qscheme=qscheme,
                                ch_axis=0, observer_or_fake_quant_ctr=ctr)
    qscheme = torch.per_tensor_symmetric
    if cfg.is_qat:
        ctr = FakeQuantize.with_args(observer=MovingAverageMinMaxObserver, quant_min=qmin,
                                     quant_max=qmax, dtype=dtype, qscheme=qscheme, eps=cfg.eps)
    else:
        ctr = MinMaxObserver.with_args(eps=cfg.eps)
    return QuantizationSpec(dtype=dtype, quant_min=qmin, quant_max=qmax, qscheme=qscheme,
                            observer_or_fake_quant_ctr=ctr)
