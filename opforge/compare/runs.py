"""The runs a comparison makes, each reduced to ``{(reference node, result index): array}``.

| run | what runs | node results come from |
| --- | --- | --- |
| ``eager`` | the decomposed graph in PyTorch, in the model's dtypes | the interpreter (``reference.py``) |
| ``lean`` | the program on the lean runtime (portable NumPy and native kernels) | the debug table's captures |
| ``aten`` | the same program on PyTorch's kernels (``mode="aten"``) | the same |
| ``native`` | the same program on the native C++ runtime (``executor="native"``) | its outputs only, under the nodes that produce them (no capture natively yet) |
| ``cpu`` | a program exported for the ``cpu`` backend's debug build (``CpuBackend(debug="nodes")``: fusion off, every engine result kept) on the lean runtime | delegate outputs and the engine's kept results |
| ``cpu-fused`` | the same with fusion as in production (``CpuBackend(debug="groups")``) | delegate outputs and each fused group's result, under its last node |
| ``quantized`` | the model quantized (PT2E, ``scheme``) and exported, on the lean runtime | captures; a result that is quantized is compared as its dequantized integer tensor |

Every program is exported from the one ``ExportedProgram`` the reference captured, so its
debug handles are the reference's node names. The quantized model is a different graph
(quantize/dequantize ops between the same computations): its nodes are matched to the
reference's by operator and occurrence (the k-th ``aten::addmm`` is the k-th
``aten::addmm``), quantize/dequantize ops aside.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np

from opforge.compare.metrics import Tolerance
from opforge.compare.reference import ReferenceGraph
from opforge.program import KernelCall, Move
from opforge.runtime import load
from opforge.runtime.capture import Capture

__all__ = ["Run", "RUNS", "model_runs", "program_run", "native_run"]

RUNS = ("eager", "lean", "aten", "native", "cpu", "cpu-fused", "quantized")
_QDQ = "quantized_decomposed::"


@dataclass
class Run:
    """One run's node results, keyed by the reference's node names."""

    name: str
    values: dict[tuple[str, int], np.ndarray]
    tolerance: Tolerance
    where: dict[tuple[str, int], str] = field(default_factory=dict)
    integers: dict[tuple[str, int], str] = field(default_factory=dict)  # quantized results
    # quantized results whose float value went past the integer range: (values clipped,
    # values, how far past: max |x| / the range's bound on that side)
    clipped: dict[tuple[str, int], tuple[int, int, float]] = field(default_factory=dict)
    note: str = ""
    outputs: tuple = ()


def model_runs(ref: ReferenceGraph, inputs: Sequence[np.ndarray], against: Iterable[str], *,
               tolerance: Tolerance, quantized_tolerance: Tolerance, kernels: Sequence[str] = (),
               model: Any = None, scheme: str = "8a8w", calibration: Sequence | None = None,
               on_step=lambda text: None) -> list[Run]:
    from opforge.export import export

    runs = []
    program = None
    for name in against:
        on_step(f"run: {name}")
        if name == "eager":
            torch_inputs = _torch_inputs(inputs)
            values = ref.run(torch_inputs, float64=False)
            runs.append(Run("eager", values, tolerance, {k: "eager" for k in values},
                            note="the decomposed graph in PyTorch, in the model's dtypes"))
        elif name in ("lean", "aten"):
            if program is None:
                program = export(ref.exported, None)
            runs.append(program_run(program, inputs, name, mode=name, kernels=kernels,
                                    tolerance=tolerance))
        elif name == "native":
            if program is None:
                program = export(ref.exported, None)
            runs.append(native_run(program, inputs, kernels=kernels, tolerance=tolerance))
        elif name in ("cpu", "cpu-fused"):
            from opforge.backends.cpu import CpuBackend

            mode = "nodes" if name == "cpu" else "groups"
            debug_program = export(ref.exported, None, backends=[(CpuBackend(debug=mode), {})])
            run = program_run(debug_program, inputs, name, mode="lean", kernels=kernels,
                              tolerance=tolerance)
            run.note = ("cpu backend debug build: fusion off, every engine result kept"
                        if mode == "nodes" else "cpu backend debug build: fused as in "
                        "production, each fused group's result kept under its last node")
            runs.append(run)
        elif name == "quantized":
            runs.append(_quantized_run(ref, model, inputs, scheme, calibration, kernels,
                                       quantized_tolerance))
        else:
            raise ValueError(name)
    return runs


def program_run(program, inputs, name: str, *, mode: str = "lean", kernels: Sequence[str] = (),
                tolerance: Tolerance, method: str = "forward") -> Run:
    """Run a program once, capturing every node result its debug table names."""
    capture = Capture(load(program, mode=mode, kernels=list(kernels)), method)
    outputs = capture.run(list(inputs))
    values = {k: v.array for k, v in capture.results.items()}
    where = {k: v.where + _group_of(capture.debug, v) for k, v in capture.results.items()}
    return Run(name, values, tolerance, where, outputs=tuple(outputs))


def native_run(program, inputs, *, kernels: Sequence[str] = (), tolerance: Tolerance,
               method: str = "forward") -> Run:
    """Run a program once on the native C++ runtime. It does not capture intermediates yet,
    so the run holds the method's outputs only, each under the node (and result index) the
    debug table says produces it (through Moves); the other nodes are not observed."""
    from opforge.program import debug_info

    outputs = load(program, executor="native", kernels=list(kernels)).method(method)(*inputs)
    info = debug_info(program)
    debug = info.methods.get(method) if info else None
    values, where = {}, {}
    if debug is not None:
        definition = program.method(method)
        node_of = {c.value: (debug.nodes[c.node].name, c.item) for c in debug.captures}
        for instruction in definition.instructions:
            if type(instruction) is Move and instruction.src in node_of:
                node_of[instruction.dst] = node_of[instruction.src]
        for value, output in zip(definition.outputs, outputs):
            key = node_of.get(value)
            if key is not None and isinstance(output, np.ndarray):
                values[key], where[key] = output, "native output"
    return Run("native", values, tolerance, where, outputs=tuple(outputs),
               note="the native C++ runtime: outputs only (intermediates are not captured "
                    "natively yet)")


def _group_of(debug, result) -> str:
    """", fused: a+b+c" for a result of a fused engine op (from the delegate's op nodes)."""
    if debug is None or not result.where.startswith(("delegate ", "inside delegate ")):
        return ""
    index = int(result.where.rsplit(" ", 1)[1])
    names = [n.name for n in debug.nodes]
    for op in debug.delegate_ops.get(index, ()):
        if len(op) > 1 and names[op[-1]] == result.node:
            return ", fused: " + "+".join(names[h] for h in op)
    return ""


def _quantized_run(ref: ReferenceGraph, model, inputs, scheme, calibration, kernels,
                   tolerance: Tolerance) -> Run:
    from opforge.quantize import quantize

    if model is None:
        raise ValueError("the quantized run needs the float model")
    torch_inputs = _torch_inputs(inputs)
    samples = [tuple(_torch_inputs(s)) for s in calibration] if calibration else [torch_inputs]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quantized = quantize(model, torch_inputs, scheme, calibration=samples)
        program = quantized.export()
    capture = Capture(load(program, kernels=list(kernels)), "forward")
    outputs = capture.run(list(inputs))
    debug = capture.debug
    definition = capture.definition
    # which node's value each quantize op reads: the capture that last wrote its input
    writer: dict[int, tuple[str, int]] = {}
    quantized_of: dict[tuple[str, int], Any] = {}
    clipped_of: dict[tuple[str, int], tuple[int, int, float]] = {}
    for c in debug.captures:
        node = debug.nodes[c.node]
        ins = definition.instructions[c.instruction]
        if node.op.startswith(_QDQ + "quantize_per_tensor") and type(ins) is KernelCall:
            source = writer.get(ins.args[0])
            if source is not None and (node.name, c.item) in capture.results:
                q = capture.results[(node.name, c.item)]
                quantized_of[source] = q
                if source in capture.results:
                    clip = _clipping(capture.results[source].array, q, definition.values, ins)
                    if clip is not None:
                        clipped_of[source] = clip
        writer[c.value] = (node.name, c.item)
    # match the quantized graph's nodes to the reference's by op and occurrence
    by_op: dict[str, list[str]] = {}
    for name, op, _ in ref.nodes:
        by_op.setdefault(op, []).append(name)
    folded = _folded_batch_norms(ref, debug.nodes)
    seen: dict[str, int] = {}
    values, where, integers, clipped = {}, {}, {}, {}
    for node in debug.nodes:
        if node.op.startswith(_QDQ):
            continue
        k = seen.get(node.op, 0)
        seen[node.op] = k + 1
        names = by_op.get(node.op, [])
        if k >= len(names):
            continue
        for (name, item), result in capture.results.items():
            if name != node.name:
                continue
            key = (folded.get(names[k], names[k]), item)
            q = quantized_of.get((name, item))
            if q is not None and q.dequantized() is not None:
                values[key] = q.dequantized()
                lo, hi = int(q.array.min()), int(q.array.max())
                integers[key] = (f"{q.array.dtype} [{lo}, {hi}] scale {q.scale:.3g} "
                                 f"zp {q.zero_point}")
                clip = clipped_of.get((name, item))
                if clip is not None:
                    clipped[key] = clip
                    integers[key] += (f"; {clip[0]} of {clip[1]} values clipped, up to "
                                      f"{clip[2]:.3g}x the range's bound")
                where[key] = "quantized"
            else:
                values[key] = result.array
                where[key] = result.where
    return Run("quantized", values, tolerance, where, integers, clipped,
               note=f"{scheme} (PT2E), calibrated on {len(samples)} sample(s); a quantized "
                    "result is compared as its dequantized integer tensor",
               outputs=tuple(outputs))


def _clipping(x: np.ndarray, q, values, ins) -> tuple[int, int, float] | None:
    """How many values of ``x`` a quantize op clipped (they lie past its integer range
    ``[(qmin - zp) * s, (qmax - zp) * s]``; an observer's range is what the calibration
    showed, so other inputs may go past it) and how far: ``(count, size, max |x| / bound)``.
    None when nothing was clipped or the range is not known."""
    from opforge.program import IntValue

    bounds = [values[a] for a in ins.args[3:5]] if len(ins.args) >= 5 else []
    if q.scale is None or len(bounds) != 2 or any(type(b) is not IntValue for b in bounds):
        return None
    low = (bounds[0].value - q.zero_point) * q.scale
    high = (bounds[1].value - q.zero_point) * q.scale
    x = np.asarray(x, dtype=np.float64)
    # half a step of slack: values within it round to the end of the range, not clipped
    half = 0.5 * q.scale
    out = (x < low - half) | (x > high + half)
    count = int(out.sum())
    if count == 0:
        return None
    ratio = max(float(x.min()) / low if low < 0 else 0.0, float(x.max()) / high if high > 0 else 0.0)
    return count, int(x.size), ratio


def _folded_batch_norms(ref: ReferenceGraph, quantized_nodes) -> dict[str, str]:
    """Reference node → the batch norm folded into it, when quantization folded batch norms
    into the convolutions before them (PT2E does): the quantized convolution's result is
    then the batch norm's, and is compared with it (the two nodes reported as one group)."""
    def is_batch_norm(op: str) -> bool:
        return "batch_norm" in op

    in_reference = sum(1 for _, op, _ in ref.nodes if is_batch_norm(op))
    if sum(1 for n in quantized_nodes if is_batch_norm(n.op)) >= in_reference:
        return {}
    folded = {}
    for node in ref.method.call_nodes():
        users = list(node.users)
        if len(users) == 1 and is_batch_norm(ref.method.notes["debug_nodes"].get(users[0].name, ("",))[0]):
            folded[node.name] = users[0].name
    return folded


def _torch_inputs(inputs) -> tuple:
    import torch

    return tuple(torch.as_tensor(np.asarray(a)) for a in inputs)
