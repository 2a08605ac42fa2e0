"""The ``cpu`` backend: subgraphs compiled for a oneDNN engine (see docs/backend-cpu.md).

Ahead of time (torch): ``partition`` asks the lowering, node by node, whether it can run
a node and why not; ``preprocess`` lowers a partition to a plan (folded constants,
batch norm folded into convolutions, post-op fusion, channels-last convolution chains)
and encodes it as the blob. At run time (NumPy + ctypes): ``init`` parses the blob and
builds the engine (weights reordered once); ``bind`` fixes the arena pointers; each call
is one native ``execute``.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from opforge.backends.base import Backend, BackendContext, PartitionResult
from opforge.backends.compile_specs import SpecDef
from opforge.errors import BackendError

if TYPE_CHECKING:
    import numpy as np

__all__ = ["CpuBackend", "thread_count", "DEFAULT_THREADS_ENV"]

DEFAULT_THREADS_ENV = "OPFORGE_NUM_THREADS"


def _check_threads(v: int) -> str | None:
    return "negative" if v < 0 else None


def _check_list(v: Any) -> str | None:
    return None if isinstance(v, list) else "not a JSON list"


def thread_count(spec: int) -> int:
    """The engine's threads: the compile spec when > 0, else OPFORGE_NUM_THREADS (a count
    or "auto"), else 1 — the runtime's existing default (its own pool is off by default)."""
    if spec > 0:
        return spec
    raw = os.environ.get(DEFAULT_THREADS_ENV, "").strip()
    if not raw:
        return 1
    if raw == "auto":
        return max(1, len(os.sched_getaffinity(0)))
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 1:
        raise BackendError(f"cpu backend: {DEFAULT_THREADS_ENV}={raw!r} — valid: a count >= 1 or "
                           "'auto' — fix: set it to the number of threads, or unset it for 1")
    return value


# A debug build's delegates hold at most this many nodes (not counting getitems): each node
# result becomes a delegate output, and the engine takes at most 64 outputs per delegate.
DEBUG_NODES_PER_DELEGATE = 24


def _chunks(graph, nodes: list, size: int) -> list[list]:
    """``nodes`` (a convex partition) cut into runs of ``size`` nodes in graph order; runs
    of a topological order of a convex set are convex, and a getitem stays with its source."""
    import operator

    position = {n: i for i, n in enumerate(graph.graph_module.graph.nodes)}
    chunks: list[list] = [[]]
    counted = 0
    for node in sorted(nodes, key=position.__getitem__):
        if node.target is not operator.getitem:
            if counted == size:
                chunks.append([])
                counted = 0
            counted += 1
        chunks[-1].append(node)
    return [c for c in chunks if c]


def _foreign_target(graph, target: str) -> PartitionResult:
    """No partition for ``target``: each call node rejected with the reason (targets.py)."""
    from opforge.backends.base import Rejection
    from opforge.backends.cpu.targets import foreign_reason
    from opforge.backends.partition import op_name
    from opforge.export.diagnostics import node_location

    reason = foreign_reason(target)
    return PartitionResult(rejected=[
        Rejection("cpu", n.name, op_name(n), "partition", reason, node_location(n) or "")
        for n in graph.call_nodes()])


class CpuBackend(Backend):
    name = "cpu"
    writes_state_in_place = True  # index_put / index_copy / slice_scatter into the state
    dynamic_shapes = True  # symbolic sizes inside delegates (docs/backend-cpu.md)
    compile_spec_defs = (
        SpecDef("num_threads", "int", 0, "engine threads; 0 = OPFORGE_NUM_THREADS, else 1",
                _check_threads),
        SpecDef("custom_ops", "json", [], "custom ops ('ns::op') whose native kernels the "
                "delegate calls through the kernel ABI", _check_list),
        SpecDef("op_packages", "json", [], "OpPackageInfo dicts: op packages that implement "
                "or override ops", _check_list),
        SpecDef("fuse", "bool", True, "fuse elementwise ops into convolution/matmul/binary "
                "as oneDNN post-ops"),
        SpecDef("min_ops", "int", 1, "smallest partition worth a delegate call",
                lambda v: None if v >= 1 else "below 1"),
    )

    def __init__(self, *, debug: bool | str = False, target: str | None = None) -> None:
        # a debug build of the blobs (``opforge compare``): node results are also delegate
        # outputs the runtime keeps (``debug_outputs``). "nodes" (or True): lowered without
        # fusion, every result the engine computes; "groups": fused as usual, each fused
        # group's result under its last node
        modes = {False: None, True: "nodes", "nodes": "nodes", "groups": "groups"}
        if debug not in modes:
            raise BackendError(f"`CpuBackend(debug={debug!r})` — valid: False, True, 'nodes' or "
                               "'groups' — fix: pick one")
        self.debug = modes[debug]
        # the machine the program is exported for (targets.py; None: this one): for one the
        # engine is not built for, nothing is delegated and every node says why
        from opforge.backends.cpu.targets import check_target

        self.target = check_target(target, "`CpuBackend(target=...)`")

    def unavailable(self) -> str | None:
        if self.target is not None:  # nothing is delegated: this machine's engine is not used
            return None
        from opforge.backends.cpu.engine import missing

        return missing()

    def preserved_ops(self, specs: dict[str, Any]) -> tuple[str, ...]:
        preserved = list(self.preserve_ops)
        if specs.get("op_packages"):
            from opforge.backends.oppackage.info import claimed_op_keys, parse_op_package_infos

            preserved += sorted(claimed_op_keys(parse_op_package_infos(specs["op_packages"])))
        return tuple(preserved)

    # --- ahead of time --------------------------------------------------------------------
    def partition(self, graph, specs) -> PartitionResult:
        from opforge.backends.cpu.support import support_check
        from opforge.backends.partition import partition_by_support

        if self.target is not None:
            return _foreign_target(graph, self.target)
        check, rejected = support_check(graph, specs)
        result = partition_by_support(self.name, graph, check, min_nodes=specs["min_ops"])
        # package rejections (a node an op package claims but cannot take) say why
        by_node = {r.node: r for r in rejected}
        result.rejected = [by_node.get(r.node, r) for r in result.rejected]
        if self.debug:  # every node result is a delegate output: the engine takes 64 at most
            result.partitions = [chunk for nodes in result.partitions
                                 for chunk in _chunks(graph, nodes, DEBUG_NODES_PER_DELEGATE)]
        return result

    def preprocess(self, subgraph, specs) -> bytes:
        from opforge.backends.cpu import blob, lowering
        from opforge.backends.cpu.support import package_nodes

        specs = dict(specs)
        specs["_package_nodes"] = package_nodes(subgraph, specs)
        from opforge.backends.cpu.lowering.fused_roundings import fold_activation_roundings

        # a 16-bit activation scheme's roundings inside fused ops (lowering/fused_roundings.py)
        lower = lowering.Lowering(fold_activation_roundings(subgraph, specs, self.debug), specs,
                                  debug=self.debug)
        if self.debug and lower.table is not None:
            from opforge.backends.base import PreprocessRefused

            raise PreprocessRefused("shape", "a debug build of a dynamic method's delegate: "
                                    "compare the method exported with static shapes")
        try:
            plan = lower.run()
        except lowering.Unsupported as e:  # a value the partition check folded arrives at run time
            from opforge.backends.base import PreprocessRefused

            raise PreprocessRefused(e.kind, e.reason) from None
        if specs["fuse"] and self.debug != "nodes":
            lowering.fuse(plan)  # symbolic sizes: fuses only where layouts agree for every size
        lowering.prune(plan)
        if self.debug == "groups":
            lower.keep_results()
        subgraph.op_nodes = [list(op.get("_nodes", ())) for op in plan.ops]  # debug handles
        return blob.encode(plan, subgraph.named_data)

    # --- run time ---------------------------------------------------------------------------
    def init(self, blob_bytes, specs, context: BackendContext):
        from opforge.backends.cpu import blob
        from opforge.backends.cpu.engine import EngineHandle, shared_weight_cache

        plan, data = blob.parse(blob_bytes)
        threads = thread_count(specs["num_threads"])
        # one reordered copy of each weight for all the program's delegates: the weights
        # named in the program (stored once) are at one address for every blob
        weights, named = shared_weight_cache(context), context.named_data
        if "symbols" in plan:  # a dynamic method's delegate: engines per shape
            from opforge.backends.cpu.dynamic import DynamicHandle

            return DynamicHandle(plan, data, threads, context.max_memory, context.registry, specs,
                                 weight_cache=weights, named=named)
        handle = EngineHandle(plan, data, threads, context.max_memory, context.registry, specs,
                              weight_cache=weights, named=named)
        from opforge.backends.cpu import crash_report

        crash_report.register(handle, plan, context.registry)  # names a crashing kernel
        return handle

    def bind(self, handle, inputs, outputs):
        from opforge.backends.cpu.crash_report import frame_label
        from opforge.backends.cpu.binding import Binding

        if hasattr(handle, "engines"):  # DynamicHandle
            return handle.bind(inputs, outputs)
        binding = Binding(handle, inputs, outputs)
        label = frame_label(handle)
        if label is not None:
            binding.crash_label = label  # the runtime names its frame with it
        return binding

    def own_threads(self, handle) -> bool:
        """The engine runs its OpenMP regions at its own thread count (set around each call);
        a delegate calling out to a kernel library or an op package may reach other pools."""
        return not handle.callouts

    def execute(self, handle, inputs, outputs) -> None:
        self.bind(handle, inputs, outputs)()

    @staticmethod
    def debug_outputs(handle) -> list[tuple[str, int, np.ndarray]]:
        """A debug build's node results after the last call: ``(node name, result index,
        array)`` each (the arrays are reused by the next call); [] for a normal blob."""
        return list(handle.debug_outputs)

    def destroy(self, handle) -> None:
        from opforge.backends.cpu.crash_report import forget

        forget(handle)
        handle.close()

    def describe_blob(self, blob_bytes, specs) -> dict:
        from opforge.backends.cpu import blob

        plan, data = blob.parse(blob_bytes)
        return {"ops": [op["name"] or op["kind"] for op in plan["ops"]],
                "nodes": plan.get("impls", []), "constant_bytes": data.nbytes,
                "named_bytes": sum(t["named"][1] for t in plan["tensors"] if "named" in t)}
