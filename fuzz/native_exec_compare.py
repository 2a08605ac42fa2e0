"""How fuzz/native_exec_fuzz.py compares the native runtime's outputs with the lean
runtime's, and which programs make a difference unspecified (see that module's docstring).
"""

from __future__ import annotations

import math

import numpy as np

import opforge.program as P

RTOL, ATOL = 1e-4, 1e-5  # float outputs of NumPy and the portable kernels (see the docstring)


def _compare(a, b) -> str:
    """'exact', 'close' or 'differ: ...' for one call's native and lean outputs."""
    if len(a) != len(b):
        return f"differ: {len(a)} outputs against {len(b)}"
    verdict = "exact"
    for i, (x, y) in enumerate(zip(a, b)):
        if not isinstance(x, np.ndarray) or not isinstance(y, np.ndarray):
            if x == y or (isinstance(x, float) and isinstance(y, float) and math.isnan(x)
                          and math.isnan(y)):
                continue
            return f"differ: output {i}: {x!r} against {y!r}"
        if x.shape != y.shape or x.dtype != y.dtype:
            return f"differ: output {i}: {x.dtype}{x.shape} against {y.dtype}{y.shape}"
        if np.array_equal(x, y, equal_nan=x.dtype.kind in "fc"):
            continue
        if x.dtype.kind not in "fc":
            return f"differ: output {i}: {int(np.sum(x != y))} of {x.size} elements"
        finite = np.isfinite(y)
        scale = float(np.max(np.abs(y[finite]), initial=1.0))
        with np.errstate(all="ignore"):
            if not np.allclose(x, y, rtol=RTOL, atol=ATOL * max(scale, 1.0), equal_nan=True):
                worst = float(np.nanmax(np.abs(x.astype(np.float64) - y)))
                return f"differ: output {i}: max |native - lean| {worst:g} (scale {scale:g})"
        verdict = "close"
    return verdict


def _touches(method: P.Method) -> dict[int, list[int]]:
    """Value index: the instructions reading or writing it (a list's items through it)."""
    out: dict[int, list[int]] = {}
    for k, ins in enumerate(method.instructions):
        if type(ins) is P.Move:
            used = [ins.src, ins.dst]
        else:
            used = list(getattr(ins, "args", ()) or ())
        for v in list(used):
            if 0 <= v < len(method.values):
                used += list(getattr(method.values[v], "items", ()) or ())
        for v in used:
            out.setdefault(v, []).append(k)
    return out


def aliased(method: P.Method) -> bool:
    """Whether a kernel's out is also one of its inputs, or two arena tensors whose lifetimes
    overlap share bytes (a placement no planner makes): what each runtime computes then
    depends on its order of reads and writes and on whether it reads an input from the
    caller's buffer or the arena, so outputs may differ."""
    state = {slot.value for slot in method.state}
    for ins in method.instructions:  # an out that is also an input (in place), but a state's
        args = getattr(ins, "args", None)  # update (a KV cache's index_put) as exported
        if type(ins) is P.KernelCall and args and args[-1] in args[:-1] and args[-1] not in state:
            return True
    touches = _touches(method)
    end = len(method.instructions)
    spans = []
    for v, value in enumerate(method.values):
        if type(value) is not P.TensorValue or type(value.storage) is not P.ArenaStorage:
            continue
        at = touches.get(v, [])
        first = -1 if v in method.inputs else min(at, default=end)
        last = end if v in method.outputs or v in {s.value for s in method.state} \
            else max(at, default=-1)
        try:
            nbytes = value.dtype.itemsize * math.prod(value.sizes)
        except Exception:  # noqa: BLE001 -- an odd dtype: its size unknown, assume aliasing
            return True
        start = value.storage.offset
        spans.append((value.storage.mem_id, start, start + nbytes, first, last, v))
    spans.sort()
    for i, (mem, lo, hi, first, last, _) in enumerate(spans):
        for mem2, lo2, hi2, first2, last2, _ in spans[i + 1:]:
            if mem2 != mem or lo2 >= hi:
                break
            if lo2 < hi and lo < hi2 and first <= last2 and first2 <= last:
                return True
    return False


def reads_unwritten(method: P.Method) -> bool:
    """Whether an arena tensor that is no input and no state is first used other than as
    a kernel's output (the trailing tensor arguments of an out variant, the first one
    excepted) or a Move's destination: a read of bytes nothing wrote, which hold whatever
    the runtime left there (the lean runtime copies inputs into the arena, the native one
    may read them from the caller's buffer)."""
    seen = set(method.inputs) | {s.value for s in method.state}

    def tensor(v: int) -> bool:
        return 0 <= v < len(method.values) and type(method.values[v]) in (
            P.TensorValue, P.TensorListValue)

    code = method.instructions
    last_written = {}  # value: the last instruction whose last argument it is
    for i, ins in enumerate(code):
        if getattr(ins, "args", None):
            last_written[ins.args[-1]] = i
    for i, ins in enumerate(code):
        if type(ins) is P.Move:
            reads, writes = [ins.src], [ins.dst]
        else:
            args = list(getattr(ins, "args", ()) or ())
            k = len(args)
            while k > 1 and tensor(args[k - 1]):
                k -= 1
            # the last argument is written; the trailing tensors before it too, unless a
            # later instruction writes them (then this one reads them first)
            writes = [v for j, v in enumerate(args[k:], k)
                      if j == len(args) - 1 or last_written.get(v, -1) <= i]
            reads = list(args[:k]) + [v for v in args[k:] if v not in writes]
        for v in reads:
            if v in seen or not 0 <= v < len(method.values):
                continue
            value = method.values[v]
            if type(value) is P.TensorValue and type(value.storage) is P.ArenaStorage:
                return True
        seen.update(writes)
    return False



def compare_calls(ran: list, reference: list, definitions: dict) -> str | None:
    """The comparison of one case: the native record against the lean one (both lists of
    (method, call, status, value) over the same calls), ``definitions`` the program's
    methods; None when no call ran on either."""
    worst = None
    for (name, k, s, v), (_, _, ls, lv) in zip(ran, reference):
        if (s == "ok") != (ls == "ok"):
            tag = "lean_stricter" if s == "ok" else "native_stricter"
            return (f"{tag}: {name} call {k}: native "
                    f"{'ran' if s == 'ok' else v}, lean {'ran' if ls == 'ok' else lv}")
        if s == "ok":
            verdict = _compare(v, lv)
            if verdict.startswith("differ"):
                m = definitions.get(name)
                if m is not None and (aliased(m) or reads_unwritten(m)):
                    return f"differ_unspecified: {verdict[8:]} ({name} call {k})"
                return f"{verdict} ({name} call {k})"
            worst = "close" if verdict == "close" or worst == "close" else "exact"
    return worst
