"""Views of tensors with symbolic sizes: the strided-view algebra of ``views.lower_view``
written out op by op, since the static path's trick (running the op on a tensor of element
offsets) needs concrete sizes.

Each view op maps (dims, strides, offset) of its input to those of its result with
``SymDim`` arithmetic (``lowering/symbolic.py``); a decision that depends on a symbolic size
refuses the node (``Unsupported``), and a reshape that is not a view of its input at every
size in range copies the input to row-major first, as the static path does.
"""

from __future__ import annotations

import math

from opforge.backends.partition import op_name
from opforge.backends.cpu.lowering.core import Lowering, Unsupported, known, row_major

__all__ = ["lower_view_symbolic", "SYMBOLIC_VIEW_OPS"]

SYMBOLIC_VIEW_OPS = ("view", "_unsafe_view", "reshape", "permute", "transpose", "t", "expand",
                     "unsqueeze", "squeeze", "select", "slice", "narrow", "split",
                     "split_with_sizes", "unbind", "alias", "detach", "clone", "contiguous",
                     "lift_fresh")


def _base_name(node) -> str:
    name = op_name(node).split("::")[1].split(".")[0]
    return name[:-5] if name.endswith("_copy") else name


def _view_strides(old_dims, old_strides, new_dims):
    """torch's ``computeStride``: strides of ``new_dims`` over the storage of a tensor with
    ``old_dims``/``old_strides`` when it is a view, else None. A symbolic size counts as
    not 1 (``_is_one``); a comparison it cannot decide gives None (the caller copies)."""
    from opforge.backends.cpu.lowering.core import _is_one, same

    try:
        if not old_dims:
            return [1] * len(new_dims)
        new_strides = [0] * len(new_dims)
        view_d = len(new_dims) - 1
        chunk = old_strides[-1]
        tensor_numel = view_numel = 1
        for d in range(len(old_dims) - 1, -1, -1):
            tensor_numel = tensor_numel * old_dims[d]
            if d == 0 or (not _is_one(old_dims[d - 1])
                          and not same(old_strides[d - 1], tensor_numel * chunk)):
                # a group of new dims whose product is identically the chunk's numel
                while view_d >= 0 and (not same(view_numel, tensor_numel)
                                       or _is_one(new_dims[view_d])):
                    new_strides[view_d] = view_numel * chunk
                    view_numel = view_numel * new_dims[view_d]
                    view_d -= 1
                if not same(view_numel, tensor_numel):
                    return None
                if d > 0:
                    chunk, tensor_numel, view_numel = old_strides[d - 1], 1, 1
        return new_strides if view_d == -1 else None
    except Unsupported:
        return None


def _reshape(L: Lowering, tid: int, sizes):
    spec = L.spec(tid)
    sizes = list(sizes)
    if sizes.count(-1) > 1:
        raise Unsupported("shape", "a reshape with two -1 sizes")
    if -1 in sizes:
        k = sizes.index(-1)
        rest = math.prod(s for j, s in enumerate(sizes) if j != k)
        total = math.prod(spec.dims)
        sizes[k] = total // (max(rest, 1) if type(rest) is int else rest)  # exact, or Unsupported
    strides = _view_strides(spec.dims, spec.strides, sizes)
    if strides is None:
        tid = L.contiguous(tid)
        strides = list(row_major(sizes))
        spec = L.spec(tid)
    return [(tid, sizes, strides, 0)]


def _dim_arg(args, kwargs, position, key, default, rank):
    d = args[position] if len(args) > position else kwargs.get(key, default)
    return d % max(rank, 1) if type(d) is int else d


def _slice_bounds(size, start, end, step):
    start = 0 if start is None else start
    end = size if end is None else end
    if type(start) is int and start < 0:
        start = start + size
    if type(end) is int and end < 0:
        end = end + size
    if type(end) is int and type(size) is int:
        end = min(end, size)
    elif end >= size:  # SymDim comparisons: decided for every size, or Unsupported
        end = size
    if type(start) is int and type(size) is int:
        start = min(start, size)
    elif start >= size:
        start = size
    length = end - start
    if step != 1:
        length = (length + step - 1) // step
    return start, length


def lower_view_symbolic(L: Lowering, node, args, kwargs):
    """(dims, strides, offset) of each result over the input's storage, for views whose
    sizes may be symbolic; returns the same env value as ``views.lower_view``."""
    name = _base_name(node)
    tid = L.materialize(args[0])
    spec = L.spec(tid)
    dims, strides = list(spec.dims), list(spec.strides)
    rank = len(dims)
    results = None  # [(tid, dims, strides, offset)]
    if name in ("view", "_unsafe_view", "reshape"):
        results = _reshape(L, tid, args[1])
    elif name == "permute":
        order = [d % max(rank, 1) for d in args[1]]
        results = [(tid, [dims[d] for d in order], [strides[d] for d in order], 0)]
    elif name in ("transpose", "t"):
        a, b = (args[1], args[2]) if name == "transpose" else (0, 1)
        a, b = a % max(rank, 1), b % max(rank, 1)
        dims[a], dims[b], strides[a], strides[b] = dims[b], dims[a], strides[b], strides[a]
        results = [(tid, dims, strides, 0)]
    elif name == "unsqueeze":
        d = args[1] % (rank + 1)
        results = [(tid, dims[:d] + [1] + dims[d:], strides[:d] + [1] + strides[d:], 0)]
    elif name == "squeeze":
        which = args[1] if len(args) > 1 else None
        which = list(range(rank)) if which is None else [which] if type(which) is int else list(which)
        which = {d % max(rank, 1) for d in which}
        keep = [k for k in range(rank) if not (k in which and dims[k] == 1)]
        results = [(tid, [dims[k] for k in keep], [strides[k] for k in keep], 0)]
    elif name == "select":
        d = args[1] % rank
        index = args[2]
        if type(index) is int and index < 0:
            index = index + dims[d]
        results = [(tid, dims[:d] + dims[d + 1:], strides[:d] + strides[d + 1:], index * strides[d])]
    elif name in ("slice", "narrow"):
        d = _dim_arg(args, kwargs, 1, "dim", 0, rank)
        if name == "slice":
            start = args[2] if len(args) > 2 else kwargs.get("start")
            end = args[3] if len(args) > 3 else kwargs.get("end")
            step = args[4] if len(args) > 4 else kwargs.get("step", 1)
        else:
            start, end, step = args[2], args[2] + args[3], 1
        if type(step) is not int or step < 1:
            raise Unsupported("shape", f"{op_name(node)} with a step of {step}")
        start, length = _slice_bounds(dims[d], start, end, step)
        out_dims, out_strides = list(dims), list(strides)
        out_dims[d], out_strides[d] = length, strides[d] * step
        results = [(tid, out_dims, out_strides, start * strides[d])]
    elif name in ("split", "split_with_sizes", "unbind"):
        d = _dim_arg(args, kwargs, 2 if name != "unbind" else 1, "dim", 0, rank)
        size = dims[d]
        if name == "unbind":
            if type(size) is not int:
                raise Unsupported("shape", f"aten::unbind along the dynamic size {size}")
            results = [(tid, dims[:d] + dims[d + 1:], strides[:d] + strides[d + 1:], i * strides[d])
                       for i in range(size)]
        else:
            chunks = args[1]
            if name == "split":
                if type(size) is not int or type(chunks) is not int:
                    raise Unsupported("shape", f"aten::split of the dynamic size {size}")
                chunks = [min(chunks, size - i) for i in range(0, size, chunks)]
            results, start = [], 0
            for c in chunks:
                out_dims = list(dims)
                out_dims[d] = c
                results.append((tid, out_dims, list(strides), start * strides[d]))
                start = start + c
    elif name == "expand":
        sizes = list(args[1])
        pad = len(sizes) - rank
        out_dims, out_strides = [], []
        for k, size in enumerate(sizes):
            if k < pad:
                out_dims.append(size)
                out_strides.append(0)
                continue
            old = dims[k - pad]
            if (type(size) is int and size == -1) or size is old or size == old:
                out_dims.append(old)
                out_strides.append(strides[k - pad])
            elif old == 1:
                out_dims.append(size)
                out_strides.append(0)
            else:
                raise Unsupported("shape", f"aten::expand of size {old} to {size}")
        results = [(tid, out_dims, out_strides, 0)]
    elif name in ("alias", "detach", "clone", "contiguous", "lift_fresh"):
        results = [(tid, dims, strides, 0)]
    else:
        raise Unsupported("shape", f"{op_name(node)} on dynamic sizes: the cpu backend takes "
                          f"views ({', '.join(SYMBOLIC_VIEW_OPS)}) there; stays on the kernels")
    out = []
    for source, d, s, offset in results:
        alias = L.alias(source, d, s, offset)
        if any(stride == 0 and not known(lambda size=size: size == 1)
               for stride, size in zip(s, d)):  # expand: make it real
            real = L.new_tensor(L.spec(source).dtype, d)
            L.copy(alias, real)
            alias = real
        out.append(("t", alias))
    many = name in ("split", "split_with_sizes", "unbind")
    return tuple(out) if many else out[0]
