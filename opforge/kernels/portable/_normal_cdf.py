"""GELU's exact form ``x * Phi(x)`` as a table lookup in a few ufunc steps, per float dtype.

# Design
#
# NumPy has no erf, and the float64 one in ``_erf`` (piecewise Chebyshev, ~80 float64
# passes) costs ~90 µs on a 512-element tensor. A bound GELU instead looks the standard
# normal CDF ``Phi(x) = erfc(-x / sqrt 2) / 2`` up in a table of per-cell polynomials on
# a uniform grid of step ``h = 2**-m``, built once from ``math.erfc``:
#
#   s = x / h             exact: h is a power of two
#   s = clamp(s, -K-1, K) fmax first, so NaN becomes a harmless finite index (the final
#                         x * Phi is NaN anyway); K = LIMIT / h
#   i = floor(s), u = s - i in [0, 1), exactly
#   Phi = P[i + K + 1](u) a table row gathered by ``take(mode="clip")``: NumPy's fastest
#                         take, ~2x its "raise" and ~5x its "wrap" mode on negative indices
#   y = x * Phi
#
# Row 0 (x below -LIMIT) is the zero polynomial and row 2K + 1 (x >= LIMIT) the constant 1,
# so -inf gives -inf * 0 = nan and +inf gives inf, as the erf formula does.
#
# float32 (and float16, through float32): degree 1, h = 2**-10, LIMIT 6. Each cell's line
# interpolates Phi at the two Chebyshev points of the cell (error <= h**2/16 * max|Phi''|
# = 1.5e-8); its value and slope are rounded to float32 (3e-8), the sum rounds once more
# (3e-8): |Phi error| < 8e-8, i.e. < 1.6e-7 in erf, below float32's own spacing of 1.2e-7
# near 1. Beyond ±6, Phi is 0 or 1 to within 1e-9. Value and slope are stored as one
# complex64 ``V + i D`` and the fraction as ``w = 1 - i u`` (its real part written once, at
# bind), so one gather and one complex multiply give ``Re(c w) = V + D u``: 10 ufunc calls.
#
# float64: degree 4, h = 2**-7, LIMIT 8, Horner's rule on the gathered row's columns. Each
# cell interpolates Phi at 5 Chebyshev points: error <= 2 (h/4)**5 / 5! max|Phi^(5)| =
# 6e-16; coefficients are fitted to Phi - Phi(cell midpoint) (values ~1e-3), so fitting
# rounds far below that. Beyond ±8, |x Phi(x)| - |x| (1 - Phi(|x|)) < 5e-15.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

import numpy as np

__all__ = ["TABLE32", "TABLE64", "Table", "gelu_erf_scratch", "gelu_erf_steps", "phi"]


def phi(x: float) -> float:
    """The standard normal CDF in float64, from the standard library's erfc."""
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


@dataclass(frozen=True)
class Table:
    """A table layout: ``cells_per_unit`` cells (a power of two) per unit of x on
    [-limit, limit], each a polynomial of ``degree`` in u, evaluated in ``dtype``."""

    cells_per_unit: int
    limit: int
    degree: int
    dtype: str

    @property
    def cells(self) -> int:  # K
        return self.cells_per_unit * self.limit


TABLE32 = Table(1 << 10, 6, 1, "float32")
TABLE64 = Table(1 << 7, 8, 4, "float64")


@cache
def _rows(table: Table) -> np.ndarray:
    """(2K + 2, degree + 1) float64 coefficients in u of each cell's polynomial."""
    k, n, h = table.cells, table.degree + 1, 1.0 / table.cells_per_unit
    nodes = 0.5 - 0.5 * np.cos(np.pi * (np.arange(n) + 0.5) / n)  # Chebyshev, in [0, 1]
    vandermonde_inverse = np.linalg.inv(nodes[:, None] ** np.arange(n))
    cells = np.arange(-k, k)  # cell j spans [j h, (j + 1) h]; row j + K + 1
    mid = np.array([phi(v) for v in ((cells + 0.5) * h).tolist()])
    at_nodes = [phi(v) for v in ((cells[:, None] + nodes) * h).ravel().tolist()]
    rows = np.zeros((2 * k + 2, n))
    rows[1:-1] = (np.reshape(at_nodes, (2 * k, n)) - mid[:, None]) @ vandermonde_inverse.T
    rows[1:-1, 0] += mid
    rows[-1, 0] = 1.0
    return rows


@cache
def _line32() -> np.ndarray:
    """TABLE32's rows as complex64 ``V + i D``, read-only."""
    rows = _rows(TABLE32)
    packed = (rows[:, 0] + 1j * rows[:, 1]).astype(np.complex64)
    packed.flags.writeable = False
    return packed


@cache
def _poly64() -> np.ndarray:
    rows = _rows(TABLE64)
    rows.flags.writeable = False
    return rows


def _table_for(dtype: np.dtype) -> Table:
    return TABLE64 if dtype == np.float64 else TABLE32


def gelu_erf_scratch(shape: tuple, dtype: np.dtype) -> tuple[np.ndarray, ...]:
    """The scratch buffers ``gelu_erf_steps`` needs for ``shape`` elements of a GELU into
    ``dtype`` (float16, 32 or 64); the element axes come first, so ``a[:m]`` of each
    serves a block of ``m`` elements of a 1-d ``shape``."""
    table = _table_for(np.dtype(dtype))
    ct = np.dtype(table.dtype)
    s, floor = np.empty(shape, ct), np.empty(shape, ct)
    index, index32 = np.empty(shape, np.intp), np.empty(shape, np.int32)
    # The clamp bounds as whole arrays: NumPy's SIMD fmax/fmin loops take two contiguous
    # arrays; against a 0-d bound they run scalar, 4x slower from ~4K elements.
    low, high = np.full(shape, -table.cells - 1, ct), np.full(shape, table.cells, ct)
    if table is TABLE32:
        fraction = np.empty(shape, np.complex64)
        fraction.real = 1.0  # w = 1 - i u: only the imaginary part is written per call
        last = (fraction, np.empty(shape, np.complex64))
    else:
        last = (np.empty(shape + (table.degree + 1,), ct), np.empty(shape, ct))
    return (s, floor, index, index32, low, high) + last


def gelu_erf_steps(x: np.ndarray, out: np.ndarray, scratch: tuple, *,
                   large: bool = False) -> list[tuple]:
    """Steps computing ``out = x * Phi(x)`` (same shapes; float16 computes in float32)
    with ``scratch`` from ``gelu_erf_scratch``.

    ``large`` (per-element cost rules, not the ~0.5 µs a ufunc call costs) makes the index
    in two SIMD casts, float -> int32 -> intp, 2x faster than NumPy's scalar float -> int64
    cast from ~4K elements; the values are the same.
    """
    table = _table_for(out.dtype)
    ct = np.dtype(table.dtype)
    k = table.cells
    s, floor, index, index32, low, high = scratch[:6]
    pairs = [
        (np.multiply, (x, np.asarray(table.cells_per_unit, ct), s)),  # exact
        (np.fmax, (s, low, s)),                                        # NaN -> low
        (np.fmin, (s, high, s)),
        (np.floor, (s, floor)),
    ]
    if table is TABLE32:
        fraction, gathered = scratch[6:]
        pairs.append((np.subtract, (floor, s, fraction.imag)))     # -u
    else:
        pairs.append((np.subtract, (s, floor, s)))                  # u, in place
    pairs.append((np.add, (floor, np.asarray(k + 1, ct), floor)))  # exact: < 2**24
    if large:
        pairs += [(_cast, (index32, floor)), (_cast, (index, index32))]
    else:
        pairs.append((_cast, (index, floor)))
    if table is TABLE32:
        return pairs + [
            (_line32().take, (index, 0, gathered, "clip")),
            (np.multiply, (gathered, fraction, gathered)),         # Re = V + D u
            _product(x, gathered.real, out),
        ]
    coefficients, poly = scratch[6:]
    pairs += [
        (_poly64().take, (index, 0, coefficients, "clip")),
        (np.multiply, (coefficients[..., -1], s, poly)),
    ]
    for j in range(table.degree - 1, 0, -1):
        pairs += [(np.add, (poly, coefficients[..., j], poly)), (np.multiply, (poly, s, poly))]
    return pairs + [(np.add, (poly, coefficients[..., 0], poly)), _product(x, poly, out)]


def _cast(dst: np.ndarray, src: np.ndarray) -> None:
    np.copyto(dst, src, casting="unsafe")


def _multiply_rounding(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    np.multiply(a, b, out=out, casting="same_kind")


def _product(x: np.ndarray, phi_x: np.ndarray, out: np.ndarray) -> tuple:
    """The step ``out = x * phi_x``; a float16 out is computed in float32, rounded once."""
    if x.dtype == phi_x.dtype == out.dtype:
        return np.multiply, (x, phi_x, out)
    return _multiply_rounding, (x, phi_x, out)
