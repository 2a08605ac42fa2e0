"""Call-outs from a delegate: custom ops run through their native kernels (the kernel ABI,
listed in compile spec ``custom_ops``) and op-package nodes (``backends/oppackage``). Each
reads contiguous inputs and writes new tensors; the engine calls the kernel or package
entry with their pointers and sizes (``native/external.cpp``)."""

from __future__ import annotations

import torch
import torch.fx

from opforge.backends.cpu.lowering.core import Lowering, Unsupported, _val
from opforge.backends.partition import op_name


def lower_custom(L: Lowering, node, args, kwargs):
    name = op_name(node)
    key = name.rsplit(".", 1)[0]
    if key not in L.custom_ops and name not in L.custom_ops:
        raise Unsupported("compile_spec", f"{name}: a custom op; list it in compile spec "
                          f"custom_ops (e.g. custom_ops=[\"{key}\"]) to run its native kernel "
                          "inside the delegate")
    schema = node.target._schema
    fakes = _val(node)
    fakes = list(fakes) if isinstance(fakes, (tuple, list)) else [fakes]
    ins, arglist = [], []
    bound = dict(zip([a.name for a in schema.arguments], node.args))
    bound.update(node.kwargs)
    for a in schema.arguments:
        value = bound.get(a.name, a.default_value if a.has_default_value() else None)
        if isinstance(value, torch.fx.Node):
            tid = L.contiguous(L.materialize(L.env[value.name]))
            ins.append(tid)
            arglist.append(["tensor", len(ins) - 1])
        elif isinstance(value, bool):
            arglist.append(["bool", int(value)])
        elif isinstance(value, int):
            arglist.append(["int", value])
        elif isinstance(value, float):
            arglist.append(["double", value])
        elif value is None:
            arglist.append(["none", 0])
        elif isinstance(value, (list, tuple)) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            arglist.append(["int_list", [int(v) for v in value]])
        elif isinstance(value, (list, tuple)) and all(isinstance(v, (int, float)) for v in value):
            arglist.append(["double_list", [float(v) for v in value]])
        else:
            raise Unsupported("op", f"{name}: argument {a.name} of type {type(value).__name__} "
                              "cannot be passed through the kernel ABI from the delegate")
    outs = []
    for fake in fakes:
        if not isinstance(fake, torch.Tensor):
            raise Unsupported("op", f"{name}: a non-tensor result")
        outs.append(L.new_tensor(fake.dtype, fake.shape))
        arglist.append(["tensor", len(ins) + len(outs) - 1])
    L.op("kernel", ins, outs, name=f"{key}.out")["args"] = arglist
    L.plan.impls.append({"node": node.name, "op": name, "impl": "native kernel (kernel ABI)"})
    results = tuple(("t", o) for o in outs)
    return results if isinstance(_val(node), (tuple, list)) else results[0]

def lower_package(L: Lowering, node, args):
    plan_node = L.packages[node.name]
    from opforge.backends.oppackage.planner import package_input_nodes

    ins = [L.contiguous(L.materialize(L.env[n.name])) for n in package_input_nodes(node)]
    fakes = _val(node)
    fakes = list(fakes) if isinstance(fakes, (tuple, list)) else [fakes]
    outs = [L.new_tensor(f.dtype, f.shape) for f in fakes]
    entry = L.op("package", ins, outs, name=plan_node.describe())
    entry["node"] = plan_node.to_bytes().hex()
    L.plan.impls.append({"node": node.name, "op": op_name(node), "impl": plan_node.describe()})
    results = tuple(("t", o) for o in outs)
    return results if isinstance(_val(node), (tuple, list)) else results[0]
