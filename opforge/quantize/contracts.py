"""A custom op's manifest quantization contract → torchao annotations on its node.

The contract names inputs by schema argument name and outputs by return name or index
(``opforge.manifest.quantization``). Multi-output ops get their output specs on the
``getitem`` users, as PT2E expects. Pitfall handled here: when two inputs are the same
node, ``input_qspec_map`` has one entry for it and a ``SharedQuantizationSpec`` between the
two would point at itself (torchao's prepare recurses forever), so it is left out.
"""

from __future__ import annotations

import operator

import torch
import torch.fx
from torchao.quantization.pt2e.quantizer import (
    FixedQParamsQuantizationSpec, QuantizationAnnotation, SharedQuantizationSpec,
)

from opforge.manifest.quantization import FixedRule, QuantContract, SharedRule
from opforge.quantize.annotate import ANNOTATION_KEY

__all__ = ["custom_op_contract", "annotate_from_contract"]


def custom_op_contract(node: torch.fx.Node) -> tuple[str, QuantContract | None]:
    """(``"ns::op"``, its contract or None) for a custom-op node."""
    schema = node.target._schema
    name = schema.name
    from opforge.torch_bridge import registered_opdef

    opdef = registered_opdef(name)
    return name, (opdef.quantization if opdef is not None else None)


def _bound_inputs(node: torch.fx.Node) -> dict[str, object]:
    schema = node.target._schema
    bound: dict[str, object] = {}
    positional = [a for a in schema.arguments if not a.kwarg_only]
    for arg, value in zip(positional, node.args):
        bound[arg.name] = value
    bound.update(node.kwargs)
    return bound


def _fixed_spec(rule: FixedRule, act) -> FixedQParamsQuantizationSpec:
    qmin, qmax = act.quant_min, act.quant_max
    scale = (rule.max - rule.min) / (qmax - qmin)
    zero_point = int(min(max(qmin - round(rule.min / scale), qmin), qmax))
    return FixedQParamsQuantizationSpec(dtype=act.dtype, scale=scale, zero_point=zero_point,
                                        quant_min=qmin, quant_max=qmax,
                                        qscheme=torch.per_tensor_affine)


def annotate_from_contract(node: torch.fx.Node, contract: QuantContract, act) -> str:
    """Annotate ``node`` from ``contract`` with activation spec ``act``; returns a summary."""
    bound = _bound_inputs(node)
    nodes = {name: bound.get(name) for name, _ in contract.inputs}
    qmap: dict[torch.fx.Node, object] = {}
    for name, rule in contract.inputs:
        arg = nodes.get(name)
        if not isinstance(arg, torch.fx.Node) or arg in qmap:
            continue  # absent optional tensor, or the same node as an earlier input
        if rule == "quantized":
            qmap[arg] = act
        elif isinstance(rule, SharedRule):
            source = nodes.get(rule.input)
            if isinstance(source, torch.fx.Node) and source is not arg:
                qmap[arg] = SharedQuantizationSpec((source, node))
            elif isinstance(source, torch.fx.Node):
                qmap[arg] = act  # the same node: one observer serves both inputs

    def output_spec(rule):
        if rule == "quantized":
            return act
        if isinstance(rule, SharedRule):
            source = nodes.get(rule.input)
            return SharedQuantizationSpec((source, node)) if source in qmap else None
        if isinstance(rule, FixedRule):
            return _fixed_spec(rule, act)
        return None  # "float"

    specs = [output_spec(rule) for _, rule in contract.outputs]
    if len(specs) == 1:
        node.meta[ANNOTATION_KEY] = QuantizationAnnotation(
            input_qspec_map=qmap, output_qspec=specs[0], _annotated=True)
    else:
        node.meta[ANNOTATION_KEY] = QuantizationAnnotation(input_qspec_map=qmap, _annotated=True)
        for user in node.users:
            if user.target is operator.getitem and specs[user.args[1]] is not None:
                user.meta[ANNOTATION_KEY] = QuantizationAnnotation(
                    output_qspec=specs[user.args[1]], _annotated=True)
    return f"contract {contract.describe()}"
