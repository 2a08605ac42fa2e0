"""The op builder: graph nodes → package ops, derived from the torch schema and checked
against the package's OpDef at export (needs torch).

For each call node whose op an ``OpPackageInfo`` names (``custom_op_name``), walk the op's
schema arguments with the node's values, in order (ExecuTorch's Qualcomm custom-op builder):

- a tensor argument fills the next OpDef ``<Input>`` (by position); ``None`` leaves that
  input out, which it must allow (``Mandatory`` false); a ``Tensor[]`` fills one input
  several times, which it must allow (``Repeated``);
- a scalar (bool, int, float) or a list of them becomes the parameter named after the
  schema argument, which the OpDef must declare (datatype kind, SCALAR vs 1-D rank,
  ``Enumeration`` range and unsigned values checked); a ``str`` or a dtype is refused; an
  argument the node leaves at its schema default is passed with that default when the OpDef
  declares it and skipped when it does not; a mandatory OpDef parameter with no value and
  no default refuses the node;
- the results fill the OpDef ``<Output>``s by position (a ``Repeated`` last output takes
  the rest);
- every tensor's dtype must be one of the datatypes the OpDef (with its CPU supplement)
  lists and its rank the declared ``Rank``; shapes must be static.

A node that cannot be mapped gets a ``Rejection`` (kind ``op``, ``dtype`` or ``shape``) with
the reason; problems of a registration itself (library missing, wrong ABI or platform, an
op type the package lacks, duplicate op types across packages) raise ``BackendError``.

Precedence (the backend applies it): a node a registration claims runs on the package op
when it maps, and is otherwise left out of the delegate with the package's reason; the
backend never silently runs its own kernel for a claimed op.
"""

from __future__ import annotations

from typing import Any, Iterable

import torch
import torch.fx

from opforge.backends.base import Rejection
from opforge.backends.oppackage.info import OpPackageInfo, check_registrations
from opforge.backends.oppackage.model import (
    OpDefinition, TensorDef, datatype_matches_dtype, rank_number,
)
from opforge.backends.oppackage.node import PackageNode, PackageParam, TensorSpec
from opforge.backends.oppackage.runtime import host_platform, load_packages, trust_packages
from opforge.errors import BackendError, shown

__all__ = ["plan_package_nodes", "package_input_nodes", "torch_op_name", "claimed_ops",
           "NodeMappingError"]


class NodeMappingError(Exception):
    """Why one node cannot be mapped: ``kind`` (a Rejection kind) and ``reason``."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind, self.reason = kind, reason


def torch_op_name(node: torch.fx.Node) -> str | None:
    """``aten.add.Tensor`` / ``my_ops.mul3.default`` for an OpOverload target, else None."""
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return None
    ns, _, name = schema.name.partition("::")
    return f"{ns}.{name}.{schema.overload_name or 'default'}"


def claimed_ops(infos: Iterable[OpPackageInfo]) -> set[str]:
    """The torch ops (``aten.add.Tensor``) some registration claims for this machine."""
    return {i.custom_op_name for i in infos if i.platform == host_platform()}


def _as_infos(infos: Any) -> list[OpPackageInfo]:
    """``OpPackageInfo``s, or the ``op_packages`` compile spec's value (dicts) parsed."""
    infos = list(infos or [])
    if all(isinstance(i, OpPackageInfo) for i in infos):
        return infos
    from opforge.backends.oppackage.info import parse_op_package_infos

    return parse_op_package_infos(infos)


def plan_package_nodes(graph: Any, infos: Iterable[OpPackageInfo], *, backend: str = "cpu",
                       warn_unmatched: bool = False
                       ) -> tuple[dict[str, PackageNode], list[Rejection]]:
    """``({node name: PackageNode}, [Rejection])`` for the nodes of ``graph``
    (``opforge.backends.partition.ExportGraph``, or a ``Subgraph`` at preprocess time) whose
    op a registration in ``infos`` names (``OpPackageInfo``s, or the ``op_packages``
    compile spec's list of dicts). ``warn_unmatched`` (at partition time, on the whole
    graph): a registration no node calls is a UserWarning with a did-you-mean.

    >>> nodes, rejected = plan_package_nodes(graph, infos)   # doctest: +SKIP
    >>> nodes["mul3"].describe()                             # doctest: +SKIP
    'package ExampleOpPackage::ExampleCustomOp'
    """
    from opforge.backends.partition import op_name
    from opforge.export.diagnostics import node_location

    infos = _as_infos(infos)
    check_registrations(infos)
    by_op = {i.custom_op_name: i for i in infos}
    planned: dict[str, PackageNode] = {}
    rejected: list[Rejection] = []
    packages = None
    for node in graph.call_nodes():
        name = torch_op_name(node)
        info = by_op.get(name) if name else None
        if info is None:
            continue
        if info.platform != host_platform():
            rejected.append(Rejection(
                backend, node.name, op_name(node), "op",
                f"{name} is registered to package {info.op_package_name} for platform "
                f"{info.platform}, not this machine's ({host_platform()}): its OpDef cannot be "
                "checked here — register the package built for this machine",
                node_location(node) or ""))
            continue
        if packages is None:
            packages = load_packages(infos)  # once, and only when a node needs one
            # the user registered these: a program exported with them may load them here
            trust_packages(p.path for p in packages.values())
        pkg = packages[info.op_package_name]
        opdef = pkg.opdef().op(info.op_type_name)
        if opdef is None or info.op_type_name not in pkg.ops:
            raise BackendError(
                f"op_packages: {info.custom_op_name} → {info.op_package_name}::"
                f"{info.op_type_name} — the package ({pkg.path}) has no op type "
                f"{info.op_type_name!r} — valid: {', '.join(sorted(pkg.ops)) or '(none)'} — fix: "
                "set op_type_name to one of them (the OpDef <Name>)")
        try:
            planned[node.name] = _map_node(node, name, info, opdef, pkg.path)
        except NodeMappingError as e:
            rejected.append(Rejection(
                backend, node.name, op_name(node), e.kind,
                f"{name} → package op {info.op_package_name}::{info.op_type_name}: {e.reason}",
                node_location(node) or ""))
    if warn_unmatched:
        _warn_unmatched(graph, by_op)
    return planned, rejected


def _warn_unmatched(graph, by_op) -> None:
    """A registration whose ``custom_op_name`` no node of the graph calls does nothing: a
    typo (``my_ops.mul3.defualt``) would silently leave the op to the backend's own
    implementation. Warn, with the close names among the graph's ops."""
    import difflib
    import warnings

    present = {torch_op_name(n) for n in graph.call_nodes()} - {None}
    for name, info in by_op.items():
        if name in present or info.platform != host_platform():
            continue
        near = difflib.get_close_matches(name, sorted(present), n=2, cutoff=0.6)
        hint = (f"did you mean {' or '.join(repr(n) for n in near)}?" if near
                else f"the graph calls {', '.join(sorted(present)[:8]) or 'no op'}")
        warnings.warn(
            f"op_packages: the registration of {info.op_package_name}::{info.op_type_name} "
            f"for {name!r} matches no node of method {getattr(graph, 'method', '?')!r} and is "
            f"ignored — {hint}",
            UserWarning, stacklevel=2)


def package_input_nodes(node: torch.fx.Node) -> list[torch.fx.Node]:
    """The graph nodes that feed a planned node's ``PackageNode.inputs``, in that order
    (the schema's tensor arguments, ``None`` left out, ``Tensor[]`` flattened): what the
    backend wires to the package op's inputs."""
    schema = node.target._schema
    out = []
    for i, arg in enumerate(schema.arguments):
        value = node.args[i] if i < len(node.args) else node.kwargs.get(arg.name)
        is_tensor, is_list = _is_tensor_type(arg.type)
        if is_tensor:
            values = value if is_list and isinstance(value, (list, tuple)) else [value]
            out += [v for v in values if isinstance(v, torch.fx.Node)]
    return out


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _spec(val: Any, what: str, tdef: TensorDef) -> TensorSpec:
    if not isinstance(val, torch.Tensor):
        raise NodeMappingError("op", f"{what} is {type(val).__name__}, not a tensor")
    dtype = _dtype_name(val.dtype)
    if not datatype_matches_dtype(tdef.datatypes, dtype):
        raise NodeMappingError("dtype", f"{what} is {dtype}; the OpDef's {tdef.role} "
                               f"{tdef.name!r} accepts {', '.join(tdef.datatypes)}")
    shape = []
    for d in val.shape:
        if not isinstance(d, int):
            raise NodeMappingError("shape", f"{what} has a dynamic shape {tuple(val.shape)}; "
                                   "package ops take static shapes")
        shape.append(int(d))
    rank = rank_number(tdef.rank)
    if rank is not None and rank != len(shape):
        raise NodeMappingError("shape", f"{what} has rank {len(shape)} (shape {tuple(shape)}); "
                               f"the OpDef's {tdef.role} {tdef.name!r} has rank {tdef.rank}")
    return TensorSpec(dtype, tuple(shape))


def _is_tensor_type(t: Any) -> tuple[bool, bool]:
    """(is a tensor argument, is a list of tensors)."""
    if isinstance(t, torch.OptionalType):
        t = t.getElementType()
    if isinstance(t, torch.TensorType):
        return True, False
    if isinstance(t, torch.ListType):
        inner = t.getElementType()
        if isinstance(inner, torch.OptionalType):
            inner = inner.getElementType()
        return isinstance(inner, torch.TensorType), True
    return False, False


def _param(arg: Any, value: Any, pdef: TensorDef) -> PackageParam:
    is_list = isinstance(value, (list, tuple))
    values = list(value) if is_list else [value]
    if any(isinstance(v, torch.fx.Node) for v in values):
        raise NodeMappingError("op", f"argument {arg.name!r} is computed in the graph; package "
                               "parameters must be constants")
    if any(isinstance(v, str) for v in values):
        raise NodeMappingError("op", f"argument {arg.name!r} is a str ({shown(value)}); package "
                               "parameters are numbers and bools")
    if any(not isinstance(v, (bool, int, float)) for v in values):
        raise NodeMappingError("op", f"argument {arg.name!r} = {shown(value)} "
                               f"({type(values[0]).__name__}) has no package parameter form")
    kinds = {"bool" if isinstance(v, bool) else "int" if isinstance(v, int) else "float"
             for v in values} or {"int"}
    kind = "float" if "float" in kinds else "int" if "int" in kinds else "bool"
    datatypes = pdef.datatypes
    floaty = any("FLOAT" in d for d in datatypes)
    inty = any(("INT" in d or "FIXED" in d) for d in datatypes)
    booly = "QNN_DATATYPE_BOOL_8" in datatypes
    anything = "BACKEND_SPECIFIC" in datatypes
    if not anything:
        if kind == "float" and not floaty:
            raise NodeMappingError("dtype", f"parameter {pdef.name!r} = {shown(value)} is a float; "
                                   f"the OpDef declares {', '.join(datatypes)}")
        if kind == "int" and not (inty or floaty):
            raise NodeMappingError("dtype", f"parameter {pdef.name!r} = {shown(value)} is an int; "
                                   f"the OpDef declares {', '.join(datatypes)}")
        if kind == "bool" and not (booly or inty):  # ExecuTorch passes bools as uint32
            raise NodeMappingError("dtype", f"parameter {pdef.name!r} = {shown(value)} is a bool; "
                                   f"the OpDef declares {', '.join(datatypes)}")
        if kind == "int" and not inty:
            kind, values = "float", [float(v) for v in values]
        if (kind == "int" and all(d.startswith("QNN_DATATYPE_U") for d in datatypes)
                and any(v < 0 for v in values)):
            raise NodeMappingError("op", f"parameter {pdef.name!r} = {shown(value)} is negative; "
                                   f"the OpDef declares it unsigned ({', '.join(datatypes)})")
    rank = rank_number(pdef.rank)
    if rank is not None and rank != (1 if is_list else 0):
        raise NodeMappingError("shape", f"parameter {pdef.name!r} = {shown(value)} is a "
                               f"{'list' if is_list else 'scalar'}; the OpDef declares rank {pdef.rank}")
    if pdef.enumeration and (kind != "int" or any(not 0 <= v < len(pdef.enumeration) for v in values)):
        raise NodeMappingError("op", f"parameter {pdef.name!r} = {shown(value)} — valid: "
                               f"0..{len(pdef.enumeration) - 1} "
                               f"({', '.join(pdef.enumeration)})")
    if kind == "bool":
        values = [bool(v) for v in values]
    elif kind == "int":
        values = [int(v) for v in values]
    return PackageParam(pdef.name, kind, tuple(values), is_list)


def _same(a: Any, b: Any) -> bool:
    try:
        return type(a) is type(b) and bool(a == b) or (
            isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and list(a) == list(b))
    except Exception:
        return False


def _map_node(node: torch.fx.Node, name: str, info: OpPackageInfo, opdef: OpDefinition,
              path: str) -> PackageNode:
    schema = node.target._schema
    if len(node.args) > len(schema.arguments):
        raise NodeMappingError("op", f"the node has {len(node.args)} arguments; the schema "
                               f"{schema} has {len(schema.arguments)}")
    slots: list[int] = []
    inputs: list[TensorSpec] = []
    params: list[PackageParam] = []
    slot = -1
    tensor_args = []
    for i, arg in enumerate(schema.arguments):
        given = i < len(node.args) or arg.name in node.kwargs
        value = node.args[i] if i < len(node.args) else node.kwargs.get(
            arg.name, arg.default_value if arg.has_default_value() else None)
        is_tensor, is_list = _is_tensor_type(arg.type)
        if is_tensor:
            slot += 1
            tensor_args.append(arg.name)
            if slot >= len(opdef.inputs):
                continue  # counted below, reported with every name
            idef = opdef.inputs[slot]
            nodes = [v for v in (value if is_list and isinstance(value, (list, tuple)) else [value])
                     if v is not None]
            if not nodes:
                if idef.mandatory:
                    raise NodeMappingError("op", f"schema argument {arg.name!r} is None, but the "
                                           f"OpDef's input {idef.name!r} is mandatory")
                continue
            if len(nodes) > 1 and not idef.repeated:
                raise NodeMappingError("op", f"schema argument {arg.name!r} gives {len(nodes)} "
                                       f"tensors; the OpDef's input {idef.name!r} is not Repeated")
            for k, v in enumerate(nodes):
                if not isinstance(v, torch.fx.Node):
                    raise NodeMappingError("op", f"schema argument {arg.name!r} is "
                                           f"{shown(v)}, not a tensor of the graph")
                what = f"input {arg.name!r}" + (f"[{k}]" if is_list else "")
                inputs.append(_spec(v.meta.get("val"), what, idef))
                slots.append(slot)
            continue
        if value is None:
            continue
        pdef = opdef.parameter(arg.name)
        at_default = not given or (arg.has_default_value() and not isinstance(value, torch.fx.Node)
                                   and _same(value, arg.default_value))
        if pdef is None:
            if at_default:
                continue  # the node keeps the schema's default: nothing to pass
            if isinstance(value, str):
                raise NodeMappingError("op", f"argument {arg.name!r} is a str ({shown(value)}); "
                                       "package parameters are numbers and bools")
            raise NodeMappingError(
                "op", f"schema argument {arg.name!r} = {shown(value)} has no <Parameter> of that "
                f"name in the OpDef (it declares: "
                f"{', '.join(p.name for p in opdef.parameters) or 'none'}) — add one")
        params.append(_param(arg, value, pdef))
    if len(tensor_args) != len(opdef.inputs):
        raise NodeMappingError(
            "op", f"the schema has {len(tensor_args)} tensor argument(s) "
            f"({', '.join(tensor_args) or 'none'}); the OpDef declares {len(opdef.inputs)} "
            f"input(s) ({', '.join(i.name for i in opdef.inputs) or 'none'}) — they are matched "
            "by position")
    given_params = {p.name for p in params}
    for pdef in opdef.parameters:
        if pdef.mandatory and pdef.default is None and pdef.name not in given_params:
            raise NodeMappingError("op", f"the OpDef's mandatory parameter {pdef.name!r} has no "
                                   "value: the schema has no such argument, or the node leaves it "
                                   "at its default, and the OpDef gives no <Default>")
    val = node.meta.get("val")
    results = list(val) if isinstance(val, (list, tuple)) else [val]
    last = opdef.outputs[-1]
    count_ok = (len(results) >= len(opdef.outputs) if last.repeated
                else len(results) == len(opdef.outputs))
    if not count_ok:
        raise NodeMappingError(
            "op", f"the op returns {len(results)} tensor(s); the OpDef declares "
            f"{len(opdef.outputs)} output(s) ({', '.join(o.name for o in opdef.outputs)})")
    outputs = [_spec(r, f"output {i}", opdef.outputs[min(i, len(opdef.outputs) - 1)])
               for i, r in enumerate(results)]
    return PackageNode(info.op_package_name, info.op_type_name, name, info.interface_provider,
                       info.target, info.platform, path, tuple(params), tuple(slots),
                       tuple(inputs), tuple(outputs))
