"""What the cpu backend takes: every node is lowered once, in graph order, into a scratch
plan; a node the lowering refuses gets its reason, and its result is treated as a run-time
input from then on (it will come from outside the delegate)."""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx

from opforge.backends.cpu.lowering import Lowering, Unsupported
from opforge.backends.cpu.lowering.released import FoldedConstants
from opforge.backends.named_data import NamedDataStore
from opforge.backends.partition import op_name

__all__ = ["support_check", "package_nodes"]


class _Scratch:
    """What ``Lowering`` needs of a subgraph, over a whole method graph."""

    def __init__(self, graph) -> None:
        self.graph_module = graph.graph_module
        self.inputs = []
        self.constants = {}
        self.symbols = getattr(graph, "symbols", None)
        # the trial lowering's constants (a transposed copy of every linear weight) made
        # once for it and the delegates: through the export's pool (lowering/constants.py)
        pool = getattr(graph, "named_data_pool", None)
        self.named_data = None if pool is None else NamedDataStore(pool)
        for node in graph.graph_module.graph.nodes:
            if node.op != "placeholder":
                continue
            if graph.is_constant(node):
                self.constants[node.name] = graph.constant(node)
            else:
                self.inputs.append(node.name)


def _runtime_value(lowering: Lowering, node: torch.fx.Node) -> Any:
    """The env entry of a node whose result comes from outside the delegate."""
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        return ("t", lowering.new_tensor(val.dtype, val.shape, "input"))
    if isinstance(val, (tuple, list)):
        return tuple(("t", lowering.new_tensor(v.dtype, v.shape, "input"))
                     if isinstance(v, torch.Tensor) else None for v in val)
    return val


def _unbacked(value: Any) -> bool:
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    return bool(free_unbacked_symbols(value)) if value is not None else False


def _data_dependent(node: torch.fx.Node) -> bool:
    """Whether a node's result or an argument has a data-dependent (unbacked) size."""
    return _unbacked(node.meta.get("val")) or any(
        _unbacked(arg.meta.get("val")) for arg in node.all_input_nodes)


def package_nodes(graph, specs) -> dict:
    infos = specs.get("op_packages") or []
    if not infos:
        return {}
    from opforge.backends.oppackage.planner import plan_package_nodes

    planned, _ = plan_package_nodes(graph, infos)
    return planned


def support_check(graph, specs):
    """``(check, package_rejections)`` for ``partition_by_support``."""
    planned, package_rejected = {}, []
    claimed: set[str] = set()
    if specs.get("op_packages"):
        from opforge.backends.oppackage.planner import claimed_ops, plan_package_nodes
        from opforge.backends.oppackage.info import parse_op_package_infos

        planned, package_rejected = plan_package_nodes(graph, specs["op_packages"],
                                                       warn_unmatched=True)
        claimed = claimed_ops(parse_op_package_infos(specs["op_packages"]))
    scratch_specs = dict(specs)
    scratch_specs["_package_nodes"] = planned
    lowering = Lowering(_Scratch(graph), scratch_specs)
    for name in lowering.sub.inputs:
        node = next(n for n in graph.graph_module.graph.nodes if n.name == name)
        lowering.env[name] = _runtime_value(lowering, node)
    for name, tensor in lowering.sub.constants.items():
        lowering.env[name] = ("c", tensor)
    rejected_by_package = {r.node: r for r in package_rejected}
    verdicts: dict[torch.fx.Node, tuple[str, str] | None] = {}
    # a constant fold is made when a node reads it and dropped once read (released.py), as
    # in the delegate's own lowering: a walk in graph order held every weight's float copy
    folded = FoldedConstants(lowering)

    def fold(held):
        verdicts[held] = _lowered(lowering, held)
        if verdicts[held] is not None:
            lowering.env[held.name] = None if _unbacked(held.meta.get("val")) else \
                _runtime_value(lowering, held)

    for node in graph.graph_module.graph.nodes:
        if node.op != "call_function":
            continue
        folded.resolve(node, fold)
        _check_node(node, lowering, verdicts, rejected_by_package, claimed, planned, folded)
        if node.name not in folded.deferred:
            folded.after(node)
    return (lambda node: verdicts.get(node, ("op", "not seen by the cpu backend"))), package_rejected


def _lowered(lowering, node) -> tuple[str, str] | None:
    """None when ``node`` lowers (its value in ``lowering.env``), else why not."""
    try:
        lowering.env[node.name] = lowering.lower(node)
        _check_results(node)
    except Unsupported as e:
        return (e.kind, e.reason)
    except Exception as e:  # noqa: BLE001 - the lowering's own limits, said plainly
        return ("op", f"{op_name(node)}: the cpu backend cannot lower it "
                      f"({type(e).__name__}: {e})")
    return None


def _check_node(node, lowering, verdicts, rejected_by_package, claimed, planned, folded) -> None:
    """The verdict on one node of ``support_check``'s walk (a fold held back: none yet)."""
    if node.target is operator.getitem:
        if _unbacked(node.meta.get("val")):  # an item of a data-dependent result
            lowering.env[node.name] = None
            return
        source = lowering.env.get(node.args[0].name)
        lowering.env[node.name] = source[node.args[1]] if isinstance(source, tuple) and \
            not (len(source) == 2 and source[0] in ("t", "c")) else _runtime_value(lowering, node)
        return
    verdict = None
    if node.name in rejected_by_package:
        r = rejected_by_package[node.name]
        verdict = (r.kind, r.reason)
    elif claimed and node.name not in planned and _claimed(node, claimed):
        verdict = ("op", f"{op_name(node)} is claimed by an op package that cannot take "
                         "this node; the backend never runs its own kernel for a claimed op")
    elif _data_dependent(node):
        verdict = ("shape", "a data-dependent size (nonzero, masked_select, item() as a "
                            "size): its instruction binds the size at run time on the "
                            "kernels")
    elif lowering.table is None:
        verdict = _static_shapes(node)
    if verdict is None and folded.defer(node):
        verdicts[node] = None
        return
    if verdict is None:
        verdict = _lowered(lowering, node)
    if verdict is not None:  # (a data-dependent result: only such nodes read it)
        lowering.env[node.name] = None if _unbacked(node.meta.get("val")) else \
            _runtime_value(lowering, node)
    verdicts[node] = verdict


def _claimed(node, claimed) -> bool:
    from opforge.backends.oppackage.planner import torch_op_name

    return torch_op_name(node) in claimed


def _static_shapes(node) -> tuple[str, str] | None:
    val = node.meta.get("val")
    for v in (val if isinstance(val, (tuple, list)) else [val]):
        if isinstance(v, torch.Tensor) and not all(isinstance(s, int) for s in v.shape):
            return ("shape", "a dynamic size: the cpu backend compiles static shapes")
    return None


def _check_results(node) -> None:
    val = node.meta.get("val")
    for v in (val if isinstance(val, (tuple, list)) else [val]):
        if v is not None and not isinstance(v, (torch.Tensor, int, float, bool)):
            raise Unsupported("op", f"{op_name(node)} returns a {type(v).__name__}")
