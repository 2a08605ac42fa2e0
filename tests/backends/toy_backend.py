"""A small backend for testing the delegate plumbing without oneDNN: it takes float32
``add``, ``mul`` and ``relu`` nodes and runs them with NumPy from a JSON blob.

Its blob parser is strict the way every backend's must be (the blob is untrusted).
"""

from __future__ import annotations

import json
import operator

import numpy as np

from opforge.backends import Backend, PartitionResult, SpecDef
from opforge.errors import BackendError

OPS = {"aten::add.Tensor": "add", "aten::mul.Tensor": "mul", "aten::relu.default": "relu"}


class ToyBackend(Backend):
    name = "toy"
    compile_spec_defs = (
        SpecDef("scale", "float", 1.0, "a factor every output is multiplied by (tests specs)"),
        SpecDef("skip_relu", "bool", False, "leave relu out (tests compile_spec rejections)"),
    )

    def partition(self, graph, specs) -> PartitionResult:
        from opforge.backends.partition import op_name, partition_by_support

        def check(node):
            key = op_name(node).replace(".default", ".default")
            if key not in OPS:
                return ("op", f"{key}: the toy backend runs only add, mul and relu")
            if OPS[key] == "relu" and specs["skip_relu"]:
                return ("compile_spec", "relu left out by compile spec skip_relu=true")
            val = node.meta.get("val")
            if getattr(val, "dtype", None) is not None and str(val.dtype) != "torch.float32":
                return ("dtype", f"dtype {val.dtype}: the toy backend runs float32 only")
            for arg in node.args:
                fake = getattr(arg, "meta", {}).get("val")
                if fake is not None and tuple(fake.shape) != tuple(val.shape):
                    return ("shape", "broadcasting: the toy backend needs equal shapes")
            return None

        return partition_by_support(self.name, graph, check)

    def preprocess(self, subgraph, specs) -> bytes:
        from opforge.backends.partition import op_name

        refs = {name: ["in", i] for i, name in enumerate(subgraph.inputs)}
        constants = []
        for name, tensor in subgraph.constants.items():
            refs[name] = ["const", len(constants)]
            constants.append(tensor.float().reshape(-1).tolist())
        nodes = []
        for node in subgraph.call_nodes():
            args = [refs[a.name] if hasattr(a, "name") else ["scalar", float(a)]
                    for a in node.args]
            refs[node.name] = ["node", len(nodes)]
            nodes.append({"op": OPS[op_name(node)], "args": args})
        outputs = [refs[n.name] for n in subgraph.output_nodes()]
        return json.dumps({"version": 1, "inputs": len(subgraph.inputs), "constants": constants,
                           "nodes": nodes, "outputs": outputs}).encode()

    # --- run time: NumPy only --------------------------------------------------------------
    def init(self, blob, specs, context):
        try:
            data = json.loads(bytes(blob).decode("utf-8"))
            if not isinstance(data, dict) or data.get("version") != 1:
                raise ValueError("not a version-1 toy blob")
            n_in, nodes, outputs = data["inputs"], data["nodes"], data["outputs"]
            constants = [np.asarray(c, np.float32) for c in data["constants"]]
            if type(n_in) is not int or n_in < 0:
                raise ValueError("bad input count")
            for i, node in enumerate(nodes):
                if node["op"] not in ("add", "mul", "relu"):
                    raise ValueError(f"node {i}: unknown op {node['op']!r}")
                for ref in node["args"]:
                    self._check_ref(ref, n_in, len(constants), i)
            for ref in outputs:
                self._check_ref(ref, n_in, len(constants), len(nodes))
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
            raise BackendError(f"toy blob refused: {type(e).__name__}: {e}") from None
        return {"nodes": nodes, "outputs": outputs, "constants": constants,
                "scale": specs["scale"], "inits": 1}

    @staticmethod
    def _check_ref(ref, n_in, n_const, n_nodes):
        if not (isinstance(ref, list) and len(ref) == 2):
            raise ValueError(f"bad reference {ref!r}")
        kind, index = ref
        limit = {"in": n_in, "const": n_const, "node": n_nodes}.get(kind)
        if kind == "scalar":
            if not isinstance(index, (int, float)):
                raise ValueError("bad scalar")
        elif limit is None or type(index) is not int or not 0 <= index < limit:
            raise ValueError(f"reference {ref!r} out of range")

    def execute(self, handle, inputs, outputs):
        values = []

        def get(ref):
            kind, index = ref
            if kind == "in":
                return inputs[index]
            if kind == "const":
                return handle["constants"][index]
            if kind == "scalar":
                return np.float32(index)
            return values[index]

        for node in handle["nodes"]:
            args = [get(r) for r in node["args"]]
            if node["op"] == "relu":
                values.append(np.maximum(args[0], np.float32(0)))
            else:
                fn = operator.add if node["op"] == "add" else operator.mul
                values.append(fn(args[0], args[1].reshape(np.shape(args[0]))
                                 if np.ndim(args[1]) else args[1]).astype(np.float32))
        for out, ref in zip(outputs, handle["outputs"]):
            np.multiply(get(ref), np.float32(handle["scale"]), out=out)

    def destroy(self, handle):
        handle["destroyed"] = True
