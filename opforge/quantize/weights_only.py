"""The converted model with its activations left in float: what rounding the weights alone costs.

A converted graph reads ``quantize_per_tensor → dequantize_per_tensor`` around every
activation and ``dequantize_*`` after every integer weight. Bypassing the activation pairs
(each dequantize replaced by the float value its quantize read) leaves a model whose only
error is the weights': the best any activation treatment can reach with these weights.
The difference between the two SQNRs is what the activation path costs; the decoder tests
hold it small (``tests/quantize/test_decoder_accuracy.py``), and ``bench/quantized_decoders.py``
reports both.

To deploy integer weights with float activations, quantize with a weight-only scheme
(``w8``, ``w8_block``, ``w4``: no calibration, docs/quantization.md, "Schemes") rather than
bypassing a converted model's activations: ``w8`` rounds the weights as ``16a8w`` does.

>>> from opforge.quantize.weights_only import weights_only     # doctest: +SKIP
>>> bound = weights_only(result.model)                          # doctest: +SKIP
"""

from __future__ import annotations

import torch
import torch.fx

from opforge.quantize.memory import graph_copy

__all__ = ["weights_only"]

_Q = torch.ops.quantized_decomposed.quantize_per_tensor.default
_DQ = torch.ops.quantized_decomposed.dequantize_per_tensor.default


def weights_only(converted: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A copy of ``converted`` whose activation quantize/dequantize pairs are identities
    (weights stay quantized); ``converted`` is not changed. The copy shares
    ``converted``'s weights (``memory.graph_copy``; state such as a KV cache is its own),
    so it costs no weight memory; change neither's weights in place."""
    model = graph_copy(converted)
    graph = model.graph
    for node in list(graph.nodes):
        source = node.args[0] if node.op == "call_function" and node.target is _DQ else None
        if isinstance(source, torch.fx.Node) and source.op == "call_function" and source.target is _Q:
            node.replace_all_uses_with(source.args[0])
            graph.erase_node(node)
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target is _Q and not node.users:
            graph.erase_node(node)
    model.recompile()
    return model
