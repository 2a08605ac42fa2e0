"""Quantized workloads: a float workload quantized 8a8w with opforge's PT2E path.

A workload named ``<float workload>_8a8w`` (``resnet18_224_8a8w``) is the float model
quantized by ``opforge.quantize.quantize(model, inputs, "8a8w", calibration=...)`` on four
normal samples (seed 1, as ``bench/quantized.py`` does), so every process that builds it
gets the same scales. Each runtime runs what it would run for such a model:

- ``eager``: torchao's converted model (quantize/dequantize in float32 around float ops):
  the reference outputs the others are checked against;
- ``opforge-lean`` / ``opforge-cpu``: that converted model exported by opforge (the lean
  runtime runs Q/DQ exactly; the cpu backend runs int8 convolutions and linears);
- ``ort``: the float model exported to ONNX and quantized by ONNX Runtime's own
  ``quantize_static`` (QDQ format, uint8 activations, int8 per-channel weights: what 8a8w
  is) on the same four samples.

ORT calibrates its own scales and rounds differently, so its outputs are not torchao's to
float precision; ``BUDGET`` (in ``tolerance``) says how far they may be.

torch is imported inside the functions that build models: the orchestrator (bench/run.py)
imports this module for ``is_quantized`` and ``tolerance`` without it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

__all__ = ["QuantizedWorkload", "SCHEME_SUFFIX", "is_quantized", "quantized_workload",
           "tolerance"]

SCHEME_SUFFIX = "_8a8w"
CALIBRATION_SAMPLES = 4

# How far a runtime's outputs may be from the reference (eager running torchao's converted
# model): twice the distance quantization itself puts between that reference and the float
# model. Quantizing is a budget of error; a runtime that calibrates and rounds its own way
# (ONNX Runtime's quantize_static) spends it differently and lands elsewhere inside it,
# while a wrong scale, zero point or channel lands far outside it. opforge lean runs
# torchao's quantize/dequantize arithmetic, its float convolutions sum in another order
# than eager's, and the cpu backend rounds once in int8: each may move a value lying on a
# rounding boundary by one step, and such flips in early layers move the logits by a few
# steps after ~20 requantized layers (2 steps on ResNet-18 in the first runs), well
# inside the budget (10 steps there).
BUDGET = 2.0


@dataclass(frozen=True)
class QuantizedWorkload:
    name: str
    float_model: Any  # torch.nn.Module
    inputs: tuple     # of torch.Tensor
    calibration: list  # of input tuples
    converted: Any    # torchao's converted GraphModule (Q/DQ ops around float ops)
    quantized: Any    # the opforge.quantize.QuantizedModel


def is_quantized(name: str) -> bool:
    return name.endswith(SCHEME_SUFFIX)


@functools.cache
def quantized_workload(name: str) -> QuantizedWorkload:
    """Build ``name``'s float workload and quantize it (cached: one quantization per process)."""
    import logging
    import warnings

    import torch

    from opforge.quantize import quantize
    from workloads import workload

    model, inputs = workload(name[: -len(SCHEME_SUFFIX)])
    gen = torch.Generator().manual_seed(1)
    calibration = [tuple(torch.randn(x.shape, generator=gen) if x.is_floating_point() else x
                         for x in inputs) for _ in range(CALIBRATION_SAMPLES)]
    logging.getLogger("torchao").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = quantize(model, inputs, "8a8w", calibration=calibration)
    return QuantizedWorkload(name, model, inputs, calibration, result.model, result)


def factory(name: str):
    """The workload factory of ``name``: the converted model and the float inputs."""
    def build() -> tuple:
        q = quantized_workload(name)
        return q.converted, q.inputs
    return build


def tolerance(reference: list, float_reference: list) -> float:
    """The max abs error a runtime may show on a quantized workload: ``BUDGET`` times the
    largest difference between the reference outputs (eager on the converted model) and
    the float model's outputs (NumPy arrays, in output order)."""
    return BUDGET * max(float(abs(r.astype("float64") - f.astype("float64")).max())
                        for r, f in zip(reference, float_reference) if r.size)
