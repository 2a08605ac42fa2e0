"""After lowering: ops nobody reads are pruned, and elementwise ops after a convolution,
matmul or binary become oneDNN post-ops (an eltwise chain starts as a binary with a zero).
"""

from __future__ import annotations

import torch
import torch.fx

from opforge.backends.cpu.lowering.core import (
    B_ADD, B_DIV, B_MAX, B_MIN, B_MUL, B_SUB, Plan, TensorSpec, _post_operand_misread, same,
)


FUSABLE = ("conv", "deconv", "matmul", "binary")


def prune(plan: Plan) -> None:
    """Ops whose results nobody reads are dropped (a dequantize an int8 op made redundant),
    and temporaries no op reads or writes any more take no memory."""
    keep = set(plan.outputs)
    changed = True
    while changed:
        changed = False
        read = {t for op in plan.ops for t in op["in"]} | {p[4] for op in plan.ops for p in op["post"] if p[0] == 1}
        read |= {t.base for t in plan.tensors if t.role == "alias"} | keep
        for i, op in enumerate(plan.ops):
            if op["kind"] in ("kernel", "package"):
                continue  # foreign code: kept as written
            if all(plan.tensors[t].role == "temp" and t not in read for t in op["out"]):
                del plan.ops[i]
                changed = True
                break
    used = {t for op in plan.ops for t in (*op["in"], *op["out"])}
    used |= {p[4] for op in plan.ops for p in op["post"] if p[0] == 1}
    used |= {t.base for t in plan.tensors if t.role == "alias"}
    for i, t in enumerate(plan.tensors):
        if t.role == "temp" and i not in used:
            t.role = "dead"


def _root(plan: Plan, tid: int) -> int:
    seen = 0
    while plan.tensors[tid].role == "alias" and seen < len(plan.tensors):
        tid, seen = plan.tensors[tid].base, seen + 1
    return tid


def _last_write(plan: Plan, tid: int) -> int:
    """The index of the last op that writes any part of ``tid``'s storage (a tensor, its
    base, or another alias of the same base: a concatenation is written by several copies)."""
    root = _root(plan, tid)
    return max((k for k, op in enumerate(plan.ops) if any(_root(plan, t) == root for t in op["out"])),
               default=-1)


def _readers(plan: Plan, tid: int) -> list[int]:
    return [i for i, op in enumerate(plan.ops)
            if tid in op["in"] or any(p[0] == 1 and p[4] == tid for p in op["post"])]


MAX_POST_OPS = 16


def fuse(plan: Plan) -> None:
    """Post-op fusion. A chain of elementwise ops that no convolution/matmul/binary absorbs
    starts as ``binary add`` of a broadcast zero with the first op as a post-op: oneDNN runs
    a binary with an eltwise chain as one fast pass, while an eltwise primitive with
    post-ops falls back to its reference kernel."""
    _fuse(plan)
    while True:
        first = next((op for op in plan.ops if op["kind"] == "eltwise" and not op["post"]
                      and _starts_chain(plan, op)), None)
        if first is None:
            return
        src = plan.tensors[first["in"][0]]
        zero = _zero_constant(plan, src.dtype, len(src.dims))
        first.update(kind="binary", post=[[0, first["ia"][0], first["fa"][0], first["fa"][1], -1]],
                     ia=[B_ADD], fa=[])
        first["in"] = [first["in"][0], zero]
        _fuse(plan)


def _starts_chain(plan: Plan, op: dict) -> bool:
    """An eltwise op whose result only another same-layout eltwise op reads (a lone eltwise
    stays an eltwise primitive, which is as fast)."""
    t = op["out"][0]
    spec = plan.tensors[t]
    readers = _readers(plan, t)
    if len(readers) != 1 or spec.role != "temp" or any(
            x.role == "alias" and x.base == t for x in plan.tensors):
        return False
    nxt = plan.ops[readers[0]]
    src = plan.tensors[op["in"][0]]
    return (nxt["kind"] == "eltwise" and same(src.strides, spec.strides)
            and same(plan.tensors[nxt["out"][0]].strides, spec.strides))


def _zero_constant(plan: Plan, dtype, rank: int) -> int:
    dims = (1,) * max(rank, 1)
    plan.tensors.append(TensorSpec(dtype, dims, (1,) * len(dims), "const",
                                   data=torch.zeros(dims, dtype=dtype).numpy().tobytes()))
    return len(plan.tensors) - 1


def _fuse(plan: Plan) -> None:
    aliased = {t.base for t in plan.tensors if t.role == "alias"}
    changed = True
    while changed:
        changed = False
        for i, op in enumerate(plan.ops):
            if op["kind"] not in FUSABLE or len(op["out"]) != 1 or len(op["post"]) >= MAX_POST_OPS:
                continue
            t = op["out"][0]
            spec = plan.tensors[t]
            if spec.role != "temp" or t in aliased:
                continue
            readers = _readers(plan, t)
            if len(readers) != 1:
                continue
            j = readers[0]
            nxt = plan.ops[j]
            out_spec = plan.tensors[nxt["out"][0]] if nxt["out"] else None
            if out_spec is None or not same(out_spec.dims, spec.dims) \
                    or not same(out_spec.strides, spec.strides) \
                    or out_spec.dtype != spec.dtype:
                continue  # oneDNN's fast kernels write the layout they read
            if nxt["kind"] == "eltwise" and not nxt["post"]:
                op["post"].append([0, nxt["ia"][0], nxt["fa"][0], nxt["fa"][1], -1])
            elif nxt["kind"] == "binary" and not nxt["post"] and nxt["ia"][0] in (B_ADD, B_MUL, B_MAX, B_MIN, B_SUB, B_DIV):
                other = nxt["in"][1] if nxt["in"][0] == t else nxt["in"][0]
                if nxt["in"][0] != t and nxt["ia"][0] in (B_SUB, B_DIV):
                    continue  # other - t: not expressible as a post-op on t
                if other == t:
                    continue
                if _last_write(plan, other) > i:
                    continue  # computed after op: not available to it
                if any(p[0] == 1 for p in op["post"]) and op["kind"] == "binary":
                    continue
                if _post_operand_misread(spec.dims, plan.tensors[other].dims):
                    continue
                op["post"].append([1, nxt["ia"][0], 0.0, 0.0, other])
            else:
                continue
            op["out"] = list(nxt["out"])
            op["name"] += "+" + nxt["name"]
            op["_nodes"] = op.get("_nodes", []) + nxt.get("_nodes", [])  # one group
            spec.role = "dead"
            del plan.ops[j]
            changed = True
            break
