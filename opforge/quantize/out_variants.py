"""Registers the out overloads of the Q/DQ ops (``opforge.torch_bridge.quantized_ops``)."""

from opforge.torch_bridge.quantized_ops import ensure_registered

__all__ = ["ensure_registered"]
