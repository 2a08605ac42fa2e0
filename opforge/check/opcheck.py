"""The opcheck of one operator's kernel: samples → fake → reference → kernel (isolated) → compare.

    report = check_op(opdef, kernel)      # kernel: the lean runtime's callable of opdef.out_key
    report.ok, report.failed, report.crashed, report.messages, report.to_json()

For each sample (generated from the schema, plus the manifest's ``samples:``), in order:

1. the fake (the op under ``FakeTensorMode``) gives the output shapes and dtypes; a
   generated sample it refuses is skipped as invalid for the op;
2. the reference (``python:``, the ``reference=`` given, or PyTorch's own op for an ATen
   op) runs; a generated sample it refuses is skipped; its outputs' shapes and dtypes are
   compared with the fake's ("fake vs real");
3. the kernel runs in a child process on NumPy views of the same tensors, with outputs
   allocated from the fake (see ``isolation``): a crash is "kernel X crashed on sample N
   (SIGSEGV)"; writes outside an output, into an input, or elements left unwritten are
   failures; eager PyTorch (the op through ``torch.ops``, a native library in use) runs
   the same call in the child;
4. the kernel's outputs are compared with the reference's ("kernel vs reference") and with
   eager's ("eager vs lean").

A kernel that reports a failure mentioning a dtype does not take that dtype: the sample is
skipped. Any other failure it reports on a valid sample is counted as refused (shown, not
a failure) unless the sample is the user's, or the fake disagrees with the reference on it
and the kernel, run again on outputs of the reference's shapes, takes the sample: the
refusal was then the wrong fake's doing, the "fake vs real" failure it is. Without a reference the values are checked
against nothing: the report says so in ``warnings`` and ``verified`` is False.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np

from opforge.check.compare import compare, describe_args
from opforge.check.isolation import Job, run_isolated
from opforge.check.samples import NoSamples, Sample, generate_samples, user_samples
from opforge.manifest import OpDef, resolve_reference
from opforge.schema import ListType

__all__ = ["OpReport", "check_op", "NO_REFERENCE"]

NO_REFERENCE = ("no reference: only consistency checked (kernel vs fake shapes, eager vs "
                "lean, outputs fully written)")
_MAX_MESSAGES = 8  # notes per op, in full
# failure messages kept per kind of failure (crash, fake, native, eager, memory, ...): 32
# crashes must not hide the one wrong output dtype behind them; None keeps every message
MAX_PER_KIND = 4


@dataclass
class OpReport:
    """The result of checking one op's kernel."""

    op: str  # the out overload, "my_ops::mul3.out"
    reference: str | None = None  # "python: mod:fn", "torch: aten::add.Tensor", or None
    samples: int = 0  # run by the kernel (passed, failed, crashed or refused)
    skipped: int = 0  # invalid for the op, or of a dtype the kernel does not take
    passed: int = 0
    failed: int = 0
    crashed: int = 0
    refused: int = 0  # the kernel reported a failure on a valid generated sample
    dtypes: list = field(default_factory=list)  # dtypes the kernel ran on
    messages: list = field(default_factory=list)  # failures and crashes, in full
    notes: list = field(default_factory=list)  # refusals and skips worth knowing
    warnings: list = field(default_factory=list)
    # check → its first message; checks: fake (vs real), native (kernel vs reference),
    # eager (vs lean), memory (guards, inputs, unwritten outputs), crash, kernel (refused a
    # user sample), reference/samples (a user sample or hook that does not work)
    failures: dict = field(default_factory=dict)
    # check → how many samples failed it; message_checks[i] is the check of messages[i]
    counts: dict = field(default_factory=dict)
    message_checks: list = field(default_factory=list)
    max_per_kind: int | None = MAX_PER_KIND

    @property
    def key(self) -> str:
        return self.op

    @property
    def verified(self) -> bool:
        """Were the kernel's values compared with a reference?"""
        return self.reference is not None

    @property
    def ok(self) -> bool:
        return not self.failed and not self.crashed and self.passed > 0

    def fail(self, check: str, message: str, also: tuple[str, ...] = ()) -> None:
        """Record a failing sample under ``check`` (and count it under ``also``)."""
        self.failures.setdefault(check, message)
        for other in also:
            self.failures.setdefault(other, message)
            if other != check:
                self.counts[other] = self.counts.get(other, 0) + 1
        seen = self.counts.get(check, 0)
        self.counts[check] = seen + 1
        if self.max_per_kind is None or seen < self.max_per_kind:
            self.messages.append(message)
            self.message_checks.append(check)

    def grouped(self) -> dict[str, tuple[int, list[str]]]:
        """check → (failing samples, the messages kept), checks in name order."""
        out = {check: (n, []) for check, n in sorted(self.counts.items())}
        for check, message in zip(self.message_checks, self.messages):
            out[check][1].append(message)
        return out

    def to_json(self) -> dict:
        return {"op": self.op, "ok": self.ok, "verified": self.verified,
                "reference": self.reference, "samples": self.samples, "skipped": self.skipped,
                "passed": self.passed, "failed": self.failed, "crashed": self.crashed,
                "refused": self.refused, "dtypes": list(self.dtypes),
                "checks_failed": sorted(self.failures), "messages": list(self.messages),
                "failures_by_check": {check: {"samples": n, "messages": kept}
                                      for check, (n, kept) in self.grouped().items()},
                "notes": list(self.notes), "warnings": list(self.warnings)}


def _as_list(result) -> list:
    return list(result) if isinstance(result, (tuple, list)) else [result]


def _call(fn: Callable, schema, args: list):
    """``fn`` called as the schema says: keyword-only arguments by name."""
    n = len(schema.arguments.positional)
    return fn(*args[:n], **{a.name: v for a, v in zip(schema.arguments.kwarg_only, args[n:])})


def _torch_op(schema):
    import torch

    name = schema.name
    packet = getattr(getattr(torch.ops, name.namespace or "aten"), name.name)
    return getattr(packet, name.overload or "default")


def _reference(opdef: OpDef, given: Callable | None) -> tuple[Callable | None, str | None]:
    if given is not None:
        return given, f"python: {getattr(given, '__module__', '?')}:" \
                      f"{getattr(given, '__qualname__', given)}"
    if opdef.python_impl is not None:
        fn = resolve_reference(opdef.python_impl, what="python implementation",
                               source=opdef.source)
        label = opdef.python_impl if isinstance(opdef.python_impl, str) else \
            f"{fn.__module__}:{fn.__qualname__}"
        return fn, f"python: {label}"
    if opdef.is_aten:
        return _torch_op(opdef.functional), f"torch: {opdef.functional.name}"
    return None, None


def _to_numpy(value):
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().numpy()
    if isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in value):
        return [None if v is None else _to_numpy(v) for v in value]
    if isinstance(value, torch.dtype):
        return torch.empty((), dtype=value).numpy().dtype
    return value


def _meta(tensors) -> list:
    return [(tuple(t.shape), str(t.dtype).removeprefix("torch.")) for t in tensors]


def _kernel_label(kernel, args) -> str:
    try:
        entry = kernel.select(args)
        return f"{entry.kernel_name} ({os.path.basename(kernel.library.path)})"
    except Exception:
        return getattr(kernel, "__name__", repr(kernel))


@dataclass
class _Prepared:
    sample: Sample
    job: Job
    want: list | None  # reference outputs (numpy)
    fake_problem: str | None
    where: str
    # a kernel that refused outputs shaped by a disagreeing fake, run again on outputs
    # shaped by the reference (``_retry_with_real_shapes``)
    retry: object | None = None


def _retry_with_real_shapes(kernel, prepared: list, runs: list, timeout: float,
                            isolate: bool) -> None:
    """Tell a wrong fake from a sample the op does not take. Where the fake disagrees with
    the reference and the kernel refused the outputs the fake shaped, the kernel runs once
    more on outputs of the reference's shapes and dtypes: if it takes those, the refusal
    was the fake's doing (a "fake vs real" failure); if it refuses them too, the sample is
    one the op does not take (AddCustom's kernel refuses x[3, 1] + y[1, 4] whatever the
    outputs; a broadcasting reference is wider than the op), a refusal as before."""
    again = []
    for p, run in zip(prepared, runs):
        if run.error is None or not p.fake_problem or p.want is None or \
                not all(isinstance(w, np.ndarray) for w in p.want) or \
                len(p.want) != len(p.job.out_meta):
            continue
        again.append((p, replace(p.job, out_meta=[(w.shape, w.dtype) for w in p.want],
                                 eager=None)))
    if again:
        for (p, _), run in zip(again, run_isolated(kernel, [job for _, job in again],
                                                   timeout=timeout, isolate=isolate)):
            p.retry = run


def check_op(opdef: OpDef, kernel: Callable, *, eager: bool = True,
             reference: Callable | None = None, samples: Callable | None = None,
             seed: int = 0, timeout: float = 10.0, isolate: bool = True,
             max_per_kind: int | None = MAX_PER_KIND) -> OpReport:
    """Check ``kernel`` (the out overload's callable, portable convention) against the op.

    A custom op not yet registered with PyTorch is registered (``torch_bridge.register``).
    ``eager`` also runs the op through ``torch.ops`` (with a native library in use,
    its kernel: "eager vs lean"); ``reference`` replaces the manifest's ``python:``;
    ``samples`` adds a hook like the manifest's ``samples:``; ``timeout`` is per sample.
    ``max_per_kind`` failure messages are kept per kind of failure (None: all of them).
    """
    if not opdef.is_aten:
        from opforge.torch_bridge import is_registered, register

        if not is_registered(opdef.name):
            register(opdef)
    fn, label = _reference(opdef, reference)
    report = OpReport(opdef.out_key, label, max_per_kind=max_per_kind)
    if fn is None:
        report.warnings.append(
            f"{NO_REFERENCE} — the values were compared with nothing, so a kernel computing "
            f"wrong values passes — fix: add `python: module:function` to {opdef.source}, or "
            "name one with `opforge check --reference OP=module:function`")
    op = _torch_op(opdef.functional)
    eager_op = op if eager and not opdef.is_aten else None
    prepared = [p for p in _prepare(opdef, op, fn, eager_op, samples, seed, report) if p]
    if not prepared and not report.failures:
        report.fail("samples", f"{opdef.out_key}: no sample was valid for the op (the fake or "
                    f"the reference refused all of them) — fix: add `samples: module:function` "
                    f"to {opdef.source}")
    runs = run_isolated(kernel, [p.job for p in prepared], timeout=timeout, isolate=isolate)
    _retry_with_real_shapes(kernel, prepared, runs, timeout, isolate)
    report.samples = len(prepared)
    for p, run in zip(prepared, runs):
        _judge(report, p, run, kernel)
    if report.passed == 0 and not report.failures:
        report.fail("samples", f"{opdef.out_key}: the kernel ran on no sample (skipped: "
                    f"{report.skipped}, refused: {report.refused})")
    return report


def _samples(opdef: OpDef, hook: Callable | None, seed: int, report: OpReport):
    names = []
    if opdef.samples is not None:
        names.append((resolve_reference(opdef.samples, what="samples function",
                                        source=opdef.source),
                      f"samples: {opdef.samples if isinstance(opdef.samples, str) else 'hook'}"))
    if hook is not None:
        names.append((hook, f"samples: {getattr(hook, '__qualname__', 'hook')}"))
    users = []
    for fn, origin in names:
        try:
            users += user_samples(fn, opdef.functional, origin)
        except Exception as e:
            report.fail("samples", f"{origin}: {type(e).__name__}: {e}")
    try:
        yield from generate_samples(opdef.functional, seed)
    except NoSamples as e:
        if not users:
            report.fail("samples", f"{opdef.out_key}: cannot generate samples: {e} — fix: add "
                        f"`samples: module:function` to {opdef.source} (see docs/manifest.md)")
    yield from users


def _prepare(opdef, op, reference, eager_op, hook, seed, report):
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    schema = opdef.functional
    names = [a.name for a in schema.arguments.flat]
    out_is_list = isinstance(opdef.out.arguments.out[0].type, ListType)
    for index, sample in enumerate(_samples(opdef, hook, seed, report)):
        sample.index = index
        args = sample.args
        where = (f"sample {index} ({sample.origin}, {sample.layout}): "
                 f"{describe_args(names, args)}")
        try:
            with FakeTensorMode(allow_non_fake_inputs=True) as mode:
                fake_args = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else
                             [mode.from_tensor(t) if isinstance(t, torch.Tensor) else t
                              for t in a] if isinstance(a, list) else a for a in args]
                fakes = _as_list(_call(op, schema, fake_args))
        except Exception as e:
            if sample.from_user:
                report.fail("fake", f"{where}\n    the fake refused it: {type(e).__name__}: {e}")
            else:
                report.skipped += 1
            continue
        want = None
        fake_problem = None
        if reference is not None:
            try:
                want = [w.detach().numpy().copy() if isinstance(w, torch.Tensor) else w
                        for w in _as_list(_call(reference, schema, args))]
            except Exception as e:
                if sample.from_user:
                    report.fail("reference", f"{where}\n    the reference refused it: "
                                f"{type(e).__name__}: {e}")
                else:
                    report.skipped += 1
                continue
            real = [(tuple(w.shape), str(w.dtype)) for w in want if isinstance(w, np.ndarray)]
            fake = [(s, str(torch.empty((), dtype=getattr(torch, d)).numpy().dtype))
                    for s, d in _meta(fakes)]
            if real != fake:
                fake_problem = f"fake {fake}, reference {real}"
        try:
            out_meta = [(s, torch.empty((), dtype=getattr(torch, d)).numpy().dtype)
                        for s, d in _meta(fakes)]
        except TypeError:  # bfloat16 and friends have no NumPy dtype
            report.skipped += 1
            continue
        eager = None
        if eager_op is not None:
            def eager(op=eager_op, args=args):
                return [t.detach().numpy() for t in _as_list(_call(op, schema, args))]
        job = Job([_to_numpy(a) for a in args], out_meta, out_is_list, eager)
        yield _Prepared(sample, job, want, fake_problem, where)


def _judge(report: OpReport, p: _Prepared, run, kernel) -> None:
    sample = p.sample
    if run.crash:
        report.crashed += 1
        message = (f"kernel {_kernel_label(kernel, p.job.args)} crashed on sample "
                   f"{sample.index} ({run.crash})\n    {p.where}")
        if p.fake_problem:  # its outputs were allocated from a wrong fake
            message += f"\n    fake vs real: {p.fake_problem}"
        report.fail("crash", message, also=("fake",) if p.fake_problem else ())
        return
    retry = p.retry
    if run.error is not None and retry is not None and retry.error is None and not retry.crash:
        # the kernel refused the outputs the fake shaped and took the reference's: the
        # wrong fake's doing, the "fake vs real" failure the manifest docs promise
        report.failed += 1
        report.fail("fake", f"{p.where}\n    fake vs real: {p.fake_problem}\n    the kernel "
                    f"refused outputs of the fake's shapes ({run.error}) and ran on outputs "
                    "of the reference's")
        return
    if run.error is not None:
        if "dtype" in run.error and not sample.from_user:
            report.skipped += 1  # the kernel does not take this dtype: not a run
            report.samples -= 1
            note = f"not run on {sample.dtype}: {run.error}"
            if note not in report.notes and len(report.notes) < _MAX_MESSAGES:
                report.notes.append(note)
            return
        if sample.from_user:
            report.failed += 1
            report.fail("kernel", f"{p.where}\n    the kernel refused it: {run.error}")
        else:
            report.refused += 1
            also = (f" (the fake disagrees with the reference here, {p.fake_problem}; the "
                    "kernel refused outputs of the reference's shapes too)"
                    if retry is not None else "")
            if len(report.notes) < _MAX_MESSAGES:
                report.notes.append(f"refused {p.where}: {run.error}{also}")
        return
    if sample.dtype and sample.dtype not in report.dtypes:
        report.dtypes.append(sample.dtype)
    problems = []
    problems += [("memory", text) for text in run.problems]
    if p.fake_problem:
        problems.append(("fake", f"fake vs real: {p.fake_problem}"))
    if p.want is not None:
        for n, (got, want) in enumerate(zip(run.outs, p.want)):
            if isinstance(want, np.ndarray):
                diff = compare(got, want)
                if diff:
                    problems.append(("native", f"kernel vs reference, output {n}: {diff}"))
    if run.eager_error is not None:
        problems.append(("eager", f"eager vs lean: eager PyTorch failed: {run.eager_error}"))
    elif run.eager is not None:
        for n, (got, want) in enumerate(zip(run.outs, run.eager)):
            diff = compare(got, want)
            if diff:
                problems.append(("eager", f"eager vs lean, output {n}: {diff}"))
    if not problems:
        report.passed += 1
        return
    report.failed += 1
    text = "\n    ".join(t for _, t in problems)
    checks = tuple(dict.fromkeys(check for check, _ in problems))
    report.fail(checks[0], f"{p.where}\n    {text}", also=checks[1:])
