"""Run one graph everywhere and judge the results.

Runs: eager float64 (the reference: the module ``.double()`` on the float32 inputs cast
up), eager float32, the lean runtime on portable kernels (no backend), and the cpu backend
(``backends=["cpu"]``) loaded in lean and in ATen mode.

Tolerance (float outputs), the criterion of tests/backends/test_cpu_models.py with 8 ulp of
the output's scale instead of 2 and a model of float32's error beside eager's, applied to
every output and every runtime alike:

    max|got - ref64| ≤ 8 · max(max|eager32 - ref64|, f32) + 8 · eps32 · max|ref64|

Eager float32's own error measures how hard this graph is for float32 (cancellation,
long sums, exp/log amplification); oneDNN sums in another order and uses other vectorised
math than ATen, so 8× that error is the slack. Where eager happens to be exact and the
output cancels (a mean of values of both signs; the mean of a group norm's output, 0 up to
rounding), that measure allows nothing; f32 (fuzz/cpu_diff/rounding.py) is the error of
eager float64 with float32's storage and accumulation rounding put back in op by op, the
error any correct float32 runtime may make (seeds 4945 and 4953). The ulp term covers outputs eager happens
to compute exactly (a copy, a relu); it is 8 ulp, not 2, because a random graph chains up
to ten ops and oneDNN's exp/log are not correctly rounded: log_softmax alone of three
values of size ~3 is 6 ulp off (eager: 0.1 ulp), which is accuracy, not a bug. A kernel
that is 0.1% off is still ~1000× over, and a wrong broadcast or parameter is off by the
output's own size. Integer and bool
outputs must be equal exactly (the generator keeps comparison operands and float→int casts
clear of float32 rounding, and a graph whose eager float32 and float64 integer results
differ anyway is counted "unstable", not judged).
"""

from __future__ import annotations

import copy
import time
import traceback
from dataclasses import dataclass, field

import numpy as np
import torch

from fuzz.cpu_diff.generate import render
from fuzz.cpu_diff.graph import Graph, source
from fuzz.cpu_diff.rounding import float32_error

__all__ = ["Outcome", "check", "build", "TARGETS"]

TARGETS = ("portable", "cpu-lean", "cpu-aten")
ULPS = 8


@dataclass
class Outcome:
    status: str  # "agreed", "refused", "disagree", "error", "unstable"
    where: str = ""  # the runtime that disagreed, or the stage that raised
    detail: str = ""
    delegated: int = 0  # delegate calls in the cpu program
    rejected: list = field(default_factory=list)  # (kind, reason) of nodes left on kernels
    seconds: float = 0.0

    @property
    def signature(self) -> tuple[str, str]:
        """What the shrinker keeps: the same kind of failure at the same place."""
        exc = self.detail.split(":", 1)[0] if self.status == "error" else ""
        return (self.status, self.where + exc)


class _Failure(Exception):
    def __init__(self, status: str, where: str, detail: str) -> None:
        super().__init__(detail)
        self.status, self.where, self.detail = status, where, detail


def build(graph: Graph):
    """``(model, inputs)`` from the graph's rendered source."""
    ns: dict = {}
    exec(compile(source(graph, render), "<cpu_differential graph>", "exec"), ns)
    return ns["Graph"]().eval(), ns["inputs"]()


def _stage(where: str, fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - any exception of a graph eager runs is a finding
        tb = traceback.extract_tb(e.__traceback__)
        at = next((f"{f.filename.split('/opforge/')[-1]}:{f.lineno}" for f in reversed(tb)
                   if "/opforge/" in f.filename), "")
        raise _Failure("error", where, f"{type(e).__name__}: {str(e)[:400]} [{at}]") from e


def _tuple(x):
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def _judge(where, got, want32, want64, rounding) -> None:
    got = list(got)
    if len(got) != len(want32):
        raise _Failure("disagree", where, f"{len(got)} outputs, eager has {len(want32)}")
    for i, (g, w32, w64, f32) in enumerate(zip(got, want32, want64, rounding)):
        g = np.asarray(g)
        w32n = w32.detach().numpy()
        if g.shape != w32n.shape or g.dtype != w32n.dtype:
            raise _Failure("disagree", where, f"output {i}: {g.dtype}{list(g.shape)}, eager "
                                              f"{w32n.dtype}{list(w32n.shape)}")
        if not w32.is_floating_point():
            if not np.array_equal(g, w32n):
                bad = int(np.sum(g != w32n))
                raise _Failure("disagree", where, f"output {i} ({g.dtype}): {bad} of {g.size} "
                                                  "elements differ from eager")
            continue
        w64n = w64.detach().numpy()
        eager_err = float(np.max(np.abs(w32n - w64n)))
        scale = float(np.max(np.abs(w64n)))
        with np.errstate(invalid="ignore"):
            err = float(np.max(np.abs(g.astype(np.float64) - w64n)))
        tol = 8 * max(eager_err, f32) + ULPS * float(np.finfo(np.float32).eps) * scale
        if not err <= tol:  # NaN fails too
            raise _Failure("disagree", where, f"output {i}: max error {err:.3g} > tolerance {tol:.3g} "
                                              f"(eager float32 error {eager_err:.3g}, float32 model "
                                              f"{f32:.3g}, scale {scale:.3g})")


def check(graph: Graph, targets=TARGETS) -> Outcome:
    """Run ``graph`` on ``targets`` and say how it went (the first failure wins)."""
    from opforge.export import delegation_report, export
    from opforge.runtime import load

    start = time.perf_counter()
    out = Outcome("agreed")
    try:
        model, inputs = _stage("build", build, graph)
        with torch.no_grad():
            want32 = _tuple(_stage("eager", model, *inputs))
            model64 = copy.deepcopy(model).double()
            inputs64 = [t.double() if t.is_floating_point() else t for t in inputs]
            want64 = _tuple(_stage("eager64", model64, *inputs64))
            rounding = _stage("eager64 with float32 rounding", float32_error, model64, inputs64)
        for i, (w32, w64) in enumerate(zip(want32, want64)):
            if not w32.is_floating_point() and not torch.equal(w32, w64.to(w32.dtype)):
                raise _Failure("unstable", "eager", f"output {i}: eager float32 and float64 differ")
        arrays = [t.numpy() for t in inputs]
        if "portable" in targets:
            program = _stage("export portable", export, model, inputs, kernels="portable")
            forward = _stage("load portable", lambda: load(program).method("forward"))
            _judge("portable", _stage("run portable", forward, *arrays), want32, want64, rounding)
        cpu_targets = [t for t in targets if t.startswith("cpu-")]
        if cpu_targets:
            program = _stage("export cpu", export, model, inputs, kernels="portable", backends=["cpu"])
            report = delegation_report(program).get("forward", {})
            out.delegated = len(report.get("delegates", []))
            out.rejected = [(r.get("kind", ""), r.get("reason", "")) for r in report.get("rejected", [])]
            for target in cpu_targets:
                mode = target.split("-")[1]
                forward = _stage(f"load {target}", lambda: load(program, mode=mode).method("forward"))
                for _ in range(2):  # the second call runs over the first call's memory
                    _judge(target, _stage(f"run {target}", forward, *arrays), want32, want64, rounding)
            if out.delegated == 0:
                out.status = "refused"
    except _Failure as f:
        out.status, out.where, out.detail = f.status, f.where, f.detail
    out.seconds = time.perf_counter() - start
    return out
