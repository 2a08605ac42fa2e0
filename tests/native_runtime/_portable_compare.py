"""Shared by the portable C++ kernel tests: run one key through the C++ kernel and the NumPy
kernel of the same key on equal fresh outs and compare bit for bit (``compare``), or return
both kernels' outs for a test's own tolerance (``run_both``)."""

from __future__ import annotations

import numpy as np
import pytest

from opforge.errors import KernelError
from opforge.kernels.portable import portable_kernels
from opforge.runtime.native import NativeLibrary

NUMPY = portable_kernels()


@pytest.fixture(scope="module")
def lib(native_runtime):
    return NativeLibrary(native_runtime.portable_library)


@pytest.fixture(scope="module")
def numpy_kernels():
    return NUMPY


def run_both(lib, numpy_kernels, key, args, outs) -> list[tuple]:
    """Run the NumPy kernel and the C++ one on copies of ``args`` (the outs at the indices
    ``outs``); return the (NumPy, C++) pairs of those outs."""
    want = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    got = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    with np.errstate(all="ignore"):
        numpy_kernels[key](*want)
    lib.kernel(key)(*got)
    return [(want[i], got[i]) for i in outs]


def _fresh(value):
    if isinstance(value, np.ndarray):
        # garbage, not zeros: a kernel that leaves an element unwritten is caught
        return np.full_like(value, 0x5A if value.dtype.kind in "iub" else 7.25)
    if isinstance(value, list):
        return [_fresh(v) for v in value]
    return value


def same(a, b) -> bool:
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def compare(lib, key, *args, outs=1):
    """Call both kernels with ``args`` (the last ``outs`` are outs, copied fresh for each)."""
    ins, out_args = list(args[:-outs]), list(args[-outs:])
    ours, theirs = _fresh(out_args), _fresh(out_args)
    lib.kernel(key)(*ins, *ours)
    NUMPY[key](*ins, *theirs)
    assert same(ours, theirs), f"{key}: C++ {ours} != NumPy {theirs}"
    return ours


def refused(lib, key, *args, match: str):
    with pytest.raises(KernelError, match=match):
        lib.kernel(key)(*args)
