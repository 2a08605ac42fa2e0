"""The "missing operator" report: every unresolved op of a program, at once, with fixes.

The runtime's counterpart of ``opforge.export``'s kernel check: an op that reaches the
device without a kernel is reported at load with where a kernel could come from, never as
a failure in the middle of a run.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field

from opforge.errors import MissingKernelError
from opforge.runtime.registry import KernelRegistry

__all__ = ["MissingOp", "missing_kernel_error"]


@dataclass
class MissingOp:
    """One operator key no kernel serves, and where the program uses it."""

    key: str
    uses: dict[str, list[int]] = field(default_factory=dict)  # method -> instruction indices
    dtypes: list[str] = field(default_factory=list)

    def add(self, method: str, instruction: int, dtype_key: str) -> None:
        self.uses.setdefault(method, []).append(instruction)
        if dtype_key not in self.dtypes:
            self.dtypes.append(dtype_key)

    def where(self) -> str:
        return "; ".join(
            f"method {m!r} instruction{'s' if len(ix) > 1 else ''} "
            + ", ".join(str(i) for i in ix) for m, ix in self.uses.items())


def _hints(op: MissingOp, registry: KernelRegistry, mode: str) -> list[str]:
    key = op.key
    namespace = key.split("::", 1)[0]
    hints = []
    present = registry.kernels(key)
    if present:
        dtypes = sorted({k.dtype_key for k in present})
        hints.append(f"kernels exist only for dtype(s) {', '.join(dtypes)}: register a "
                     "'default' kernel or one for the dtype(s) above")
    near = difflib.get_close_matches(key, registry.keys(), n=3, cutoff=0.75)
    if near:
        hints.append("near names in the registry: " + ", ".join(f"`{n}`" for n in near)
                     + " (an overload mismatch? re-export with the same kernel set)")
    if namespace != "aten":
        hints.append("build a native library from the op's manifest (`opforge build "
                     "MANIFEST.yaml`) and load it: `--kernels LIB` / "
                     "`load(..., kernels=[LIB])`")
        hints.append("register a NumPy kernel: `registry.register('ns::op.overload', fn, "
                     "origin=..., target='portable')` inside a function `pkg.mod:register"
                     "(registry)`, then pass `--kernels pkg.mod:register` / "
                     "`load(..., kernels=['pkg.mod:register'])`")
    if mode == "aten":
        if namespace != "aten":
            hints.append(f"ATen mode runs torch.ops.{key.replace('::', '.')}: register the op "
                         "with torch first (opforge.torch_bridge.register, e.g. "
                         "opforge.examples.my_ops.register_examples())")
        else:
            hints.append("this torch build has no such overload: re-export with this torch "
                         "version")
    else:
        hints.append("run in ATen mode (`--mode aten` / `mode='aten'`), where PyTorch's own "
                     "kernels run every op torch knows")
    return hints


def missing_kernel_error(api: str, missing: list[MissingOp], registry: KernelRegistry,
                         mode: str) -> MissingKernelError:
    """One ``MissingKernelError`` listing every missing op (``.missing`` holds the list).

    Fixes that apply to every missing op are written once, after the list.
    """
    hints = [_hints(op, registry, mode) for op in missing]
    common = [h for h in hints[0] if all(h in other for other in hints[1:])] \
        if len(missing) > 1 else []
    lines = []
    for n, (op, own) in enumerate(zip(missing, hints), 1):
        own = [h for h in own if h not in common]
        fixes = "".join(f"\n       {chr(ord('a') + j)}) {h}" for j, h in enumerate(own))
        lines.append(f"  {n}. `{op.key}` ({op.where()}; dtype {', '.join(op.dtypes)})"
                     + (f" — fixes:{fixes}" if fixes else ""))
    if common:
        lines.append("  fixes for all of them:" + "".join(
            f"\n       {chr(ord('a') + j)}) {h}" for j, h in enumerate(common)))
    error = MissingKernelError(
        f"`{api}`: {len(missing)} operator(s) have no kernel in registry {registry.name!r} "
        f"(mode {mode!r}) — valid: a kernel for every operator of every method — missing:\n"
        + "\n".join(lines)
    )
    error.missing = missing
    return error
