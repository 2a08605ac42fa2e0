"""Portable arithmetic, comparison and logical kernels against PyTorch.

Tolerances: a pointwise op rounds once, so float32 needs rtol ~1 ulp (1.2e-7); we allow
2e-6 because ATen may fuse ``a + alpha * b`` into an fma (one rounding fewer than NumPy).
float64: 1e-12. float16: 1e-3 (one float16 rounding is 4.9e-4 relative). Integers and
bools: exact.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kernel_check import check_kernel, make_array

TOL = {np.float16: 1e-3, np.float32: 2e-6, np.float64: 1e-12}


SHAPES = [((3, 4), (3, 4)), ((2, 3, 4), (4,)), ((3, 1), (1, 5)), ((0, 3), (3,)),
          ((4, 5), ())]
LAYOUTS = ["contiguous", "transposed", "strided"]
DTYPES = [np.float32, np.float64, np.float16, np.int32, np.int64]
MIXED = [(np.int32, np.float32), (np.int64, np.float16), (np.bool_, np.int32),
         (np.float32, np.float64), (np.int8, np.uint8)]


def make(shape, dtype, layout="contiguous", seed=0, positive=False):
    """A NumPy array (possibly a non-contiguous view) and a torch tensor of its values;
    ``positive``: integers in 1..6, floats |x| + 0.25 (for divisors and pow bases)."""
    base, _ = make_array(shape, dtype, layout, seed, ints=(1 if positive else -6, 6))
    if positive and np.issubdtype(base.dtype, np.floating):
        np.abs(base, out=base)
        base += np.asarray(0.25, base.dtype)
    return base, torch.from_numpy(np.ascontiguousarray(base))


def check(key, expected, *args):
    check_kernel(key, expected, *args, tols=TOL)


def _pairs(positive_b=False):
    for sa, sb in SHAPES:
        for dtype in DTYPES:
            yield sa, sb, dtype, dtype, "contiguous"
    for layout in LAYOUTS[1:]:
        for dtype in (np.float32, np.int64):
            yield (3, 4), (3, 4), dtype, dtype, layout
    for da, db in MIXED:
        yield (2, 3), (3,), da, db, "contiguous"


# ATen refuses `sub` on bool tensors, so those combinations are not generated.
@pytest.mark.parametrize("op, sa, sb, da, db, layout", [
    (op, *p) for op in ("add", "sub", "mul", "maximum", "minimum") for p in _pairs()
    if not (op == "sub" and np.bool_ in (p[2], p[3]))
])
def test_binary_tensor(op, sa, sb, da, db, layout):
    a, ta = make(sa, da, layout, seed=1)
    b, tb = make(sb, db, layout if sa == sb else "contiguous", seed=2)
    key = {"add": "aten::add.out", "sub": "aten::sub.out", "mul": "aten::mul.out",
           "maximum": "aten::maximum.out", "minimum": "aten::minimum.out"}[op]
    if op in ("add", "sub"):
        check(key, getattr(torch, op)(ta, tb), a, b, 1)
        if np.bool_ not in (da, db):
            check(key, getattr(torch, op)(ta, tb, alpha=3), a, b, 3)
    else:
        check(key, getattr(torch, op)(ta, tb), a, b)


def test_bool_add_is_logical_or():
    a, ta = make((4, 4), np.bool_, seed=3)
    b, tb = make((4, 4), np.bool_, seed=4)
    check("aten::add.out", ta + tb, a, b, 1)
    check("aten::mul.out", ta * tb, a, b)


def _scalar_cases():
    # ATen refuses subtracting bools (either side), so those are not generated; a bool
    # tensor with a number scalar promotes, which the tensor tests cover.
    for op in ("add", "sub", "rsub", "mul", "div"):
        for dtype in (np.float32, np.float64, np.float16, np.int32, np.int64, np.bool_):
            for scalar in (2, -3, 0.5, True):
                if dtype == np.bool_ and (op in ("sub", "rsub") or not isinstance(scalar, bool)):
                    continue
                if op in ("sub", "rsub") and isinstance(scalar, bool):
                    continue
                yield op, dtype, scalar


@pytest.mark.parametrize("op, dtype, scalar", list(_scalar_cases()))
def test_binary_scalar(op, dtype, scalar):
    a, ta = make((3, 5), dtype, "transposed", seed=5)
    if op in ("add", "sub", "rsub"):
        check(f"aten::{op}.Scalar_out", getattr(torch, op)(ta, scalar, alpha=2)
              if not isinstance(scalar, bool) and dtype != np.bool_
              else getattr(torch, op)(ta, scalar), a, scalar,
              2 if not isinstance(scalar, bool) and dtype != np.bool_ else 1)
    else:
        check(f"aten::{op}.Scalar_out", getattr(torch, op)(ta, scalar), a, scalar)


def test_rsub_tensor():
    a, ta = make((3, 4), np.float32, seed=6)
    b, tb = make((4,), np.int64, seed=7)
    check("aten::rsub.Tensor_out", torch.rsub(ta, tb, alpha=2), a, b, 2)


@pytest.mark.parametrize("sa, sb, da, db, layout", list(_pairs()))
@pytest.mark.parametrize("mode", [None, "trunc", "floor"])
def test_div(mode, sa, sb, da, db, layout):
    a, ta = make(sa, da, layout, seed=8)
    b, tb = make(sb, db, layout if sa == sb else "contiguous", seed=9, positive=True)
    if db != np.bool_:
        b = np.asarray(b * np.where(make(sb, np.bool_, seed=10)[0], 1, -1).astype(db))
        tb = torch.from_numpy(b)  # divisors of both signs
    if db == np.bool_:
        pytest.skip("a bool divisor is mostly zero")
    if mode is None:
        check("aten::div.out", torch.div(ta, tb), a, b)
    else:
        check("aten::div.out_mode", torch.div(ta, tb, rounding_mode=mode), a, b, mode)


@pytest.mark.parametrize("mode", ["trunc", "floor"])
@pytest.mark.parametrize("scalar", [3, -2, 0.75])
def test_div_scalar_mode(mode, scalar):
    for dtype in (np.float32, np.int64):
        a, ta = make((4, 6), dtype, seed=11)
        check("aten::div.Scalar_mode_out", torch.div(ta, scalar, rounding_mode=mode),
              a, scalar, mode)


def test_float_division_by_zero_matches():
    a = np.array([1.0, -1.0, 0.0, 5.5], np.float32)
    b = np.array([0.0, 0.0, 0.0, -0.0], np.float32)
    for mode in ("trunc", "floor"):
        check("aten::div.out_mode", torch.div(torch.from_numpy(a), torch.from_numpy(b),
                                              rounding_mode=mode), a, b, mode)
    check("aten::div.out", torch.from_numpy(a) / torch.from_numpy(b), a, b)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int64])
def test_pow(dtype):
    a, ta = make((3, 4), dtype, "strided", seed=12, positive=True)
    e, te = make((4,), dtype, seed=13, positive=True)
    check("aten::pow.Tensor_Tensor_out", torch.pow(ta, te), a, e)
    for exponent in (2, 3, 0.5, -1.5) if dtype != np.int64 else (2, 3, 0.5):
        check("aten::pow.Tensor_Scalar_out", torch.pow(ta, exponent), a, exponent)
    check("aten::pow.Scalar_out", torch.pow(2, te), 2, e)
    check("aten::pow.Scalar_out", torch.pow(1.5, te), 1.5, e)


@pytest.mark.parametrize("op", ["remainder", "fmod"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
def test_remainder_fmod(op, dtype):
    a, ta = make((5, 4), dtype, seed=14)
    b, tb = make((4,), dtype, seed=15, positive=True)
    b = -b if op == "remainder" else b
    tb = torch.from_numpy(b)
    check(f"aten::{op}.Tensor_out", getattr(torch, op)(ta, tb), a, b)
    check(f"aten::{op}.Scalar_out", getattr(torch, op)(ta, 3), a, 3)


@pytest.mark.parametrize("sa, sb, da, db, layout", list(_pairs()))
@pytest.mark.parametrize("op", ["eq", "ne", "lt", "le", "gt", "ge"])
def test_comparison(op, sa, sb, da, db, layout):
    a, ta = make(sa, da, layout, seed=16)
    b, tb = make(sb, db, layout if sa == sb else "contiguous", seed=16)
    check(f"aten::{op}.Tensor_out", getattr(torch, op)(ta, tb), a, b)
    for scalar in (0, 0.5, -1):
        check(f"aten::{op}.Scalar_out", getattr(torch, op)(ta, scalar), a, scalar)


@pytest.mark.parametrize("dtype", [np.bool_, np.int32, np.float32])
@pytest.mark.parametrize("op", ["and", "or", "xor"])
def test_logical(op, dtype):
    a, ta = make((3, 4), dtype, "transposed", seed=17)
    b, tb = make((4,), dtype, seed=18)
    check(f"aten::logical_{op}.out", getattr(torch, f"logical_{op}")(ta, tb), a, b)
    check("aten::logical_not.out", torch.logical_not(ta), a)


@pytest.mark.parametrize("dtype", [np.bool_, np.int32, np.int64, np.uint8])
@pytest.mark.parametrize("op", ["and", "or", "xor"])
def test_bitwise(op, dtype):
    a, ta = make((3, 4), dtype, seed=19)
    b, tb = make((3, 4), dtype, "strided", seed=20)
    fn = getattr(torch, f"bitwise_{op}")
    check(f"aten::bitwise_{op}.Tensor_out", fn(ta, tb), a, b)
    scalar = True if dtype == np.bool_ else 5
    check(f"aten::bitwise_{op}.Scalar_out", fn(ta, scalar), a, scalar)
    check("aten::bitwise_not.out", torch.bitwise_not(ta), a)


@pytest.mark.parametrize("da, db", [(np.float32, np.float32), (np.int64, np.float32),
                                    (np.float16, np.float16), (np.bool_, np.bool_)])
def test_where(da, db):
    cond, tcond = make((3, 1, 5), np.bool_, seed=21)
    a, ta = make((4, 5), da, seed=22)
    b, tb = make((), db, seed=23)
    check("aten::where.self_out", torch.where(tcond, ta, tb), cond, a, b)


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_, np.float16])
def test_masked_fill(dtype):
    a, ta = make((3, 4, 5), dtype, "transposed", seed=24)
    mask, tmask = make((4, 1), np.bool_, seed=25)
    value = True if dtype == np.bool_ else (-7 if dtype == np.int64 else float("-inf"))
    check("aten::masked_fill.Scalar_out", ta.masked_fill(tmask, value), a, mask, value)
    tv = torch.tensor(value, dtype=ta.dtype)
    check("aten::masked_fill.Tensor_out", ta.masked_fill(tmask, tv), a, mask, tv.numpy())
