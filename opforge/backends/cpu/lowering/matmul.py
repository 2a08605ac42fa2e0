"""mm, bmm, addmm, matmul and linear on oneDNN's matmul (constant weights reordered once);
linear on integer weights on the engine's own kernel (``int_weights.py``).
"""

from __future__ import annotations

from opforge.backends.partition import op_name
from opforge.backends.cpu.lowering.int_weights import lower_linear
from opforge.backends.cpu.lowering.core import (
    SYMBOLIC_SIZES,
    LOWERINGS, Lowering, Unsupported, _is_one, _need_f32, _val, known, row_major, same,
)


def lower_mm(L: Lowering, node, args, kwargs):
    _need_f32(node)
    name = op_name(node).split(".")[0]
    fake = _val(node)
    if name == "aten::addmm":
        beta = kwargs.get("beta", args[3] if len(args) > 3 else 1)
        alpha = kwargs.get("alpha", args[4] if len(args) > 4 else 1)
        if beta != 1 or alpha != 1:
            raise Unsupported("op", "aten::addmm with alpha/beta != 1; stays on the kernels")
    lowered = lower_linear(L, node, name, args)  # integer weights read packed
    if lowered is not None:
        return lowered
    if name == "aten::addmm":
        bias, a, b = args[:3]
    elif name == "aten::linear":
        a, w, bias = args[0], args[1], args[2] if len(args) > 2 else None
        if not (isinstance(w, tuple) and w[0] == "c"):
            raise Unsupported("layout", "aten::linear with run-time weights")
        b = ("c", w[1].t())  # materialize makes it contiguous (one copy, shared by name)
    else:
        a, b = args[:2]
        bias = None
    ta, tb = _matmul_operand(L, L.materialize(a)), _matmul_operand(L, L.materialize(b))
    sa, sb = L.spec(ta), L.spec(tb)
    flat = _flat_rows(sa) if len(sb.dims) == 2 and len(sa.dims) > 2 else None
    if flat is not None:
        # linear on a batch whose rows are one dense run: one 2-d matmul [rows, K] x [K, N]
        # (a 3-d matmul with broadcast weights ran oneDNN's batched kernel: 7x slower on a
        # transformer's [1, 128, 256] x [256, 768] projection)
        rows, k = flat
        out = L.new_tensor(fake.dtype, fake.shape)
        ins = [L.alias(ta, (rows, k), (sa.strides[-2], sa.strides[-1])), tb]
        if bias is not None:
            tbias = L.materialize(bias)
            sbias = L.spec(tbias)
            if len(sbias.dims) > 2 or any(d != 1 for d in sbias.dims[:-1]):
                raise Unsupported("shape", "a linear bias that is not one row")
            n = sbias.dims[-1]
            ins.append(L.alias(tbias, (1, n), (0, sbias.strides[-1])))
        L.op("matmul", ins, [L.alias(out, (rows, fake.shape[-1]), (fake.shape[-1], 1))],
             name=name.split("::")[1])
        return ("t", out)
    if len(sa.dims) != len(sb.dims):
        if len(sb.dims) == 2 and len(sa.dims) > 2:  # linear on a batch: broadcast weights
            tb = L.alias(tb, (1,) * (len(sa.dims) - 2) + sb.dims, (0,) * (len(sa.dims) - 2) + sb.strides)
        else:
            raise Unsupported("shape", "matmul operands of different ranks")
    ins = [ta, tb]
    if bias is not None:
        tbias = L.materialize(bias)
        sbias = L.spec(tbias)
        rank = len(fake.shape)
        dims = (1,) * (rank - len(sbias.dims)) + tuple(sbias.dims)
        tbias = L.alias(tbias, dims, (0,) * (rank - len(sbias.dims)) + tuple(sbias.strides))
        ins.append(tbias)
    out = L.new_tensor(fake.dtype, fake.shape)
    L.op("matmul", ins, [out], name=name.split("::")[1])
    return ("t", out)


def _flat_rows(t) -> tuple[int, int] | None:
    """(rows, K) when every dimension before the last of ``t`` steps as one row-major run of
    rows (stride of dim i = stride of dim i+1 × its size, size-1 dims anywhere), else None."""
    k = t.dims[-1]
    rows, step = 1, t.strides[-2]
    for d, st in zip(reversed(t.dims[:-1]), reversed(t.strides[:-1])):
        if _is_one(d):
            continue
        if not same(st, step):  # (symbolic sizes: when it holds for every value)
            return None
        rows, step = rows * d, st * d
    return rows, k


def _matmul_operand(L: Lowering, tid: int) -> int:
    """``tid`` when oneDNN's matmul takes its layout fast (rows or columns contiguous, batch
    dims outermost and dense), else a dense copy (oneDNN would run a slower kernel: with
    gapped batch dims its brgemm gives way to a plain gemm, 1.8-2.7× slower on attention's
    heads). A view whose columns are contiguous (a transposed key, ``kᵀ``) is copied with
    its columns contiguous: the copy then reads and writes runs (2.8× faster than a
    transposing one on ``[4, 64, 128]``) and the matmul reads the copy transposed, at
    brgemm's speed."""
    t = L.spec(tid)
    if len(t.dims) < 2 or t.role == "const":
        return tid if t.role != "const" or same(t.strides, row_major(t.dims)) else L.contiguous(tid)
    m, k = t.dims[-2:]
    sm, sk = t.strides[-2:]
    inner_ok = (same(sk, 1) and known(lambda: sm >= k)) or (same(sm, 1) and known(lambda: sk >= m))
    span = m * k
    batch_ok = True
    for d, s in zip(reversed(t.dims[:-2]), reversed(t.strides[:-2])):
        if not _is_one(d) and not same(s, span):
            batch_ok = False
        span *= d
    if inner_ok and batch_ok:
        return tid
    if not (same(sm, 1) and not same(sk, 1)):
        return L.contiguous(tid)
    out = L.new_tensor(t.dtype, t.dims, strides=(*row_major(t.dims)[:-2], 1, m))
    L.copy(tid, out)
    return out


LOWERINGS["aten::addmm"] = lower_mm
LOWERINGS["aten::mm"] = lower_mm
LOWERINGS["aten::bmm"] = lower_mm
LOWERINGS["aten::matmul"] = lower_mm
LOWERINGS["aten::linear"] = lower_mm
SYMBOLIC_SIZES.add(lower_mm)
