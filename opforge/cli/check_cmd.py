"""``opforge check MANIFEST --kernels lib.so``: an opcheck for compiled kernels.

For each operator the library serves, on generated samples (shapes ``()``, ``(0,)``,
``(5,)``, ``(3, 4)``, ``(2, 3, 4)``; dtypes float32/float64/int32/int64 where the kernel
accepts them; random and edge values: ±0, ±inf, nan, large), three comparisons:

1. shape inference: the fake (run under torch's FakeTensorMode) vs the reference's real
   outputs (shape and dtype);
2. the native kernel (called alone, on NumPy arrays) vs the Python reference;
3. eager PyTorch with the native library installed vs the lean runtime's kernel.

A rich table shows pass/fail and the first mismatch per op; any failure exits nonzero.
A sample whose reference raises (e.g. a reduction over a zero-size dim) is skipped; a
dtype the kernel refuses (it reports "unsupported dtype") is left out of that op's run.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import click
import numpy as np

SHAPES = [(), (0,), (5,), (3, 4), (2, 3, 4)]
DTYPES = ["float32", "float64", "int32", "int64"]


@dataclass
class OpReport:
    key: str
    dtypes: list = field(default_factory=list)
    samples: int = 0
    skipped: int = 0
    failures: dict = field(default_factory=dict)  # check -> first mismatch

    def fail(self, check: str, message: str) -> None:
        self.failures.setdefault(check, message)

    @property
    def ok(self) -> bool:
        return not self.failures and self.samples > 0


def _tensor_samples(torch, shape, dtype, gen):
    t = torch.randn(shape, generator=gen, dtype=torch.float64) * 10
    yield t.to(getattr(torch, dtype))
    if shape == (5,):
        if dtype.startswith("float"):
            yield torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan")],
                               dtype=getattr(torch, dtype))
        else:
            yield torch.tensor([0, -1, 1, 2**20, -(2**20)], dtype=getattr(torch, dtype))


def _scalar_choices(arg, rank):
    from opforge.schema import BaseType, ListType, OptionalType

    t = arg.type.elem if isinstance(arg.type, OptionalType) else arg.type
    if t in (BaseType("int"), BaseType("SymInt")):
        return [0, -1] if rank else [0]
    if t == BaseType("Scalar"):
        return [2, 0.5]
    if t == BaseType("float"):
        return [0.5]
    if t == BaseType("bool"):
        return [False, True]
    if isinstance(t, ListType) and t.elem in (BaseType("int"), BaseType("SymInt")):
        return [[0], [-1], []] if rank else [[]]
    if isinstance(arg.type, OptionalType):
        return [None]
    return None


def _samples(torch, opdef, gen):
    """(dtype, functional args) samples: every tensor argument gets the same shape/dtype."""
    args = opdef.functional.arguments.flat
    for dtype in DTYPES:
        for shape in SHAPES:
            for tensor in _tensor_samples(torch, shape, dtype, gen):
                choices = []
                for a in args:
                    if str(a.type).startswith("Tensor"):
                        choices.append([tensor])
                    else:
                        options = _scalar_choices(a, len(shape))
                        if options is None:
                            return
                        choices.append(options)
                for combo in itertools.islice(itertools.product(*choices), 6):
                    yield dtype, list(combo)


def _as_list(result):
    return list(result) if isinstance(result, (tuple, list)) else [result]


def _compare(got: np.ndarray, want: np.ndarray) -> str | None:
    if got.shape != want.shape:
        return f"shape {got.shape} vs {want.shape}"
    if got.dtype.kind == "f":
        tol = 1e-4 if got.dtype == np.float32 else 1e-10
        close = np.isclose(got, want, rtol=tol, atol=tol, equal_nan=True)
    else:
        close = got == want
    if not np.all(close):
        i = np.argwhere(~close)[0] if got.ndim else ()
        return f"at {tuple(int(v) for v in i)}: {got[tuple(i)]!r} vs {want[tuple(i)]!r}"
    return None


def check_op(torch, opdef, native_kernel, runtime_kernel, seed: int) -> OpReport:
    from torch._subclasses.fake_tensor import FakeTensorMode

    from opforge.manifest import resolve_reference

    report = OpReport(opdef.out_key)
    reference = resolve_reference(opdef.python_impl, what="python implementation",
                                  source=opdef.source)
    ns, name = opdef.namespace, opdef.functional.name.name
    overload = opdef.functional.name.overload or "default"
    eager = getattr(getattr(getattr(torch.ops, ns), name), overload)
    refused: set[str] = set()
    gen = torch.Generator().manual_seed(seed)
    for dtype, args in _samples(torch, opdef, gen):
        if dtype in refused:
            continue
        where = f"{dtype} {tuple(args[0].shape)} args={[a for a in args[1:]]}"
        try:
            want = _as_list(reference(*args) if reference else eager(*args))
        except Exception:  # the reference refuses the sample: not a test case
            report.skipped += 1
            continue
        with FakeTensorMode() as mode:
            fake_args = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
            try:
                fakes = _as_list(eager(*fake_args))
            except Exception as e:
                report.fail("fake", f"{where}: fake raised {type(e).__name__}: {e}")
                continue
        meta = [(tuple(f.shape), f.dtype) for f in fakes]
        real = [(tuple(w.shape), w.dtype) for w in want]
        fake_problem = f"{where}: fake {meta} vs real {real}" if meta != real else None
        np_args = [a.numpy() if isinstance(a, torch.Tensor) else a for a in args]
        outs = [np.empty(s, dtype=torch.empty((), dtype=d).numpy().dtype) for s, d in meta]
        from opforge.errors import KernelError

        try:
            native_kernel(*np_args, *outs)
        except KernelError as e:
            if "dtype" in str(e):
                refused.add(dtype)  # the kernel does not take this dtype: no check of it
                continue
            report.fail("native", f"{where}: {e}")
            continue
        if fake_problem:
            report.fail("fake", fake_problem)
        if dtype not in report.dtypes:
            report.dtypes.append(dtype)
        report.samples += 1
        for got, w in zip(outs, want):
            problem = _compare(got, w.numpy().astype(got.dtype))
            if problem:
                report.fail("native", f"{where}: native vs reference {problem}")
        runtime_outs = [np.empty_like(o) for o in outs]
        runtime_kernel(*np_args, *runtime_outs)
        eager_outs = [e.numpy() for e in _as_list(eager(*args))]
        for got, w in zip(runtime_outs, eager_outs):
            problem = _compare(got, w)
            if problem:
                report.fail("eager", f"{where}: runtime vs eager {problem}")
    return report


@click.command("check")
@click.argument("manifest", type=click.Path(dir_okay=False))  # or a module: load_definitions
@click.option("--kernels", "library", required=True, type=click.Path(exists=True, dir_okay=False),
              help="The compiled kernel library (from `opforge build`).")
@click.option("--op", "ops", multiple=True, help="Check only this op (ns::op); repeatable.")
@click.option("--seed", default=0, show_default=True, help="Seed of the sample values.")
def check(manifest, library, ops, seed) -> None:
    """Check compiled kernels: fake vs real shapes, native vs reference, eager vs runtime."""
    import torch
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from opforge.manifest import load_definitions
    from opforge.runtime import KernelRegistry
    from opforge.runtime.native import load_library
    from opforge.torch_bridge.native_eager import use_native_library

    console = Console()
    console.width = max(console.width, 150)
    defs = [d for d in load_definitions(manifest, api="opforge check") if not d.is_aten]
    native = use_native_library(library, manifest=defs, command="opforge check")
    registry = KernelRegistry.portable()
    load_library(library, registry)
    served = set(native.keys())
    selected = [d for d in defs if d.out_key in served and (not ops or d.name in ops)]
    if not selected:
        raise click.ClickException(f"no op of {manifest} is served by {library}")
    table = Table("op", "dtypes", "samples", "fake vs real", "native vs reference",
                  "eager vs runtime", "first mismatch", title=f"opforge check {escape(library)}")
    for column in table.columns[:6]:
        column.no_wrap = True
    failed = 0
    mark = {True: "[green]pass", False: "[red]FAIL"}
    for d in selected:
        r = check_op(torch, d, native.kernel(d.out_key), registry.lookup(d.out_key).fn, seed)
        failed += not r.ok
        first = next(iter(r.failures.values()), "" if r.samples else "no sample ran")
        table.add_row(escape(r.key), ", ".join(r.dtypes) or "-", f"{r.samples} (+{r.skipped} n/a)",
                      mark["fake" not in r.failures], mark["native" not in r.failures and r.samples > 0],
                      mark["eager" not in r.failures], escape(first[:120]))
    console.print(table)
    if failed:
        raise click.ClickException(f"{failed} of {len(selected)} op(s) failed the check")
    console.print(f"[bold green]check: {len(selected)} op(s) passed")
