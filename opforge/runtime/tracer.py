"""The event tracer: each instruction's op and duration, summarised or as a Chrome trace.

Tracing costs nothing when off: ``Method.run(inputs, tracer=t)`` runs a separate loop
that reads the clock (``time.perf_counter_ns``) around each instruction; the plain call
path has no tracing code in it at all.

>>> import numpy as np
>>> from opforge.runtime import Tracer
>>> tracer = Tracer()
>>> tracer.record("forward", 0, "aten::add.out", 1_000, 2_000)
>>> tracer.record("forward", 1, "aten::add.out", 3_000, 4_000)
>>> [(s.op, s.calls, s.total_ns) for s in tracer.summary()]
[('aten::add.out', 2, 6000)]
>>> tracer.chrome_trace()["traceEvents"][0]["dur"]
2.0
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

__all__ = ["Tracer", "OpStats", "METHOD_EVENT"]

METHOD_EVENT = -1  # the instruction index recorded for a whole method call


@dataclass(frozen=True, slots=True)
class OpStats:
    """Totals for one op over every recorded call."""

    op: str
    calls: int
    total_ns: int
    share: float  # of the time spent in all instructions, 0..1

    @property
    def mean_us(self) -> float:
        return self.total_ns / self.calls / 1e3

    @property
    def total_ms(self) -> float:
        return self.total_ns / 1e6


class Tracer:
    """Records ``(method, instruction index, op, start_ns, duration_ns)`` events.

    Instruction index ``-1`` (``METHOD_EVENT``) marks a whole method call.
    """

    def __init__(self) -> None:
        self.events: list[tuple[str, int, str, int, int]] = []

    def record(self, method: str, instruction: int, op: str, start_ns: int,
               duration_ns: int) -> None:
        self.events.append((method, instruction, op, start_ns, duration_ns))

    def clear(self) -> None:
        self.events.clear()

    def summary(self) -> list[OpStats]:
        """Per-op totals over instruction events, the most expensive first."""
        calls: dict[str, int] = {}
        totals: dict[str, int] = {}
        for _, instruction, op, _, duration in self.events:
            if instruction == METHOD_EVENT:
                continue
            calls[op] = calls.get(op, 0) + 1
            totals[op] = totals.get(op, 0) + duration
        grand = sum(totals.values()) or 1
        rows = [OpStats(op, calls[op], totals[op], totals[op] / grand) for op in totals]
        return sorted(rows, key=lambda s: (-s.total_ns, s.op))

    def chrome_trace(self) -> dict:
        """The events in Chrome/Perfetto trace format (complete events, times in µs)."""
        origin = min((e[3] for e in self.events), default=0)
        events = []
        for method, instruction, op, start, duration in self.events:
            is_method = instruction == METHOD_EVENT
            args = {"method": method} if is_method else {"method": method,
                                                        "instruction": instruction}
            events.append({
                "name": op, "cat": "method" if is_method else "kernel", "ph": "X",
                "ts": (start - origin) / 1e3, "dur": duration / 1e3,
                "pid": os.getpid(), "tid": 0, "args": args,
            })
        return {"traceEvents": events, "displayTimeUnit": "ms"}

    def save(self, path: str | os.PathLike) -> None:
        """Write ``chrome_trace()`` as JSON (open it in ui.perfetto.dev or chrome://tracing)."""
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.chrome_trace(), f)
