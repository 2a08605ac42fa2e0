"""Factory ops: full, zeros, ones, empty, arange, scalar_tensor and their ``*_like`` forms.

``out`` arrives with the dtype and shape the exporter decided (a ``dtype=`` argument of
the functional op is folded into it), so these kernels only write values.

Bound (see ``_binding``), the values are computed once at load into a private array and
each call copies them into ``out`` (whose arena bytes other tensors may use in between).
"""

from __future__ import annotations

import math

import numpy as np

from opforge.errors import KernelError
from opforge.kernels.portable._binding import prepares
from opforge.kernels.portable._promotion import is_floating
from opforge.kernels.portable._registry import Kernel, binder_for, kernel_decorator

__all__ = ["KERNELS"]

KERNELS: dict[str, Kernel] = {}
kernel = kernel_decorator(KERNELS)


@kernel("aten::full.out")
def full_out(size, fill_value, out):
    out.fill(fill_value)  # casts as ATen does: 2.7 into an int tensor is 2


@kernel("aten::full_like.out")
def full_like_out(self, fill_value, memory_format, out):
    out.fill(fill_value)


@kernel("aten::scalar_tensor.out")
def scalar_tensor_out(s, out):
    out.fill(s)


@kernel("aten::zeros.out")
def zeros_out(size, out):
    out.fill(0)


@kernel("aten::ones.out")
def ones_out(size, out):
    out.fill(1)


@kernel("aten::zeros_like.out")
def zeros_like_out(self, memory_format, out):
    out.fill(0)


@kernel("aten::ones_like.out")
def ones_like_out(self, memory_format, out):
    out.fill(1)


@kernel("aten::empty.out", "aten::empty_like.out")
def empty_out(size_or_self, memory_format, out):
    """Nothing to write: ``empty`` promises no values."""


@kernel("aten::empty_permuted.out")
def empty_permuted_out(size, physical_layout, out):
    """Nothing to write: the program's out is contiguous, ``empty`` promises no values."""


@kernel("aten::arange.start_out")
def arange_start_out(start, end, step, out):
    if step == 0 or (end - start) * step < 0:
        raise KernelError(
            f"`aten::arange.start_out`: start={start}, end={end}, step={step} — "
            "the step is zero or points away from end — "
            "valid: step != 0 with sign(step) == sign(end - start)"
        )
    floating = is_floating(out.dtype)
    if not floating:
        # ATen (RangeFactories) converts the bounds to the output's accumulate type, int64,
        # truncating towards zero: arange(0.5, 3, 0.5, dtype=int32) is five zeros.
        start_i, step_i = int(start), int(step)
    if out.dtype == np.int64:
        # ATen counts an int64 range in integers (exact past 2**53), on truncated bounds:
        # arange(0.0, -8.000001, -4.0, dtype=int64) has 2 elements, in int32 it has 3.
        if step_i == 0:
            raise KernelError(
                f"`aten::arange.start_out`: step={step} — truncates to 0 for an int64 range — "
                "valid: |step| >= 1 for integer outputs — pass an integer step"
            )
        span = int(end) - start_i + step_i - ((step_i > 0) - (step_i < 0))
        count = abs(span) // abs(step_i) * (1 if (span >= 0) == (step_i > 0) else -1)
    else:
        count = math.ceil((end - start) / step)
    count = max(count, 0)
    if count != out.size:
        raise KernelError(
            f"`aten::arange.start_out`: out — has {out.size} elements, the range has {count} — "
            "out must be planned with the range's length — re-export the program"
        )
    # ATen computes start + i * step in double for floating outputs, in int64 otherwise.
    ramp = np.arange(count, dtype=np.float64 if floating else np.int64)
    ramp *= step if floating else step_i
    ramp += start if floating else start_i
    np.copyto(out, ramp, casting="unsafe")


@kernel("aten::arange.out")
def arange_out(end, out):
    arange_start_out(0, end, 1, out)


def _bind_constant(kernel: Kernel, uniform: bool = False) -> None:
    @binder_for(kernel)
    def bind(args):
        out = args[-1]
        values = np.empty_like(out)
        kernel(*args[:-1], values)
        values.flags.writeable = False
        return np.copyto, (out, values)

    if not uniform:
        return

    @prepares(bind)
    def prepare(bound):
        # every element the same value whatever the arguments but out's size: a prefix of
        # the values at the upper bound serves every size
        values = bind(bound)[1][1].reshape(-1)
        return lambda args: (np.copyto, (args[-1], values[:args[-1].size].reshape(
            args[-1].shape)))


for _kernel in (full_out, full_like_out, scalar_tensor_out, arange_start_out, arange_out):
    _bind_constant(_kernel)
for _kernel in (zeros_out, ones_out, zeros_like_out, ones_like_out):
    _bind_constant(_kernel, uniform=True)
