"""The default annotation: which node gets which quantization spec.

Every call to a floating-point operator is quantized around: its non-constant float tensor
inputs get the activation spec and its output gets one too, so the converted graph reads
``dequantize → op → quantize`` everywhere, the pattern a backend partitioner lowers. Three
groups differ:

* weighted ops (``conv*``, ``linear``): argument 1, a constant, gets the weight spec (per
  channel, per tensor or per block); the bias stays float; an ``embedding`` table gets the
  weight spec too (one scale per row);
* value-preserving ops (reshapes, permutes, max pooling, ``split``, ``repeat_interleave``...):
  the output shares the qparams of the input, so no requantization happens between them;
  so does a write into a buffer (``index_copy_`` / ``index_put_`` into a KV cache) with the
  values it writes;
* custom ops: their manifest contract (``contracts.py``); without one they stay float.

Each decision is recorded (:class:`Decision`) for the quantization report.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass

import torch
import torch.fx
from torchao.quantization.pt2e.quantizer import QuantizationAnnotation, SharedQuantizationSpec

__all__ = ["Decision", "WEIGHTED", "PASSTHROUGH", "CACHE_WRITES", "is_float_tensor", "float_output",
           "annotate_default_node", "ANNOTATION_KEY"]

ANNOTATION_KEY = "quantization_annotation"

_aten = torch.ops.aten
WEIGHTED = {
    _aten.conv1d.default: "conv", _aten.conv2d.default: "conv", _aten.conv3d.default: "conv",
    _aten.linear.default: "linear",
}
# outputs whose values are a subset / rearrangement of the input's: qparams carry over
PASSTHROUGH = {
    _aten.view.default, _aten.reshape.default, _aten.flatten.using_ints, _aten.permute.default,
    _aten.transpose.int, _aten.squeeze.dim, _aten.squeeze.default, _aten.unsqueeze.default,
    _aten.unflatten.int, _aten.contiguous.default, _aten.clone.default, _aten.select.int,
    _aten.slice.Tensor, _aten.expand.default, _aten.max_pool2d.default, _aten.max_pool1d.default,
    _aten.split.Tensor, _aten.chunk.default, _aten.dropout.default, _aten.alias.default,
    _aten.t.default, _aten.repeat_interleave.self_int,
}
# writes into a buffer (a KV cache): the output holds what earlier calls wrote with the same
# qparams and the new values, so it shares the new values' qparams (no requantization
# between a key or value and the cache that keeps it)
CACHE_WRITES = {_aten.index_copy_.default, _aten.index_copy.default, _aten.index_put_.default,
                _aten.index_put.default}
# never quantized around: not a numeric tensor computation
_SKIP = {operator.getitem, _aten.arange.default, _aten.arange.start, _aten.sym_size.int}


@dataclass(frozen=True)
class Decision:
    """What the quantizer did with one node: ``scheme`` (``"float"`` if none) and why."""

    node: str
    op: str
    scheme: str
    detail: str


def is_float_tensor(value: object) -> bool:
    return isinstance(value, torch.Tensor) and value.is_floating_point()


def float_output(node: torch.fx.Node) -> bool | None:
    """True: one float tensor; False: not float; None: a tuple of float tensors."""
    val = node.meta.get("val")
    if is_float_tensor(val):
        return True
    if isinstance(val, (tuple, list)) and val and all(is_float_tensor(v) for v in val):
        return None
    return False


def is_constant(node: object) -> bool:
    return isinstance(node, torch.fx.Node) and node.op == "get_attr"


def unbounded_output(node: torch.fx.Node) -> bool:
    """True for a node whose output holds ±inf by design (an attention mask filled with
    ``-inf``): no integer range can hold it, so it stays float and so do its uses."""
    if node.op != "call_function" or node.target not in (
            _aten.masked_fill.Scalar, _aten.full.default, _aten.full_like.default):
        return False
    fill = node.args[2] if node.target == _aten.masked_fill.Scalar else node.args[1]
    return isinstance(fill, (int, float)) and not math.isfinite(fill)


def _float_inputs(node: torch.fx.Node) -> list[torch.fx.Node]:
    seen: list[torch.fx.Node] = []
    for arg in node.all_input_nodes:
        if (arg not in seen and not is_constant(arg) and is_float_tensor(arg.meta.get("val"))
                and not unbounded_output(arg)):
            seen.append(arg)
    return seen


_BATCH_NORM = {_aten.batch_norm.default, _aten._native_batch_norm_legit_no_training.default,
               _aten._native_batch_norm_legit.default, _aten.cudnn_batch_norm.default}


def _feeds_batch_norm(node: torch.fx.Node) -> bool:
    """A convolution whose only use is a batch norm (QAT, before folding): the pair is one
    pattern, quantized at the batch norm's output, as torchao's QAT folding expects."""
    return (WEIGHTED.get(node.target) == "conv" and len(node.users) == 1
            and next(iter(node.users)).target in _BATCH_NORM)


def annotate_default_node(node: torch.fx.Node, act, weight) -> str | None:
    """Annotate one aten node; returns what was done, or None when it stays float.

    ``weight`` is the weight spec for a weighted op (ignored for the others); ``act`` is
    None under a weight-only scheme (only weights are annotated; the caller leaves other
    ops float).
    """
    if node.target in _SKIP or unbounded_output(node):
        return None
    kind = float_output(node)
    if kind is False:
        return None
    if node.target in WEIGHTED:
        x, w = node.args[0], node.args[1]
        qmap = {}
        if act is not None and isinstance(x, torch.fx.Node) and is_float_tensor(x.meta.get("val")):
            qmap[x] = act
        if is_constant(w):
            qmap[w] = weight
        fused = _feeds_batch_norm(node)
        node.meta[ANNOTATION_KEY] = QuantizationAnnotation(
            input_qspec_map=qmap, output_qspec=None if fused else act, _annotated=True)
        done = "weights and activations" if act is not None else "weights (activations float)"
        return done + (" (output after its batch norm)" if fused else "")
    if node.target == _aten.embedding.default:
        # the table is a weight (one scale per row); the looked-up rows are activations
        table = node.args[0]
        node.meta[ANNOTATION_KEY] = QuantizationAnnotation(
            input_qspec_map={table: weight} if is_constant(table) and weight is not None else {},
            output_qspec=act, _annotated=True)
        return "table as weights, output as activations" if act is not None else "table as weights"
    inputs = _float_inputs(node)
    if node.target in _BATCH_NORM and inputs and _feeds_batch_norm(inputs[0]):
        node.meta[ANNOTATION_KEY] = QuantizationAnnotation(output_qspec=act, _annotated=True)
        return "output of the convolution + batch norm pattern"
    if not inputs:
        return None
    qmap = {x: act for x in inputs}
    shared = node.target in PASSTHROUGH or (node.target in CACHE_WRITES and is_constant(node.args[0]))
    if kind is None:  # several outputs: the specs go on the getitem users
        node.meta[ANNOTATION_KEY] = QuantizationAnnotation(input_qspec_map=qmap, _annotated=True)
        for user in node.users:
            if user.target is operator.getitem:
                spec = SharedQuantizationSpec((inputs[0], node)) if shared else act
                user.meta[ANNOTATION_KEY] = QuantizationAnnotation(output_qspec=spec, _annotated=True)
        return "outputs share the input's qparams" if shared else "activations"
    output = SharedQuantizationSpec((inputs[0], node)) if shared else act
    node.meta[ANNOTATION_KEY] = QuantizationAnnotation(
        input_qspec_map=qmap, output_qspec=output, _annotated=True)
    if shared and node.target in CACHE_WRITES:
        return "cache write: output shares the written values' qparams"
    return "output shares the input's qparams" if shared else "activations"
