"""Elementwise lowerings: oneDNN eltwise algorithms (relu ... hardswish), binary ops with
broadcasting, and the engine's generic loops (comparisons, where, masked_fill, fills).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
import torch
import torch.fx

from opforge.backends.partition import op_name
from opforge.backends.cpu.lowering.symbolic import is_symbolic_dim
from opforge.backends.cpu.lowering.core import (
    SYMBOLIC_SIZES, _is_one, same,
    ABS, B_ADD, B_DIV, B_MAX, B_MIN, B_MUL, B_SUB, CLIP, ELU, EW, EXP, GELU_ERF, GELU_TANH,
    GENERIC_DTYPES, HARDSIGMOID, HARDSWISH, LINEAR, LOG, LOGISTIC, LOWERINGS, Lowering, MISH,
    POW, RELU, SOFT_RELU, SQRT, SQUARE, SWISH, TANH, Unsupported, _broadcast_strides, _dense,
    _dense_operand, _need_f32, _out, _val, row_major,
)
from opforge.backends.cpu.lowering.layouts import (
    jit_binary_broadcast, jit_broadcast_expansion, merged_broadcast,
)


ELTWISE: dict[str, Callable] = {
    "aten::relu": lambda n, a: (RELU, 0.0, 0.0),
    "aten::tanh": lambda n, a: (TANH, 0.0, 0.0),
    "aten::sigmoid": lambda n, a: (LOGISTIC, 0.0, 0.0),
    "aten::exp": lambda n, a: (EXP, 0.0, 0.0),
    "aten::log": lambda n, a: (LOG, 0.0, 0.0),
    "aten::sqrt": lambda n, a: (SQRT, 0.0, 0.0),
    "aten::abs": lambda n, a: (ABS, 0.0, 0.0),
    "aten::neg": lambda n, a: (LINEAR, -1.0, 0.0),
    "aten::silu": lambda n, a: (SWISH, 1.0, 0.0),
    "aten::mish": lambda n, a: (MISH, 0.0, 0.0),
    "aten::hardswish": lambda n, a: (HARDSWISH, 1 / 6, 0.5),
    "aten::hardsigmoid": lambda n, a: (HARDSIGMOID, 1 / 6, 0.5),
    "aten::gelu": lambda n, a: (GELU_TANH if n.kwargs.get("approximate", a[1] if len(a) > 1 else "none") == "tanh" else GELU_ERF, 0.0, 0.0),
    "aten::leaky_relu": lambda n, a: (RELU, float(a[1]) if len(a) > 1 else 0.01, 0.0),
    "aten::hardtanh": lambda n, a: (CLIP, float(a[1]) if len(a) > 1 else -1.0, float(a[2]) if len(a) > 2 else 1.0),
    "aten::rsqrt": lambda n, a: (POW, 1.0, -0.5),
}


def _elu(node, a):
    alpha = float(a[1]) if len(a) > 1 else 1.0
    scale = float(a[2]) if len(a) > 2 else 1.0
    input_scale = float(a[3]) if len(a) > 3 else 1.0
    if scale != 1.0 or input_scale != 1.0:
        raise Unsupported("op", "aten::elu with scale/input_scale (selu): no single oneDNN eltwise; stays on the kernels")
    return (ELU, alpha, 0.0)


def _clamp(node, a):
    lo = a[1] if len(a) > 1 else node.kwargs.get("min")
    hi = a[2] if len(a) > 2 else node.kwargs.get("max")
    if isinstance(lo, tuple) or isinstance(hi, tuple):
        raise Unsupported("op", "aten::clamp with tensor bounds; stays on the kernels")
    return (CLIP, float("-inf") if lo is None else float(lo), float("inf") if hi is None else float(hi))


def _softplus(node, a):
    beta = float(a[1]) if len(a) > 1 else 1.0
    threshold = float(a[2]) if len(a) > 2 else 20.0
    if beta != 1.0:
        raise Unsupported("op", "aten::softplus with beta != 1; stays on the kernels")
    return (SOFT_RELU, 1.0, 0.0)


def _rsub(node, a):
    # other - alpha * x. Not only folded: the support check folds it on constant inputs,
    # but a partition can receive those as runtime inputs (bicubic interpolation's weights)
    other = a[1] if len(a) > 1 else None
    alpha = node.kwargs.get("alpha", a[2] if len(a) > 2 else 1)
    if not isinstance(other, (int, float)) or not isinstance(alpha, (int, float)):
        raise Unsupported("op", "aten::rsub of two tensors; stays on the kernels")
    return (LINEAR, -float(alpha), float(other))


ELTWISE["aten::elu"] = _elu
ELTWISE["aten::clamp"] = _clamp
ELTWISE["aten::softplus"] = _softplus
ELTWISE["aten::rsub"] = _rsub


def _clamp_tensors(L: Lowering, node, args, kwargs):
    """clamp with tensor bounds: max(x, min) then min(·, max), as binary ops."""
    lo = args[1] if len(args) > 1 else kwargs.get("min")
    hi = args[2] if len(args) > 2 else kwargs.get("max")
    fake = _val(node)
    value = args[0]
    for bound, alg, name in ((lo, B_MAX, "clamp_min"), (hi, B_MIN, "clamp_max")):
        if bound is None:
            continue
        src = L.materialize(value)
        b = L.materialize(bound) if isinstance(bound, tuple) else L.materialize(("c", torch.tensor(float(bound))))
        sa, sb = L.spec(src), L.spec(b)
        if tuple(sa.dims) != L.shape(fake) or sb.dtype != torch.float32:
            raise Unsupported("shape", "clamp whose bounds broadcast the input; stays on the kernels")
        if not _dense(sa):
            src, sa = L.contiguous(src), L.spec(L.contiguous(src))
        if tuple(sb.dims) == tuple(sa.dims) and sb.strides != sa.strides:
            like = L.new_tensor(sb.dtype, sb.dims, strides=sa.strides)
            L.copy(b, like)
            b, sb = like, L.spec(like)
        if len(sb.dims) < len(sa.dims):
            b = L.alias(b, (1,) * (len(sa.dims) - len(sb.dims)) + tuple(sb.dims),
                        (0,) * (len(sa.dims) - len(sb.dims)) + tuple(sb.strides))
        out = L.new_tensor(torch.float32, sa.dims, strides=sa.strides)
        L.op("binary", [src, b], [out], [alg], name=name)
        value = ("t", out)
    return value


def lower_eltwise(L: Lowering, node, args, kwargs):
    _need_f32(node)
    base = op_name(node).split(".")[0]
    if base == "aten::clamp" and any(isinstance(v, tuple) and len(v) == 2 and v[0] in "tc"
                                     for v in list(args[1:3]) + [kwargs.get("min"), kwargs.get("max")]):
        return _clamp_tensors(L, node, args, kwargs)
    alg, alpha, beta = ELTWISE[base](node, args)
    src = _dense_operand(L, L.materialize(args[0]))
    out = _out(L, node, strides=L.spec(src).strides)
    L.op("eltwise", [src], [out], [alg], [alpha, beta], name=base.split("::")[1])
    return ("t", out)


def lower_pow(L, node, args, kwargs):
    _need_f32(node)
    if not isinstance(args[1], (int, float)):
        raise Unsupported("op", "aten::pow with a tensor exponent; stays on the kernels")
    src = _dense_operand(L, L.materialize(args[0]))  # gaps send oneDNN to its reference loop
    out = _out(L, node, strides=L.spec(src).strides)
    if float(args[1]) == 2.0:
        L.op("eltwise", [src], [out], [SQUARE], [0.0, 0.0], name="square")
    else:
        L.op("eltwise", [src], [out], [POW], [1.0, float(args[1])], name="pow")
    return ("t", out)


BINARY = {"aten::add": B_ADD, "aten::sub": B_SUB, "aten::mul": B_MUL, "aten::div": B_DIV,
          "aten::maximum": B_MAX, "aten::minimum": B_MIN}


def lower_binary(L: Lowering, node, args, kwargs):
    base = op_name(node).split(".")[0]
    fake = _val(node)
    a, b = args[0], args[1]
    alpha = kwargs.get("alpha", args[2] if len(args) > 2 else 1)
    rounding = kwargs.get("rounding_mode")
    if rounding is not None:
        raise Unsupported("op", f"{base} with rounding_mode={rounding!r}; stays on the kernels")
    scalar_b = not (isinstance(b, tuple) and len(b) == 2 and b[0] in "tc")
    scalar_a = not (isinstance(a, tuple) and len(a) == 2 and a[0] in "tc")
    if fake.dtype == torch.float32 and not scalar_a:
        if scalar_b:  # x (op) scalar → linear
            # a gapped operand (one head of a fused QKV projection) sends oneDNN's eltwise
            # to its reference loop, 30x slower than a copy to dense plus the fast kernel
            src = _dense_operand(L, L.materialize(a))
            s = float(b)
            alg = {"aten::add": (LINEAR, 1.0, s * float(alpha)), "aten::sub": (LINEAR, 1.0, -s * float(alpha)),
                   "aten::mul": (LINEAR, s, 0.0), "aten::div": (LINEAR, 1.0 / s if s else float("inf"), 0.0)}.get(base)
            if alg is not None and not (base == "aten::div" and (s == 0 or not math.isfinite(1.0 / s))):
                if base == "aten::div" and s != 0 and 1.0 / s * s != 1.0:
                    alg = None  # 1/s inexact: x/s != x*(1/s) in float32; use the exact generic loop
                if alg is not None:
                    out = _out(L, node, strides=L.spec(src).strides)
                    L.op("eltwise", [src], [out], [alg[0]], [alg[1], alg[2]], name=base.split("::")[1])
                    return ("t", out)
        elif base in BINARY and float(alpha) == 1.0:
            ta, tb = L.materialize(a), L.materialize(b)
            sa, sb = L.spec(ta), L.spec(tb)
            if sa.dtype == sb.dtype == torch.float32:
                out_dims = L.shape(fake)
                if not same(sa.dims, out_dims) and same(sb.dims, out_dims) and base in (
                        "aten::add", "aten::mul", "aten::maximum", "aten::minimum"):
                    ta, tb, sa, sb, a, b = tb, ta, sb, sa, b, a
                if same(sa.dims, out_dims):
                    if not _dense(sa):
                        ta = L.contiguous(ta)
                        sa = L.spec(ta)
                    if same(sb.dims, out_dims) and not same(sb.strides, sa.strides):
                        # oneDNN's fast binary kernels want both operands in one layout
                        like = L.new_tensor(sb.dtype, sb.dims, strides=sa.strides)
                        L.copy(tb, like)
                        tb, sb = like, L.spec(like)
                    if len(sb.dims) < len(out_dims):  # oneDNN wants equal ranks
                        tb = L.alias(tb, (1,) * (len(out_dims) - len(sb.dims)) + tuple(sb.dims),
                                     (0,) * (len(out_dims) - len(sb.dims)) + tuple(sb.strides))
                    out = _out(L, node, strides=sa.strides)
                    note = _reference_note(L.spec(ta), L.spec(tb))
                    ins, outs = _jit_broadcast(L, ta, tb, out, b)
                    L.op("binary", ins, outs, [BINARY[base]], name=base.split("::")[1] + note)
                    return ("t", out)
    return lower_generic_ew(L, node, args, kwargs, base.split("::")[1], alpha)


# The one broadcast the lowering leaves on oneDNN's reference binary on purpose, named so
# (``opforge inspect`` / ``--explain`` and bench/external_check.py read the name).
REFERENCE_BINARY = (" (reference kernel: a broadcast oneDNN's jit binary does not take, on "
                    "symbolic sizes, where no rewrite holds for every size; Swin's shift mask "
                    "took 42.7 ms so, 0.1 ms rewritten at static sizes)")


def _reference_note(sa, sb) -> str:
    """``REFERENCE_BINARY`` when a binary of these (rank-aligned) operands has symbolic sizes
    and a broadcast ``_jit_broadcast`` cannot rewrite; else ""."""
    if all(type(v) is int for v in (*sa.dims, *sb.dims)):
        return ""
    kept = [same(bd, d) and not _is_one(d) for bd, d in zip(sb.dims, sa.dims)]
    return "" if all(kept) or jit_binary_broadcast(kept) else REFERENCE_BINARY


def _jit_broadcast(L: Lowering, ta: int, tb: int, out: int, b_value) -> tuple[list[int], list[int]]:
    """The binary op's operands and result, as views oneDNN's jit binary runs: unchanged
    when it runs them as they are (or sizes are symbolic, or the layout is not row-major);
    else in the fewest dims (``merged_broadcast``: Swin's mask, (1, 64, 1, 49, 49) over
    (1, 64, 3, 49, 49), is (64, 1, 2401) over (64, 3, 2401)), with src1 expanded over the
    dims no supported pattern broadcasts (``jit_broadcast_expansion``): a constant once at
    export, a run-time tensor by a copy before the op. Swin-T's mask add took 42.7 ms in
    the reference kernel, about 0.1 ms so (one thread; bench/results/reference_cliffs.md)."""
    sa, sb = L.spec(ta), L.spec(tb)
    dims = tuple(sa.dims)
    if any(type(v) is not int for v in (*dims, *sa.strides, *sb.dims, *sb.strides)) \
            or sa.strides != row_major(dims) or math.prod(dims) == 0:
        return [ta, tb], [out]
    kept = [bd == d and d != 1 for bd, d in zip(sb.dims, dims)]
    kept_dims = tuple(d for d, keep in zip(sb.dims, kept) if keep)
    packed = [s for s, keep in zip(sb.strides, kept) if keep] == list(row_major(kept_dims))
    if all(kept) or (jit_binary_broadcast(kept) and packed):
        return [ta, tb], [out]
    if not packed:  # (a run-time view: the patterns above are those of a row-major src1)
        tb = L.contiguous(tb)
        if jit_binary_broadcast(kept):
            return [ta, tb], [out]
    merged, merged_kept = merged_broadcast(dims, kept)
    mask = jit_broadcast_expansion(merged, merged_kept)
    b_dims = tuple(d if k else 1 for d, k in zip(merged, merged_kept))
    wide_dims = tuple(d if k else 1 for d, k in zip(merged, mask))
    if wide_dims != b_dims and isinstance(b_value, tuple) and b_value[0] == "c":
        # a constant: expanded once, here (its values in the merged dims, row-major; the
        # constant it was stays in the blob, the smaller of the two)
        const = b_value[1].detach().to(torch.float32).reshape(b_dims).expand(wide_dims).contiguous()
        tb = L.materialize(("c", const))
    elif wide_dims != b_dims:
        source = L.alias(tb, wide_dims, tuple(
            0 if not k else s for k, s in zip(merged_kept, row_major(b_dims))))
        tb = L.new_tensor(torch.float32, wide_dims)
        L.copy(source, tb)
    final, final_kept = merged_broadcast(merged, mask)  # the expanded runs joined
    final_b = tuple(d if k else 1 for d, k in zip(final, final_kept))
    view = row_major(final)
    return ([L.alias(ta, final, view), L.alias(tb, final_b, row_major(final_b))],
            [L.alias(out, final, view)])


def lower_generic_ew(L: Lowering, node, args, kwargs, code_name, alpha=1):
    fake = _val(node)
    if fake.dtype not in GENERIC_DTYPES:
        raise Unsupported("dtype", f"{op_name(node)} on {fake.dtype}: the cpu backend runs float32 "
                          "(and int/bool masks); stays on the kernels")
    if code_name not in EW:
        raise Unsupported("op", f"{op_name(node)}: no cpu-backend implementation")
    tensors, scalar = [], None
    if any(is_symbolic_dim(a) for a in args):
        raise Unsupported("shape", f"{op_name(node)} with a dynamic size as an operand; stays "
                          "on the kernels")
    for a in args:
        if isinstance(a, tuple) and len(a) == 2 and a[0] in "tc":
            tensors.append(L.materialize(a))
        elif isinstance(a, (int, float, bool)) and len(tensors) + (scalar is not None) < 3:
            if scalar is not None:
                raise Unsupported("op", f"{op_name(node)} with two scalars")
            scalar = float(a)
        if len(tensors) + (scalar is not None) >= (1 if code_name in ("logical_not", "bitwise_not", "neg") else 3 if code_name in ("where", "masked_fill") else 2):
            break
    if code_name == "bitwise_not" and L.spec(tensors[0]).dtype != torch.bool:
        raise Unsupported("dtype", "aten::bitwise_not on integers; stays on the kernels")
    for t in tensors:
        if L.spec(t).dtype not in GENERIC_DTYPES:
            raise Unsupported("dtype", f"{op_name(node)} reads {L.spec(t).dtype}")
    dims = L.shape(fake)
    out = L.new_tensor(fake.dtype, dims)
    floats = any(L.spec(t).dtype == torch.float32 for t in tensors) or fake.dtype == torch.float32 or (
        scalar is not None and not float(scalar).is_integer())
    ia = [EW[code_name], 0 if floats else 1, len(dims), *dims, *L.spec(out).strides]
    for t in tensors:
        ia += _broadcast_strides(L.spec(t), dims)
    if scalar is not None and floats and any(L.spec(t).dtype == torch.float32 for t in tensors):
        # torch computes float32 (op) Python float in float32: the scalar rounds first
        # (x == 0.1 holds for float32(0.1), which the double 0.1 does not equal)
        scalar = float(np.float32(scalar))
    fa = [float(alpha)] + ([scalar] if scalar is not None else [])
    L.op("ew", tensors, [out], ia, fa, name=code_name)
    return ("t", out)


def lower_named_ew(code):
    def lower(L, node, args, kwargs):
        return lower_generic_ew(L, node, args, kwargs, code)
    return lower


def lower_where(L, node, args, kwargs):
    return lower_generic_ew(L, node, args, kwargs, "where")


def lower_full_like(L, node, args, kwargs):
    fake = _val(node)
    value = args[1]
    if fake.dtype not in GENERIC_DTYPES:
        raise Unsupported("dtype", f"aten::full_like of {fake.dtype}")
    out = L.new_tensor(fake.dtype, fake.shape)
    dims = L.shape(fake)
    L.op("ew", [], [out], [EW["fill"], 0, len(dims), *dims, *L.spec(out).strides], [1.0, float(value)], name="fill")
    return ("t", out)


def lower_zeros_like(L, node, args, kwargs):
    return lower_full_like(L, node, [args[0], 0], kwargs)


def lower_masked_fill(L, node, args, kwargs):
    x, mask, value = args[:3]
    if not isinstance(value, (int, float, bool)):
        raise Unsupported("op", "aten::masked_fill with a tensor value; stays on the kernels")
    return lower_generic_ew(L, node, [mask, x, value], kwargs, "masked_fill")


LOWERINGS.update({k: lower_eltwise for k in ELTWISE})
LOWERINGS.update({k: lower_binary for k in BINARY})
LOWERINGS["aten::pow"] = lower_pow
LOWERINGS["aten::where"] = lower_where
LOWERINGS["aten::eq"] = lower_named_ew("eq")
LOWERINGS["aten::ne"] = lower_named_ew("ne")
LOWERINGS["aten::lt"] = lower_named_ew("lt")
LOWERINGS["aten::le"] = lower_named_ew("le")
LOWERINGS["aten::gt"] = lower_named_ew("gt")
LOWERINGS["aten::ge"] = lower_named_ew("ge")
LOWERINGS["aten::logical_not"] = lower_named_ew("logical_not")
LOWERINGS["aten::bitwise_not"] = lower_named_ew("bitwise_not")
LOWERINGS["aten::logical_and"] = lower_named_ew("logical_and")
LOWERINGS["aten::logical_or"] = lower_named_ew("logical_or")
LOWERINGS["aten::full_like"] = lower_full_like
LOWERINGS["aten::zeros_like"] = lower_zeros_like
LOWERINGS["aten::ones_like"] = lambda L, node, args, kwargs: lower_full_like(L, node, [args[0], 1], kwargs)
LOWERINGS["aten::masked_fill"] = lower_masked_fill
# every lowering above takes symbolic sizes (a size used as a scalar operand is refused)
SYMBOLIC_SIZES.update(fn for fn in LOWERINGS.values() if fn.__module__ == __name__)
