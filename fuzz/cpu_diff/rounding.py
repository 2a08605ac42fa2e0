"""The error any float32 runtime may make on a graph: eager float64 with float32's
rounding put back in, op by op.

The oracle's first measure of how hard a graph is for float32 is eager float32's own error.
That measure fails where eager happens to be exact and another correct runtime is not:
ATen sums ``mean`` and the average pools in its own order (seed 4945's ten values: to the
nearest float32), while oneDNN adds left to right and the portable kernels pairwise. A sum that
cancels is the usual case: the mean of 10 values of size ~3 that is 0.03 (seed 4945) is
off by 20 ulp of the result after a left-to-right float32 sum, which is 0.05 of the
textbook bound (n-1)·u·Σ|x|/n; the mean of a group norm's output is 0 up to rounding, so
eager's error (1e-16) allows nothing, and a float32 group norm's outputs, eager's
included, are each a few ulp off (seed 4953).

``float32_error`` runs the module in float64 under a dispatch mode that, after every op
that makes a new floating tensor (not views, not in-place ops), moves each element by
±eps32 · (|value| + m), signs drawn at random (fixed generator):

- |value|: storing the result in float32 (an ulp, where rounding to nearest is half);
- m, for ops that accumulate (sums, means, average pools, matmuls, convolutions): the
  same op on the absolute values of its tensor arguments, Σ|terms| (for a mean or pool,
  Σ|terms|/n), the scale of a float32 accumulation's error (random-walk size u·Σ|terms|,
  bound (n-1)·u·Σ|terms|).

Later ops carry the moved values on, so a cancellation downstream amplifies them as it
would float32's. The result, max |moved - ref64| per output, is what a runtime that
stores every value in float32 and accumulates in float32 may be expected to be off by;
a kernel 0.1% off a well-conditioned output is still hundreds of times over it.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

__all__ = ["float32_error"]

EPS32 = float(torch.finfo(torch.float32).eps)

# aten overload packets (as eager reaches the dispatcher) whose outputs are sums of terms,
# each linear in every tensor argument, so op(|args|) is Σ|terms|.
ACCUMULATING = frozenset({
    "mm", "bmm", "addmm", "baddbmm", "addbmm", "mv", "addmv", "dot", "matmul", "linear",
    "convolution", "_convolution", "sum", "mean", "avg_pool1d", "avg_pool2d", "avg_pool3d",
    "adaptive_avg_pool1d", "adaptive_avg_pool2d", "adaptive_avg_pool3d",
    "_adaptive_avg_pool2d", "_adaptive_avg_pool3d",
})


def _abs(x):
    if isinstance(x, torch.Tensor) and x.is_floating_point():
        return x.abs()
    return abs(x) if isinstance(x, float) else x


class _Float32Rounding(TorchDispatchMode):
    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        self.generator = torch.Generator().manual_seed(seed)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        schema = func._schema
        if schema.is_mutable or any(r.alias_info is not None for r in schema.returns):
            return out  # in-place ops and views round nothing new
        magnitude = None
        if func.overloadpacket.__name__ in ACCUMULATING:
            magnitude = func(*tree_map(_abs, args), **tree_map(_abs, kwargs))

        def move(value, m=None):
            if not isinstance(value, torch.Tensor) or value.dtype != torch.float64:
                return value
            size = value.abs() if m is None else value.abs() + m.abs()
            signs = torch.randint(0, 2, value.shape, generator=self.generator, dtype=value.dtype) * 2 - 1
            step = EPS32 * size * signs
            return torch.where(torch.isfinite(step), value + step, value)

        if isinstance(out, torch.Tensor):
            return move(out, magnitude if isinstance(magnitude, torch.Tensor) else None)
        if isinstance(out, (tuple, list)):
            return type(out)(move(o) for o in out)
        return out


def float32_error(model64, inputs64) -> list[float | None]:
    """Per output of ``model64`` (a float64 module) on ``inputs64``: max |moved - exact|,
    where "moved" carries float32's rounding (see the module docstring); None for
    non-floating outputs."""
    with torch.no_grad():
        exact = model64(*inputs64)
        with _Float32Rounding():
            moved = model64(*inputs64)
    exact = exact if isinstance(exact, (tuple, list)) else (exact,)
    moved = moved if isinstance(moved, (tuple, list)) else (moved,)
    errors = []
    for e, m in zip(exact, moved):
        if not e.is_floating_point() or e.numel() == 0:
            errors.append(None if not e.is_floating_point() else 0.0)
            continue
        with torch.no_grad():
            d = (m.double() - e.double()).abs()
        errors.append(float(torch.nan_to_num(d, nan=0.0, posinf=0.0).max()))
    return errors
