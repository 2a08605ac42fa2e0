"""Matrix products: mm, bmm, addmm, baddbmm, matmul-shaped linear, dot.

All go to BLAS through ``np.matmul(..., out=out)`` when the operands already have the
output's floating dtype. float16 products accumulate in float32 (ATen's CPU kernels do the
same) and round once; integer products use NumPy's exact integer loops.
"""

from __future__ import annotations

import numpy as np

from opforge.kernels.portable._promotion import accumulate_dtype
from opforge.kernels.portable._registry import Kernel, kernel_decorator

__all__ = ["KERNELS"]

KERNELS: dict[str, Kernel] = {}
kernel = kernel_decorator(KERNELS)


def _product(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """``out = a @ b`` with no temporary when the dtypes already agree."""
    ct = accumulate_dtype(out.dtype)
    if a.dtype == ct and b.dtype == ct and out.dtype == ct:
        np.matmul(a, b, out=out)
    else:
        np.copyto(out, np.matmul(a.astype(ct, copy=False), b.astype(ct, copy=False)),
                  casting="unsafe")


def _scaled_sum(self: np.ndarray, beta, alpha, out: np.ndarray) -> None:
    """``out = beta * self + alpha * out``; beta == 0 ignores self (even its NaNs)."""
    if alpha != 1:
        np.multiply(out, alpha, out=out, casting="unsafe")
    if beta == 0:
        return
    if beta == 1:
        np.add(out, self, out=out, casting="unsafe")
    else:
        np.add(out, np.multiply(self, beta, dtype=accumulate_dtype(out.dtype)), out=out,
               casting="unsafe")


@kernel("aten::mm.out", "aten::bmm.out", "aten::matmul.out")
def mm_out(self, mat2, out):
    _product(self, mat2, out)


@kernel("aten::addmm.out", "aten::baddbmm.out")
def addmm_out(self, mat1, mat2, beta, alpha, out):
    if out.dtype == np.float16:
        # Round once: the whole expression in float32, like ATen's opmath.
        acc = np.matmul(mat1.astype(np.float32), mat2.astype(np.float32))
        _scaled_sum(self.astype(np.float32), beta, alpha, acc)
        np.copyto(out, acc, casting="unsafe")
        return
    _product(mat1, mat2, out)
    _scaled_sum(self, beta, alpha, out)


@kernel("aten::linear.out")
def linear_out(input, weight, bias, out):
    _product(input, weight.T, out)
    if bias is not None:
        np.add(out, bias, out=out, casting="unsafe")


@kernel("aten::dot.out")
def dot_out(self, tensor, out):
    _product(self, tensor, out)
