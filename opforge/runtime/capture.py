"""Capturing intermediate tensors by debug handle, on demand (``opforge compare``).

# Design
#
# A capture is a tracer: ``Method.run(inputs, tracer=...)`` already runs a separate loop
# that reports each instruction after it ran (``tracer.py``); the capture's ``record``
# copies the tensors the program's debug table (``opforge/program/debug.py``) names for
# that instruction, under the FX node they hold. The plain call path has no capture code
# in it at all, so a method that is not captured runs exactly as before
# (``bench/compare_overhead.py`` measures it). Lean and ATen mode share this: they differ
# only in the kernels bound. A delegate call records its outputs under the nodes whose
# results leave the partition; a backend that keeps its node results (the cpu backend's
# debug build, ``CpuBackend(debug=True)``) is asked for them after its call, so a delegated
# run reports the nodes inside the delegate too. A quantize op's integer result is kept
# with its scale and zero point, so its dequantized value is known.
#
# NumPy only, like the rest of the runtime.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from opforge.errors import ProgramError
from opforge.program import DelegateCall, DoubleValue, IntValue, KernelCall, TensorValue
from opforge.program.debug import MethodDebug, debug_info

__all__ = ["Intermediate", "Capture", "capture_intermediates"]

# quantize ops whose out is an integer tensor with (scale, zero point) arguments 1 and 2
_QUANTIZE_OPS = ("quantized_decomposed::quantize_per_tensor",)


@dataclass(frozen=True)
class Intermediate:
    """One node result of one run: ``array`` (a copy), where it was computed, and for an
    integer result of a quantize op its ``scale`` and ``zero_point``."""

    node: str
    item: int
    array: np.ndarray
    instruction: int
    where: str                      # "kernel", "delegate d" or "inside delegate d"
    scale: float | None = None
    zero_point: int | None = None

    def dequantized(self) -> np.ndarray | None:
        """The float value an integer result stands for, ``(q - zero_point) * scale``."""
        if self.scale is None:
            return None
        return (self.array.astype(np.float64) - self.zero_point) * self.scale


class Capture:
    """The tracer ``Method.run`` reports to: records each instruction's node results.

    >>> from opforge.program._sample import sample_program
    >>> from opforge.runtime import load
    >>> capture = Capture(load(sample_program()), "forward")   # no debug table: nothing named
    >>> capture.points
    {}
    """

    def __init__(self, loaded, method: str) -> None:
        program = loaded.program
        self.loaded = loaded
        self.name = method
        self.definition = program.method(method)
        info = debug_info(program)
        self.debug: MethodDebug | None = info.methods.get(method) if info else None
        self.points: dict[int, list[tuple[int, str, int]]] = {}
        if self.debug is not None:
            for c in self.debug.captures:
                self.points.setdefault(c.instruction, []).append(
                    (c.value, self.debug.nodes[c.node].name, c.item))
        self.method = None
        self.results: dict[tuple[str, int], Intermediate] = {}

    def run(self, inputs) -> tuple:
        """Run the method once on ``inputs``, recording; returns its outputs."""
        if self.method is None:
            self.method = self.loaded.method(self.name)
        self.results = {}
        return self.method.run(list(inputs), tracer=self)

    # --- the tracer protocol ---------------------------------------------------------
    def record(self, method: str, instruction: int, op: str, start_ns: int, duration_ns: int) -> None:
        if instruction < 0:
            return
        ins = self.definition.instructions[instruction]
        for value, node, item in self.points.get(instruction, ()):
            where = f"delegate {ins.delegate}" if type(ins) is DelegateCall else "kernel"
            self._keep(node, item, self.method.value(value), instruction, where, ins, op)
        if type(ins) is DelegateCall:
            self._delegate_results(instruction, ins.delegate)

    def _keep(self, node, item, array, instruction, where, ins=None, op="") -> None:
        scale = zero_point = None
        if type(ins) is KernelCall and op.split(".")[0] in _QUANTIZE_OPS:
            scale, zero_point = self._qparams(ins)
        if (node, item) in self.results and where.startswith("inside"):
            return  # the delegate's own output of the node is already there
        self.results[(node, item)] = Intermediate(node, item, np.array(array, copy=True),
                                                  instruction, where, scale, zero_point)

    def _qparams(self, ins: KernelCall) -> tuple[float | None, int | None]:
        values = self.definition.values
        scale, zp = (values[a] for a in ins.args[1:3])
        s = scale.value if type(scale) is DoubleValue else (
            float(np.asarray(self.method.value(ins.args[1])).reshape(-1)[0])
            if type(scale) is TensorValue else None)
        z = zp.value if type(zp) is IntValue else (
            int(np.asarray(self.method.value(ins.args[2])).reshape(-1)[0])
            if type(zp) is TensorValue else None)
        return (s, z) if s is not None and z is not None else (None, None)

    def _delegate_results(self, instruction: int, index: int) -> None:
        delegates = self.loaded.delegates
        backend, handle = delegates.backends[index], delegates.handles[index]
        read = getattr(backend, "debug_outputs", None)
        if read is None:
            return
        for node, item, array in read(handle):
            self._keep(node, item, array, instruction, f"inside delegate {index}")


def capture_intermediates(loaded, inputs, method: str = "forward") -> tuple[tuple, dict]:
    """Run ``method`` of a loaded program once on ``inputs``; return ``(outputs,
    {(node name, result index): Intermediate})``. ``ProgramError`` when the program has no
    debug table (exported with ``debug_handles=False``)."""
    capture = Capture(loaded, method)
    if capture.debug is None:
        raise ProgramError(
            f"`opforge.runtime.capture_intermediates()`: method {method!r} of {loaded.source} — "
            "found no debug table — valid: a program exported with its debug handles — fix: "
            "re-export it without --no-debug-handles (debug_handles=True)")
    outputs = capture.run(inputs)
    return outputs, capture.results
