"""Mixture-of-experts routing and the experts' grouped matmul.

A mixture-of-experts layer picks ``k`` experts per token (``topk`` of the router's
probabilities, in ``sorting``), groups the (token, expert) pairs by expert and runs each
expert's matmul on its rows. The grouping ops are here:

* ``transformers::grouped_mm_fallback`` (transformers' ``integrations/moe.py``): rows of
  ``input`` sorted by expert, ``offs[i]`` the end row of expert ``i``'s group;
  ``out[start:end] = input[start:end] @ weight[i]`` with ``start`` the previous end (0 first)
  and every other row zero. The slices follow Python's rules, exactly as transformers' loop
  does (an end past the rows stops at the last row); products go through the same BLAS path
  as ``mm`` (``linalg``).
* ``histc`` (tokens per expert): ``bins`` equal bins over ``[min, max]``, the last closed;
  elements outside are not counted, NaN neither; ``min == max`` takes the data's range,
  widened by 1 each side when that is empty too. As ATen's CPU kernel (linear
  interpolation without a search of the edges, histc's own rule), the bin of ``x`` is
  ``int((x - min) * bins / (max - min))`` computed in the input's dtype, each step rounded
  as ATen's does: integer-valued expert ids, what MoE layers count, land exactly.
* ``bincount``: its result has ``max + 1`` (at least ``minlength``) elements, a size the data
  decides, so the kernel returns its result's view within the planned slot
  (``selection`` explains the convention).

The sizes in a layer's graph are the token count times ``k`` (static for a given input);
only ``bincount`` and the eager loop's ``nonzero``/``where`` have data-dependent sizes.
"""

from __future__ import annotations

import operator

import numpy as np

from opforge.errors import KernelError
from opforge.kernels.portable._registry import Kernel, kernel_decorator
from opforge.kernels.portable.linalg import _product as matrix_product
from opforge.kernels.portable.selection import _result as produced_result

__all__ = ["KERNELS"]

KERNELS: dict[str, Kernel] = {}
kernel = kernel_decorator(KERNELS)


@kernel("transformers::grouped_mm_fallback.out")
def grouped_mm_fallback_out(input, weight, offs, out):
    api = "transformers::grouped_mm_fallback.out"
    if input.ndim != 2 or weight.ndim != 3 or offs.ndim != 1 or out.ndim != 2:
        raise KernelError(
            f"`{api}`: ranks — found input {input.ndim}-d, weight {weight.ndim}-d, offs "
            f"{offs.ndim}-d — valid: input (S, K), weight (E, K, N), offs (E,) — pass "
            "transformers' grouped layout")
    if offs.shape[0] != weight.shape[0] or input.shape[1] != weight.shape[1] or \
            out.shape != (input.shape[0], weight.shape[2]):
        raise KernelError(
            f"`{api}`: shapes — found input {input.shape}, weight {weight.shape}, offs "
            f"{offs.shape}, out {out.shape} — valid: offs has one entry per expert, input's "
            "columns are weight's rows, out is (S, N) — check the grouped operands")
    if offs.dtype.kind not in "iu":
        raise KernelError(f"`{api}`: offs dtype {offs.dtype} — valid: int32 or int64 — "
                          "pass the cumulative counts as integers")
    out.fill(0)
    start = 0
    for expert, end in enumerate(offs.tolist()):
        if start == end:
            continue
        rows = slice(start, end)  # Python's slice rules, as transformers' loop
        if out[rows].shape[0]:
            matrix_product(input[rows], weight[expert], out[rows])
        start = end


def _histogram_range(x: np.ndarray, low, high) -> tuple:
    """The outer edges in ``x``'s dtype, as ATen picks them."""
    dtype = x.dtype
    low, high = dtype.type(low), dtype.type(high)
    if low > high:
        raise KernelError(
            f"`aten::histc.out`: range — found min {low} > max {high} — valid: min <= max — "
            "swap them")
    if low == high and x.size:
        low, high = x.min(), x.max()  # NaN stays NaN: ATen refuses that range too
    if not (np.isfinite(low) and np.isfinite(high)):
        raise KernelError(
            f"`aten::histc.out`: range — found [{low}, {high}] — valid: finite bounds — "
            "pass min and max, or remove inf/NaN from the input")
    if low == high:
        low, high = low - dtype.type(1), high + dtype.type(1)
    return low, high


@kernel("aten::histc.out")
def histc_out(self, bins, min, max, out):
    if bins <= 0:
        raise KernelError(f"`aten::histc.out`: bins — found {bins} — valid: at least 1 — "
                          "pass a positive bin count")
    x = np.asarray(self).reshape(-1)
    if x.dtype.kind != "f":
        raise KernelError(f"`aten::histc.out`: input dtype {x.dtype} — valid: a float dtype "
                          "(ATen's CPU histc) — cast the input to float first")
    low, high = _histogram_range(x, min, max)
    x = x[(x >= low) & (x <= high)]  # drops NaN as well
    scaled = (x - low) * x.dtype.type(bins) / (high - low)  # each step in x's dtype
    index = np.clip(scaled.astype(np.int64), 0, bins - 1)  # max itself: the last bin
    np.copyto(out, np.bincount(index, minlength=bins)[:bins], casting="unsafe")


@kernel("aten::bincount.out")
def bincount_out(self, weights, minlength, out):
    api = "aten::bincount.out"
    values = np.asarray(self).reshape(-1)
    if values.dtype.kind not in "iu" or (values.size and values.min() < 0):
        raise KernelError(f"`{api}`: input — found {values.dtype} values "
                          f"{'with negatives' if values.dtype.kind in 'iu' else ''} — valid: "
                          "non-negative integers — pass non-negative integer ids")
    size = operator.index(minlength)
    if values.size:
        size = int(np.maximum(size, int(values.max()) + 1))
    result = produced_result(api, out, size)
    counts = np.bincount(values, weights=None if weights is None else
                         np.asarray(weights, dtype=np.float64).reshape(-1), minlength=size)
    np.copyto(result, counts, casting="unsafe")
    return result
