"""``Quantizer``: a torchao PT2E quantizer with the Qualcomm schemes and custom-op contracts.

The surface follows ExecuTorch's ``QnnQuantizer`` (the reference users know): a default
config, per-module configs, discarded nodes and ops, a block-size map, and custom
annotation functions that run after the default annotation. For each node the config is
chosen in this order (first match wins):

    1. the block-size map (``set_block_size_map``): block-wise weights for that node;
    2. a per-module config (``set_submodule_qconfig_list``): by module type or name, read
       from the node's ``nn_module_stack``;
    3. the default config (``set_default_quant_config``), whose ``per_channel_*`` flags
       decide per-channel vs per-tensor weights.

Discarded nodes (by name) and ops (``"aten::softmax"`` or the op overload) stay float.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Sequence

import torch
import torch.fx
from torchao.quantization.pt2e.quantizer import Quantizer as _TorchaoQuantizer

from opforge.quantize.annotate import (
    ANNOTATION_KEY, WEIGHTED, Decision, annotate_default_node, float_output, unbounded_output,
)
from opforge.quantize.contracts import annotate_from_contract, custom_op_contract
from opforge.quantize.schemes import QuantConfig, QuantizeError
from opforge.quantize.specs import activation_spec, weight_spec

__all__ = ["Quantizer", "module_type", "module_name"]

Predicate = Callable[[torch.fx.Node], bool]


def _stack(node: torch.fx.Node) -> list[tuple[str, Any]]:
    return list((node.meta.get("nn_module_stack") or {}).values())


def module_type(cls: type) -> Predicate:
    """A predicate matching nodes inside a module of class ``cls`` (``nn.Linear``)."""
    qualified = f"{cls.__module__}.{cls.__qualname__}"

    def predicate(node: torch.fx.Node) -> bool:
        return any(t is cls or t == qualified for _, t in _stack(node))

    predicate.__name__ = f"module_type({cls.__name__})"
    return predicate


def module_name(name: str) -> Predicate:
    """A predicate matching nodes inside the submodule named ``name`` (``"features.3"``)."""

    def predicate(node: torch.fx.Node) -> bool:
        return any(path == name or path.startswith(name + ".") for path, _ in _stack(node))

    predicate.__name__ = f"module_name({name!r})"
    return predicate


def _op_name(node: torch.fx.Node) -> str:
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return target._schema.name + ("." + target._overloadname if target._overloadname != "default" else "")
    return getattr(target, "__name__", str(target))


def _normalize_op(op: Any) -> str:
    if isinstance(op, torch._ops.OpOverload):
        return op._schema.name + ("." + op._overloadname if op._overloadname != "default" else "")
    if isinstance(op, torch._ops.OpOverloadPacket):
        return op._qualified_op_name
    return str(op).replace(".default", "")


def _check_block(node: torch.fx.Node, block: tuple[int, ...]) -> None:
    weight = node.args[1]
    shape = tuple(weight.meta["val"].shape) if isinstance(weight, torch.fx.Node) else ()
    if len(block) != len(shape) or any(b <= 0 or s % b for b, s in zip(block, shape)):
        raise QuantizeError(
            f"`Quantizer.set_block_size_map`: node {node.name!r} — block size {block} does not "
            f"divide its weight of shape {shape} — valid: one positive size per weight "
            f"dimension, each dividing that dimension — fix: e.g. (1, d, 1, 1) for a convolution "
            f"with d dividing its {shape[1] if len(shape) > 1 else '?'} input channels"
        )


def _default_block(node: torch.fx.Node, cfg: QuantConfig) -> tuple[int, ...] | None:
    """The block of a block-wise weight: ``cfg.block_size``, else ``(1, group)`` along the
    input channels with the config's group size, else the largest of 128/64/32/16/8 below
    K dividing it; None (per channel) when the scheme's default group does not divide K.
    A group size the user gave must divide K (refused otherwise)."""
    if cfg.block_size is not None:
        return cfg.block_size
    shape = tuple(node.args[1].meta["val"].shape)
    group = cfg.weight_group_size
    if group is not None:
        if len(shape) >= 2 and shape[1] % group == 0:
            return (1, group) + (1,) * (len(shape) - 2)
        if cfg.group_size is not None:
            raise QuantizeError(
                f"`opforge.quantize.QuantConfig(scheme={cfg.scheme!r}, group_size={group})`: "
                f"node {node.name!r} — group size {group} does not divide the {shape[1] if len(shape) > 1 else '?'} "
                f"input channels of its weight {shape} — valid: a group size dividing every "
                "quantized weight's input channels — fix: 1. pick a divisor (32, 64, 128 ...); "
                "2. give that layer its own config (Quantizer.set_submodule_qconfig_list)")
        return None
    for size in (128, 64, 32, 16, 8):
        if len(shape) >= 2 and shape[1] % size == 0 and shape[1] > size:
            return (1, size) + (1,) * (len(shape) - 2)
    return None


class Quantizer(_TorchaoQuantizer):
    """A PT2E quantizer (``prepare_pt2e(graph_module, Quantizer(...))``).

    >>> q = Quantizer("16a8w")                          # doctest: +SKIP
    >>> q.set_submodule_qconfig_list([(module_name("head"), QuantConfig("16a16w"))])  # doctest: +SKIP
    >>> q.add_discard_ops(["aten::softmax"])            # doctest: +SKIP
    """

    def __init__(self, scheme: str | QuantConfig = "8a8w", **config: Any) -> None:
        super().__init__()
        self.default = scheme if isinstance(scheme, QuantConfig) else QuantConfig(scheme, **config)
        self.submodule_configs: list[tuple[Predicate, QuantConfig]] = []
        self.discard_nodes: set[str] = set()
        self.discard_ops: set[str] = set()
        self.block_size_map: dict[str, tuple[int, ...]] = {}
        self.custom_annotations: list[Callable[[torch.fx.GraphModule], Any]] = []
        self.decisions: dict[str, Decision] = {}

    # -- the QnnQuantizer surface ------------------------------------------------------
    def set_default_quant_config(self, scheme: str | QuantConfig, **config: Any) -> None:
        self.default = scheme if isinstance(scheme, QuantConfig) else QuantConfig(scheme, **config)

    def set_submodule_qconfig_list(self, items: Sequence[tuple[Predicate, QuantConfig]]) -> None:
        """``[(module_type(nn.Linear), QuantConfig("16a16w")), (module_name("head"), ...)]``."""
        for predicate, cfg in items:
            if not callable(predicate) or not isinstance(cfg, QuantConfig):
                raise QuantizeError(
                    "`Quantizer.set_submodule_qconfig_list`: an item — "
                    f"{(predicate, cfg)!r} — valid: (predicate, QuantConfig) pairs — fix: build "
                    "predicates with opforge.quantize.module_type / module_name")
        self.submodule_configs = list(items)

    def add_discard_nodes(self, names: Iterable[str]) -> None:
        self.discard_nodes.update(names)

    def add_discard_ops(self, ops: Iterable[Any]) -> None:
        self.discard_ops.update(_normalize_op(op) for op in ops)

    def set_block_size_map(self, block_sizes: dict[str, Sequence[int]]) -> None:
        self.block_size_map = {name: tuple(int(b) for b in size) for name, size in block_sizes.items()}

    def add_custom_quant_annotations(self, fns: Iterable[Callable[[torch.fx.GraphModule], Any]]) -> None:
        self.custom_annotations.extend(fns)

    @property
    def needs_calibration(self) -> bool:
        """True when some config observes activation ranges (a static scheme); weight-only
        and dynamic schemes quantize without calibration data."""
        return any(cfg.needs_calibration for cfg in [self.default] + [c for _, c in self.submodule_configs])

    # -- torchao's Quantizer interface -------------------------------------------------
    def config_for(self, node: torch.fx.Node) -> tuple[QuantConfig, str]:
        for predicate, cfg in self.submodule_configs:
            if predicate(node):
                return cfg.with_(is_qat=self.default.is_qat), getattr(predicate, "__name__", "submodule")
        return self.default, "default"

    def annotate(self, model: torch.fx.GraphModule) -> torch.fx.GraphModule:
        unknown = set(self.block_size_map) - {n.name for n in model.graph.nodes}
        if unknown:
            raise QuantizeError(
                f"`Quantizer.set_block_size_map`: node {sorted(unknown)[0]!r} — not in the graph — "
                f"valid: the names of conv/linear nodes ({', '.join(n.name for n in model.graph.nodes if n.target in WEIGHTED)}) "
                "— fix: use the node names of the captured graph (the quantization report lists them)")
        self.decisions = {}
        for node in model.graph.nodes:
            if node.op != "call_function":
                continue
            decision = self._annotate_node(node)
            if decision is not None:
                self.decisions[node.name] = decision
        before = {n.name: n.meta.get(ANNOTATION_KEY) for n in model.graph.nodes}
        for fn in self.custom_annotations:
            fn(model)
        for node in model.graph.nodes:
            if node.op == "call_function" and node.meta.get(ANNOTATION_KEY) is not before.get(node.name):
                self.decisions[node.name] = Decision(
                    node.name, _op_name(node), "custom",
                    f"annotated by {', '.join(getattr(f, '__name__', 'a function') for f in self.custom_annotations)}")
        return model

    def _annotate_node(self, node: torch.fx.Node) -> Decision | None:
        op = _op_name(node)
        if node.name in self.discard_nodes:
            return Decision(node.name, op, "float", "discarded (add_discard_nodes)")
        if op in self.discard_ops or op.split(".")[0] in self.discard_ops:
            return Decision(node.name, op, "float", "discarded (add_discard_ops)")
        if not isinstance(node.target, torch._ops.OpOverload):
            return None
        cfg, source = self.config_for(node)
        act = activation_spec(cfg)
        if node.target._schema.name.split("::")[0] not in ("aten", "prims"):
            if act is None:
                return Decision(node.name, op, "float", f"{cfg.scheme}: activations stay float")
            name, contract = custom_op_contract(node)
            if contract is None:
                return Decision(node.name, op, "float",
                                f"custom op {name} has no quantization contract in its manifest entry")
            if contract.is_float:
                return Decision(node.name, op, "float", "its contract says 'float'")
            return Decision(node.name, op, cfg.scheme, annotate_from_contract(node, contract, act))
        weight = None
        detail_w = ""
        if node.target in WEIGHTED:
            kind = WEIGHTED[node.target]
            block = self.block_size_map.get(node.name)
            if block is not None:
                _check_block(node, block)
                if not cfg.block_wise:
                    cfg = cfg.with_(scheme="w4" if act is None else "16a4w_block")
                detail_w, source = f"weights per block {block}", "block-size map"
            elif cfg.block_wise:
                block = _default_block(node, cfg)
                if block is not None:
                    _check_block(node, block)
                    detail_w = f"weights per block {block}"
                else:
                    detail_w = "weights per channel (no block size divides the input channels)"
            if block is not None:
                weight = weight_spec(cfg, False, block)
            else:
                per_channel = cfg.per_channel_conv if kind == "conv" else cfg.per_channel_linear
                weight = weight_spec(cfg, per_channel)
                detail_w = detail_w or ("weights per channel" if per_channel else "weights per tensor")
        if node.target == torch.ops.aten.embedding.default:
            # 4-bit schemes keep 8-bit tables (schemes.Scheme.table_scheme says why)
            table = cfg.spec.table_scheme
            table_cfg = cfg.with_(scheme=table, group_size=None, block_size=None) if table else cfg
            weight = weight_spec(table_cfg, True)
            detail_w = f"table per row ({table_cfg.weight_bits}-bit)"
        elif act is None and node.target not in WEIGHTED:
            return Decision(node.name, op, "float", f"{cfg.scheme}: activations stay float")
        done = annotate_default_node(node, act, weight)
        if done is None:
            why = ("not a float tensor op" if float_output(node) is False
                   else "its output holds ±inf (a mask fill)" if unbounded_output(node)
                   else "no quantizable input")
            return Decision(node.name, op, "float", why)
        detail = f"{detail_w}, {done}" if detail_w else done
        return Decision(node.name, op, cfg.scheme, f"{detail} ({source} config)")

    def validate(self, model: torch.fx.GraphModule) -> None:
        return None
