"""Custom ops whose contract is ``integer`` run on the quantized integers themselves.

In the converted graph such an op reads ``dequantize(q, s, z)`` and each output goes
straight into ``quantize(·, s, z)`` with the same parameters (its contract shares them).
For an op that only selects or moves values (min, max, gather, reorder) that round trip is
the identity on the integers, so the op can take ``q`` and hand its integer output to the
consumers' dequantize. This pass does that rewrite and nothing else: a node whose
neighbours do not match exactly (a different scale, a float consumer) is left as it is.
"""

from __future__ import annotations

import operator

import torch
import torch.fx

from opforge.quantize.contracts import custom_op_contract

__all__ = ["run_on_integers"]

_DQ = torch.ops.quantized_decomposed.dequantize_per_tensor.default
_Q = torch.ops.quantized_decomposed.quantize_per_tensor.default


def _qparams(node: torch.fx.Node) -> tuple:
    return tuple(node.args[1:6])


def _output_quantizes(node: torch.fx.Node) -> list[list[torch.fx.Node]] | None:
    """The quantize nodes each output feeds (all of its uses), or None if one is not."""
    outputs = [u for u in node.users if u.target is operator.getitem] or [node]
    result = []
    for out in outputs:
        users = list(out.users)
        if not users or any(u.target != _Q for u in users):
            return None
        result.append(users)
    return result


def run_on_integers(gm: torch.fx.GraphModule) -> list[str]:
    """Rewrite every ``integer``-contract custom op of ``gm``; returns the rewritten nodes."""
    done = []
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        if node.target._schema.name.split("::")[0] in ("aten", "prims", "quantized_decomposed"):
            continue
        _, contract = custom_op_contract(node)
        if contract is None or not contract.on_integers:
            continue
        dqs = [a for a in node.all_input_nodes if a.target == _DQ]
        # nodes convert_pt2e inserts carry no "val": a dequantize counts as a tensor input
        tensor_inputs = [a for a in node.all_input_nodes
                         if a.target == _DQ or isinstance(a.meta.get("val"), torch.Tensor)]
        quantizes = _output_quantizes(node)
        if not dqs or len(dqs) != len(tensor_inputs) or quantizes is None:
            continue
        params = {_qparams(d) for d in dqs} | {_qparams(q) for qs in quantizes for q in qs}
        if len(params) != 1:
            continue
        node.args = tuple(a.args[0] if isinstance(a, torch.fx.Node) and a in dqs else a
                          for a in node.args)
        node.kwargs = {k: (v.args[0] if isinstance(v, torch.fx.Node) and v in dqs else v)
                       for k, v in node.kwargs.items()}
        outputs = [u for u in node.users if u.target is operator.getitem] or [node]
        for out, qs in zip(outputs, quantizes):
            for q in qs:
                q.replace_all_uses_with(out)
                gm.graph.erase_node(q)
        for d in dqs:
            if not d.users:
                gm.graph.erase_node(d)
        done.append(node.name)
    if done:
        gm.graph.lint()
        gm.recompile()
    return done
