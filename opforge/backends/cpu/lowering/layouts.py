"""Layout predicates of the lowering's plan: row-major and channels-last strides, the
strides of size-1 dims tidied, whether a layout is dense, broadcast strides, and the
operand layouts a oneDNN post-op misreads. Pure functions of dims and strides (plain or
symbolic sizes), shared by every op family.
"""

from __future__ import annotations

import math

from opforge.backends.cpu.lowering.symbolic import _at_least_one, _is_one, same
from opforge.backends.cpu.lowering.unsupported import Unsupported


def _tidy_strides(dims, strides) -> tuple[int, ...]:
    """Strides of size-1 dims do not address anything; give them the value a dense layout
    would (oneDNN recognises dense layouts only then and otherwise falls back to its slow
    reference kernels)."""
    out = list(strides)
    for k in range(len(dims) - 1, -1, -1):
        if _is_one(dims[k]):
            inner = [j for j in range(k + 1, len(dims)) if not _is_one(dims[j])]
            try:
                out[k] = max((out[j] * dims[j] for j in inner), default=1)
            except Unsupported:
                pass  # symbolic: tidied per shape when the plan is made concrete (cpu/dynamic.py)
    return tuple(out)


def row_major(dims) -> tuple[int, ...]:
    strides, step = [], 1
    for d in reversed(dims):
        strides.append(step)
        step *= _at_least_one(d)
    return tuple(reversed(strides))


def channels_last(dims) -> tuple[int, ...]:
    c = dims[1]
    strides = [0] * len(dims)
    strides[1] = 1
    step = max(c, 1)
    for k in range(len(dims) - 1, 1, -1):
        strides[k] = step
        step *= max(dims[k], 1)
    strides[0] = step
    return tuple(strides)


def _dense(spec) -> bool:
    """Strides that pack the tensor without gaps in some dim order (what oneDNN's fast
    kernels take); zero strides (broadcasts) and gaps are not."""
    pairs = [(s, d) for s, d in zip(spec.strides, spec.dims) if not _is_one(d)]
    if all(type(x) is int for pair in pairs for x in pair):
        step = 1
        for s, d in sorted(pairs):
            if s != step:
                return False
            step *= d
        return True
    # symbolic sizes: the dim whose stride is identically the running step, one by one
    step = 1
    while pairs:
        k = next((k for k, (s, _) in enumerate(pairs) if same(s, step)), None)
        if k is None:
            return False
        step = step * pairs.pop(k)[1]
    return True


def _broadcast_strides(spec, out_dims) -> list[int]:
    """``spec``'s strides aligned to ``out_dims`` (0 where it broadcasts)."""
    pad = len(out_dims) - len(spec.dims)
    strides = [0] * pad
    for d, s, o in zip(spec.dims, spec.strides, out_dims[pad:]):
        # a size-1 dim broadcast to a symbolic one: stride 0 (at size 1 it addresses nothing)
        strides.append(s if same(d, o) else 0 if d == 1 and (type(o) is not int or o != 1) else s)
    return strides


def _post_operand_misread(dst_dims, operand_dims) -> bool:
    """oneDNN (2023.2) applies a binary post-op whose operand is (1, C, 1, ...) to a
    destination (N > 1, C, 1, ...) of rank >= 3 with the wrong values (BatchNorm1d over
    (2, 2, 1) was off by the size of its output); the plain binary primitive broadcasts it
    right, so such an operand stays a separate op."""
    if any(type(d) is not int for d in (*dst_dims, *operand_dims)):
        return True  # symbolic sizes: keep the operand a separate op (no decision per size)
    return (len(dst_dims) >= 3 and dst_dims[0] > 1 and all(d == 1 for d in dst_dims[2:])
            and len(operand_dims) == len(dst_dims) and operand_dims[0] == 1
            and any(d > 1 for d in operand_dims[1:]))


# oneDNN's (2023.2) jit binary takes a row-major src1 that broadcasts over some dims of a
# row-major src0 in these patterns only (measured: every keep/broadcast mask of ranks 2 to 5,
# `impl_info_str` of the primitive; "k" a dim src1 keeps, "1" one it broadcasts; N = dim 0,
# C = dim 1, the rest spatial): rank <= 2, none or all kept, (N|1, C, 1...) (per channel),
# (N|1, 1, 1..., k...) (a suffix of the spatial dims, at least one), (1, C, k...) (per
# channel and all spatial). Any other (Swin's attention mask, (1, nW, 1, 49, 49) over
# (1, nW, heads, 49, 49); (N, 1, 1): per sample) runs its reference kernel, 100x slower.
def jit_binary_broadcast(kept) -> bool:
    """Whether src1 keeping the dims ``kept`` (True) of src0 and broadcasting the others is
    a pattern oneDNN's jit binary runs (row-major layouts)."""
    kept = [bool(k) for k in kept]
    if len(kept) <= 2 or all(kept) or not any(kept):
        return True
    channel, spatial = kept[1], kept[2:]
    if not any(spatial):
        return channel
    if channel:
        return all(spatial)
    return all(spatial[spatial.index(True):])


# oneDNN's (2023.2) matmul takes a binary post-op in its brgemm kernel only when the
# operand (row-major) keeps these dims of the row-major destination and broadcasts the
# others (measured: every keep mask of ranks 2 to 6, ``impl_info_str`` of the fused matmul;
# a dim of size 1 in the destination counts as kept, as in oneDNN's own mask): none or all
# kept at any rank; rank 2 (1, k) (per column); rank 3 (1, 1, k), (1, k, 1), (k, 1, k);
# rank 4 (1, 1, 1, k), (k, 1, 1, k), (k, 1, k, k). Any other runs oneDNN's reference matmul
# (``ref:any``) or its plain gemm: torchvision Swin's relative-position bias,
# (1, heads, 49, 49) over the scores (nW, heads, 49, 49), fused into q @ kᵀ took 80-330 ms
# per block there instead of about 0.5 ms (one thread, AMD EPYC Zen 4). Such an operand
# stays a binary op of its own (its broadcast one the jit binary takes, ``_jit_broadcast``).
_MATMUL_POST_KEEPS = {
    2: {(0, 1)},
    3: {(0, 0, 1), (0, 1, 0), (1, 0, 1)},
    4: {(0, 0, 0, 1), (1, 0, 0, 1), (1, 0, 1, 1)},
}


def matmul_post_broadcast(dst_dims, operand_dims) -> bool:
    """Whether oneDNN's brgemm matmul runs a binary post-op reading ``operand_dims``
    (row-major, right-aligned to the destination, broadcast where its dim is 1) onto a
    destination of ``dst_dims``; False for symbolic sizes (no decision that holds for all)."""
    if any(type(d) is not int for d in (*dst_dims, *operand_dims)) or len(operand_dims) > len(dst_dims):
        return False
    padded = (1,) * (len(dst_dims) - len(operand_dims)) + tuple(operand_dims)
    kept = tuple(int(o == d) for o, d in zip(padded, dst_dims))
    return all(kept) or not any(kept) or kept in _MATMUL_POST_KEEPS.get(len(kept), ())


# oneDNN's (2023.2) jit binary takes a binary post-op whose operand keeps none, all, or only
# dim 1 (per channel) of the destination (measured: every keep mask of ranks 3 and 4, with
# the host's own src1 per channel or whole); any other runs its reference binary:
# torchvision Swin V2's bias (1, heads, 64, 64) fused after the logit scale's multiply sent
# it there (10 of them in swin_v2_t).
def binary_post_broadcast(dst_dims, operand_dims) -> bool:
    """Whether oneDNN's jit binary runs a binary post-op reading ``operand_dims`` onto a
    destination of ``dst_dims`` (False for symbolic sizes)."""
    if any(type(d) is not int for d in (*dst_dims, *operand_dims)) or len(operand_dims) > len(dst_dims):
        return False
    padded = (1,) * (len(dst_dims) - len(operand_dims)) + tuple(operand_dims)
    kept = tuple(int(o == d) for o, d in zip(padded, dst_dims))
    return all(kept) or not any(kept) or (len(kept) >= 2 and kept == (0, 1) + (0,) * (len(kept) - 2))


def merged_broadcast(dims, kept) -> tuple[tuple[int, ...], tuple[bool, ...]]:
    """``dims`` with their size-1 dims dropped and each run of neighbours that src1 keeps
    alike (all kept or all broadcast) merged into one dim: the same row-major binary op in
    the fewest dims (at least one)."""
    out_dims: list[int] = []
    out_kept: list[bool] = []
    for d, k in zip(dims, kept):
        if d == 1:
            continue
        if out_kept and out_kept[-1] == bool(k):
            out_dims[-1] *= d
        else:
            out_dims.append(d)
            out_kept.append(bool(k))
    return (tuple(out_dims), tuple(out_kept)) if out_dims else ((1,), (True,))


def jit_broadcast_expansion(dims, kept) -> tuple[bool, ...]:
    """The keep mask, a superset of ``kept`` (merged dims, from ``merged_broadcast``), that
    oneDNN's jit binary runs with the fewest src1 elements: src1 copied out (expanded) over
    the dims it adds. ``kept`` itself when it runs already; all kept runs always."""
    runs = [k for k, keep in enumerate(kept) if not keep]
    best = tuple(True for _ in kept)
    size = math.prod(dims)
    for choice in range(1 << len(runs)):
        mask = list(kept)
        for bit, k in enumerate(runs):
            if choice >> bit & 1:
                mask[k] = True
        elements = math.prod(d for d, keep in zip(dims, mask) if keep)
        if elements < size and jit_binary_broadcast(merged_broadcast(dims, mask)[1]):
            best, size = tuple(mask), elements
    return best
