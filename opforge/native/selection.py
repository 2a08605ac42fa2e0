"""Selective build: which operators (and which dtype kernels) go into a library.

ExecuTorch's three ways, plus dtypes:

* root ops: ``ops=["my_ops::mul3", "aten::add.out"]`` (op name or out overload key);
* the operators of program files: ``programs=["model.opf"]`` (their operator tables);
* everything in the manifest: the default when neither is given;
* ``dtypes=["Float"]``: keep only dtype-specific kernels (arg_meta) whose dtypes are all
  listed; fallback kernels (arg_meta: null) always stay.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Iterable

from opforge.errors import BuildError
from opforge.manifest import DTYPE_NAMES, OpDef

__all__ = ["Selection", "select_ops", "program_operators"]


@dataclass(frozen=True)
class Selection:
    opdefs: tuple[OpDef, ...]
    reason: str  # "all ops", "root ops", "programs ..."
    unserved: tuple[str, ...] = ()  # program operators the manifest has no kernels for


def program_operators(paths: Iterable[str | os.PathLike]) -> list[str]:
    """The operator keys (``ns::op.overload``) used by the methods of program files."""
    from opforge.program import load

    keys: dict[str, None] = {}
    for path in paths:
        program = load(path)
        for method in program.methods:
            for operator in method.operators:
                keys[operator.key] = None
    return list(keys)


def _names(opdef: OpDef) -> set[str]:
    names = {opdef.name, opdef.out_key, str(opdef.out.name), str(opdef.functional.name)}
    if opdef.is_aten:
        names |= {n.removeprefix("aten::") for n in list(names)}
    return names


def select_ops(opdefs: Iterable[OpDef], *, ops: Iterable[str] | None = None,
               programs: Iterable[str | os.PathLike] = (),
               dtypes: Iterable[str] | None = None) -> Selection:
    """Pick the OpDefs (and kernel bindings) a library is built from."""
    opdefs = list(opdefs)
    ops = list(ops or [])
    programs = list(programs)
    if not ops and not programs:
        chosen, reason, unserved = opdefs, "all ops (--include-all-ops)", []
    else:
        wanted: dict[str, str] = {}
        for op in ops:
            wanted[op] = "--op"
        used = program_operators(programs) if programs else []
        for key in used:
            wanted.setdefault(key, "--program")
        chosen, unserved = [], []
        for name, origin in wanted.items():
            match = [d for d in opdefs if name in _names(d)]
            if not match and origin == "--op":
                valid = ", ".join(d.name for d in opdefs) or "(none)"
                raise BuildError(f"`opforge build --op {name}`: {name} — not an operator of the "
                                 f"manifest — valid: {valid} — fix: spell it 'ns::op' as listed")
            if not match:
                unserved.append(name)
            for d in match:
                if d not in chosen:
                    chosen.append(d)
        chosen = [d for d in opdefs if d in chosen]  # manifest order
        reason = " and ".join(filter(None, [
            f"root ops {', '.join(ops)}" if ops else "",
            f"operators of {', '.join(map(str, programs))}" if programs else ""]))
    if dtypes is not None:
        dtypes = list(dtypes)
        bad = [t for t in dtypes if t not in DTYPE_NAMES]
        if bad:
            raise BuildError(f"`opforge build --dtype {bad[0]}`: unknown dtype {bad[0]!r} — valid: "
                             f"{', '.join(DTYPE_NAMES)} — fix: use the c10 name, e.g. Float")
        keep = set(dtypes)
        filtered = []
        for d in chosen:
            kernels = tuple(k for k in d.kernels if k.arg_meta is None
                            or all(m.dtype in keep for _, m in k.arg_meta))
            if kernels:
                filtered.append(replace(d, kernels=kernels))
        chosen = filtered
        reason += f", dtypes {', '.join(dtypes)}"
    return Selection(tuple(d for d in chosen if d.kernels), reason, tuple(unserved))
