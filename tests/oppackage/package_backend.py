"""A test backend that runs nothing but op-package nodes, through the same calls the cpu
backend makes (plan_package_nodes at partition time, PackageNode bytes in the blob,
runtime.prepare at init): the whole op-package flow runs end to end through export and the
runtime without the cpu engine. Intermediates are NumPy arrays allocated at init."""

from __future__ import annotations

import json
import operator

import numpy as np

from opforge.backends import Backend, PartitionResult, SpecDef
from opforge.errors import BackendError


def _infos(specs):
    from opforge.backends.oppackage import parse_op_package_infos

    return parse_op_package_infos(specs["op_packages"])


class PackageOnlyBackend(Backend):
    name = "pkgonly"
    compile_spec_defs = (SpecDef("op_packages", "json", [], "op-package registrations"),)

    def partition(self, graph, specs) -> PartitionResult:
        from opforge.backends.oppackage.planner import plan_package_nodes
        from opforge.backends.partition import op_name, partition_by_support

        planned, rejected = plan_package_nodes(graph, _infos(specs), backend=self.name)
        why = {r.node: (r.kind, r.reason) for r in rejected}
        result = partition_by_support(
            self.name, graph,
            lambda n: None if n.name in planned else why.get(n.name, ("op", f"{op_name(n)}: no package op")))
        return result

    def preprocess(self, subgraph, specs) -> bytes:
        from opforge.backends.oppackage.planner import package_input_nodes, plan_package_nodes

        planned, rejected = plan_package_nodes(subgraph, _infos(specs), backend=self.name)
        if rejected:
            raise BackendError(f"pkgonly: {rejected[0].reason}")
        refs = {name: ["in", i] for i, name in enumerate(subgraph.inputs)}
        constants = []
        for name, tensor in subgraph.constants.items():
            refs[name] = ["const", len(constants)]
            t = tensor.detach().contiguous()
            constants.append({"dtype": str(t.numpy().dtype), "shape": list(t.shape),
                              "hex": t.numpy().tobytes().hex()})
        nodes = []
        for node in subgraph.graph_module.graph.nodes:
            if node.op != "call_function":
                continue
            if node.target is operator.getitem:
                refs[node.name] = ["node", refs[node.args[0].name][1], node.args[1]]
                continue
            refs[node.name] = ["node", len(nodes), 0]
            nodes.append({"info": planned[node.name].to_bytes().hex(),
                          "args": [refs[a.name] for a in package_input_nodes(node)]})
        outputs = [refs[n.name] for n in subgraph.output_nodes()]
        return json.dumps({"inputs": len(subgraph.inputs), "constants": constants,
                           "nodes": nodes, "outputs": outputs}).encode()

    def init(self, blob, specs, context):
        from opforge.backends.oppackage.node import PackageNode
        from opforge.backends.oppackage.runtime import _numpy_dtype, prepare

        data = json.loads(bytes(blob))
        infos = _infos(specs)
        constants = [np.frombuffer(bytes.fromhex(c["hex"]), c["dtype"]).reshape(c["shape"])
                     for c in data["constants"]]
        steps = []
        for entry in data["nodes"]:
            info = bytes.fromhex(entry["info"])
            _, _, prepared = prepare(info, infos)
            node = PackageNode.from_bytes(info)
            outs = [np.empty(t.shape, _numpy_dtype(t.dtype)) for t in node.outputs]
            steps.append((prepared, entry["args"], outs))
        return {"steps": steps, "constants": constants, "outputs": data["outputs"]}

    def execute(self, handle, inputs, outputs) -> None:
        def value(ref):
            if ref[0] == "in":
                return np.ascontiguousarray(inputs[ref[1]])
            if ref[0] == "const":
                return handle["constants"][ref[1]]
            return handle["steps"][ref[1]][2][ref[2]]

        for prepared, args, outs in handle["steps"]:
            prepared([value(a) for a in args], outs)
        for out, ref in zip(outputs, handle["outputs"]):
            out[...] = value(ref)

    def destroy(self, handle) -> None:
        for prepared, _, _ in handle["steps"]:
            prepared.close()

    def describe_blob(self, blob, specs):
        from opforge.backends.oppackage.node import PackageNode

        data = json.loads(bytes(blob))
        return {"ops": [PackageNode.from_bytes(bytes.fromhex(n["info"])).describe() for n in data["nodes"]]}
