"""After lowering: ops nobody reads are pruned, and elementwise ops after a convolution,
matmul or binary become oneDNN post-ops (an eltwise chain starts as a binary with a zero).
"""

from __future__ import annotations

import math

import torch
import torch.fx

from opforge.backends.cpu.lowering.core import (
    B_ADD, B_DIV, B_MAX, B_MIN, B_MUL, B_SUB, Plan, TensorSpec, _post_operand_misread,
    row_major, same,
)
from opforge.backends.cpu.lowering.layouts import binary_post_broadcast, matmul_post_broadcast


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


def _takes_as_post_op(nxt: dict, t: int) -> bool:
    """Binary op ``nxt`` reading ``t`` can be a binary post-op on t's producer: an operation
    a post-op runs, with t its first operand where the order matters (``c - t`` is none)."""
    return (nxt["kind"] == "binary" and t in nxt["in"]
            and nxt["ia"][0] in (B_ADD, B_MUL, B_MAX, B_MIN, B_SUB, B_DIV)
            and (nxt["in"][0] == t or nxt["ia"][0] not in (B_SUB, B_DIV)))


def _starts_chain(plan: Plan, op: dict) -> bool:
    """An eltwise op whose result only another same-layout eltwise op, or a binary that can
    take it as its first operand, reads (a lone eltwise stays an eltwise primitive, which is
    as fast)."""
    t = op["out"][0]
    spec = plan.tensors[t]
    readers = _readers(plan, t)
    if len(readers) != 1 or spec.role != "temp" or any(
            x.role == "alias" and x.base == t for x in plan.tensors):
        return False
    nxt = plan.ops[readers[0]]
    src = plan.tensors[op["in"][0]]
    joins = nxt["kind"] == "eltwise" or (
        _takes_as_post_op(nxt, t) and nxt["in"].count(t) == 1
        and same(plan.tensors[nxt["in"][0]].dims, plan.tensors[nxt["in"][1]].dims))
    return (joins and same(src.strides, spec.strides)
            and same(plan.tensors[nxt["out"][0]].strides, spec.strides))


def _zero_constant(plan: Plan, dtype, rank: int) -> int:
    dims = (1,) * max(rank, 1)
    plan.tensors.append(TensorSpec(dtype, dims, (1,) * len(dims), "const",
                                   data=torch.zeros(dims, dtype=dtype).numpy().tobytes()))
    return len(plan.tensors) - 1


def _reshapes(plan: Plan, t: int) -> list[int] | None:
    """The tensors that are ``t``'s storage: its root (a temporary), and every alias of that
    root when each is a whole, row-major reshape of a row-major root (offset 0, as many
    elements); None when a view is anything else (a slice, a transpose, a broadcast), which
    a post-op could not follow."""
    root = _root(plan, t)
    rspec = plan.tensors[root]
    if rspec.role != "temp":
        return None
    aliases = [k for k, x in enumerate(plan.tensors) if x.role == "alias" and k != root
               and _root(plan, k) == root]
    if not aliases:
        return [root]
    if not _static(rspec) or rspec.strides != row_major(rspec.dims):
        return None  # (a reshape of symbolic sizes: kept apart)
    size = math.prod(rspec.dims)
    for k in aliases:
        x = plan.tensors[k]
        if not _static(x) or x.offset != 0 or math.prod(x.dims) != size or \
                x.strides != row_major(x.dims):
            return None
    return [root, *aliases]


def _static(spec: TensorSpec) -> bool:
    return all(type(v) is int for v in (*spec.dims, *spec.strides, spec.offset))


def _fuse(plan: Plan) -> None:
    changed = True
    while changed:
        changed = False
        for i, op in enumerate(plan.ops):
            if op["kind"] not in FUSABLE or len(op["out"]) != 1 or len(op["post"]) >= MAX_POST_OPS:
                continue
            t = op["out"][0]
            spec = plan.tensors[t]
            # the result's storage under any of its names: a reader of a whole reshape of it
            # (a linear's rows read as [batch, seq, n], a view before an activation) reads it
            members = _reshapes(plan, t)
            if members is None:
                continue
            readers = sorted({r for m in members for r in _readers(plan, m)})
            if len(readers) != 1:
                continue
            j = readers[0]
            nxt = plan.ops[j]
            read = next(m for m in members if m in nxt["in"] or any(
                p[0] == 1 and p[4] == m for p in nxt["post"]))
            out_spec = plan.tensors[nxt["out"][0]] if nxt["out"] else None
            rspec = plan.tensors[read]
            if out_spec is None or not same(out_spec.dims, rspec.dims) \
                    or not same(out_spec.strides, rspec.strides) \
                    or out_spec.dtype != spec.dtype:
                continue  # oneDNN's fast kernels write the layout they read
            if nxt["kind"] == "eltwise" and not nxt["post"]:
                op["post"].append([0, nxt["ia"][0], nxt["fa"][0], nxt["fa"][1], -1])
            elif _takes_as_post_op(nxt, read) \
                    and len(op["post"]) + 1 + len(nxt["post"]) <= MAX_POST_OPS:
                # nxt's own post-ops follow it (a chain fused before op's start became a
                # binary: an elementwise chain of ten ops is then one pass, not three)
                if nxt["post"] and not same(rspec.dims, spec.dims):
                    continue  # nxt's post-op operands are in another shape than op's result
                other = nxt["in"][1] if nxt["in"][0] == read else nxt["in"][0]
                operands = [other] + [p[4] for p in nxt["post"] if p[0] == 1]
                if any(x in members for x in operands):
                    continue
                if any(_last_write(plan, x) > i for x in operands):
                    continue  # computed after op: not available to it
                if any(_post_operand_misread(spec.dims, plan.tensors[x].dims) for x in operands[1:]):
                    continue
                if not same(rspec.dims, spec.dims):
                    other = _whole_view(plan, other, spec.dims)  # the operand as op's result
                    if other is None:
                        continue
                if _post_operand_misread(spec.dims, plan.tensors[other].dims):
                    continue
                takes = {"matmul": matmul_post_broadcast, "binary": binary_post_broadcast}.get(op["kind"])
                if takes is not None and not all(
                        takes(spec.dims, plan.tensors[x].dims) for x in (other, *operands[1:])):
                    continue  # oneDNN would run its reference matmul or binary (layouts.py)
                op["post"] += [[1, nxt["ia"][0], 0.0, 0.0, other], *nxt["post"]]
            else:
                continue
            out = nxt["out"][0]
            if not same(out_spec.dims, spec.dims):  # nxt's result under op's shape (row-major)
                plan.tensors.append(TensorSpec(spec.dtype, spec.dims, row_major(spec.dims),
                                               "alias", base=out))
                out = len(plan.tensors) - 1
            op["out"] = [out]
            op["name"] += "+" + nxt["name"]
            op["_nodes"] = op.get("_nodes", []) + nxt.get("_nodes", [])  # one group
            plan.tensors[members[0]].role = "dead"
            del plan.ops[j]
            changed = True
            break


def _whole_view(plan: Plan, tid: int, dims) -> int | None:
    """``tid`` under ``dims`` (an alias), when it is row-major with as many elements."""
    spec = plan.tensors[tid]
    if not _static(spec) or math.prod(spec.dims) != math.prod(dims) or \
            spec.strides != row_major(spec.dims):
        return None
    if tuple(spec.dims) == tuple(dims):
        return tid
    plan.tensors.append(TensorSpec(spec.dtype, tuple(dims), row_major(dims), "alias", base=tid))
    return len(plan.tensors) - 1
