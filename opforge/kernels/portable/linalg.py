"""Matrix products: mm, bmm, addmm, baddbmm, matmul-shaped linear, dot.

All go to BLAS through ``np.matmul(..., out=out)`` when the operands already have the
output's floating dtype. float16 products accumulate in float32 (ATen's CPU kernels do the
same) and round once; integer products use NumPy's exact integer loops.

Bound (see ``_binding``): same-dtype products are the bare ``np.matmul(a, b, out)``; linear
binds the weight's transposed *view* and, for a batched input, 2-d views of input and out
(one GEMM instead of a batch of small ones); the bias add is a second ufunc step.
"""

from __future__ import annotations

import numpy as np

from opforge.kernels.portable._binding import prepares, read_only, separate, shape_generic, steps
from opforge.kernels.portable._promotion import accumulate_dtype
from opforge.kernels.portable._registry import Kernel, binder_for, kernel_decorator

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
    if out.dtype.kind in "biu":
        # ATen converts the scalars to the integer dtype first: beta=0.2 is 0, alpha=2.6 is 2.
        beta, alpha = int(beta), int(alpha)
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


# --- bind-time fast paths -------------------------------------------------------------------

def _same_dtype(out: np.ndarray, *arrays) -> bool:
    return out.dtype in (np.float32, np.float64) and all(
        a.dtype == out.dtype for a in arrays if a is not None)


def _as_2d(a: np.ndarray) -> np.ndarray | None:
    """A 2-d *view* of a C-contiguous batched matrix (None when it would be a copy)."""
    if a.ndim <= 2:
        return a
    if not a.flags.c_contiguous:
        return None
    return a.reshape(-1, a.shape[-1])


@binder_for(mm_out)
@shape_generic
def _bind_mm(args):
    self, mat2, out = args
    if not _same_dtype(out, self, mat2) or not separate([out], self, mat2) or \
            self.ndim < 2 or mat2.ndim < 2 or \
            np.broadcast_shapes(self.shape[:-2], mat2.shape[:-2]) != out.shape[:-2]:
        return mm_out, args
    return np.matmul, (self, mat2, out)


def _bias_step(out: np.ndarray, bias: np.ndarray | None) -> list:
    return [] if bias is None else [(np.add, (out, bias, out))]


def _linear_fast(args) -> bool:
    input, weight, bias, out = args
    return _same_dtype(out, input, weight, bias) and weight.ndim == 2 and \
        separate([out], input, weight, bias)


def _linear(args, transposed=None):
    """The bound steps at these arguments' sizes, or None (a batched operand that is not
    C-contiguous: its 2-d form would be a copy)."""
    input, weight, bias, out = args
    x, y = _as_2d(input), _as_2d(out)
    if x is None or y is None:
        return None
    return steps([(np.matmul, (x, weight.T if transposed is None else transposed, y))]
                 + _bias_step(out, bias))


@binder_for(linear_out)
def _bind_linear(args):
    if not _linear_fast(args):
        return linear_out, args
    return _linear(args) or (linear_out, args)


@prepares(_bind_linear)
def _prepare_linear(bound):
    if not _linear_fast(bound):
        return None
    weight, bias = bound[1], bound[2]
    transposed = weight.T  # a constant weight is the same object at every shape
    k, n = weight.shape[1], weight.shape[0]

    def rebind(args):
        input, w, b, out = args
        if w is not weight or input.ndim <= 2 or not (
                input.flags.c_contiguous and out.flags.c_contiguous):
            return _linear(args, transposed if w is weight else None)
        # the batched common case, straight-line: both operands as matrices (views)
        product = (np.matmul, (input.reshape(-1, k), transposed, out.reshape(-1, n)))
        return product if b is None else steps([product, (np.add, (out, b, out))])

    return rebind if bias is None or bias.ndim == 1 else \
        (lambda args: _linear(args, transposed if args[1] is weight else None))


@binder_for(addmm_out)
def _bind_addmm(args):
    self, mat1, mat2, beta, alpha, out = args
    if not _same_dtype(out, self, mat1, mat2) or not separate([out], self, mat1, mat2):
        return addmm_out, args
    pairs = [(np.matmul, (mat1, mat2, out))]
    if alpha != 1:
        pairs.append((np.multiply, (out, np.asarray(alpha, out.dtype), out)))
    if beta == 0:
        pass
    elif beta == 1:
        pairs.append((np.add, (out, self, out)))
    elif read_only(self):  # a constant bias: scale it once
        pairs.append((np.add, (out, np.multiply(self, beta, dtype=out.dtype), out)))
    else:
        return addmm_out, args
    return steps(pairs)
