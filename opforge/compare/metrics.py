"""How far one run's node result is from the reference's, and whether that is too far.

Three numbers per node, all against the reference ``r`` (eager float64):

* ``max_abs``: ``max |x - r|``;
* ``rel``: ``max_abs / max |r|`` (the error relative to the tensor's scale, so one tiny
  reference element does not blow it up);
* ``sqnr``: ``10 log10(sum r² / sum (x - r)²)`` in dB (``inf`` when equal).

A float run leaves its tolerance at a node when ``max_abs > atol + rtol * max |r|``; a
quantized run when its SQNR falls below ``min_sqnr`` (quantization error is expected, so
it is judged by signal-to-noise, as quantization reports are). Non-finite mismatches
(a NaN where the reference has a number) always leave it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["Tolerance", "NodeError", "node_error"]


@dataclass(frozen=True)
class Tolerance:
    rtol: float = 1e-3
    atol: float = 1e-5
    min_sqnr: float | None = None   # set: judged by SQNR (quantized runs)

    def describe(self) -> str:
        if self.min_sqnr is not None:
            return f"SQNR >= {self.min_sqnr:g} dB"
        return f"|x - r| <= {self.atol:g} + {self.rtol:g} * max|r|"


@dataclass(frozen=True)
class NodeError:
    max_abs: float
    rel: float
    sqnr: float          # dB; inf when equal
    within: bool
    note: str = ""       # why it could not be compared, or what was compared

    def as_dict(self) -> dict:
        def num(v: float) -> float | str:
            return v if math.isfinite(v) else ("inf" if v > 0 else "-inf" if v < 0 else "nan")
        return {"max_abs": num(self.max_abs), "rel": num(self.rel), "sqnr_db": num(self.sqnr),
                "within": self.within, **({"note": self.note} if self.note else {})}


def node_error(value: np.ndarray, reference: np.ndarray, tolerance: Tolerance) -> NodeError:
    """The error of ``value`` against ``reference`` (same shape), judged by ``tolerance``."""
    x, r = np.asarray(value), np.asarray(reference)
    if x.shape != r.shape:
        if x.size == r.size:
            x = x.reshape(r.shape)
        else:
            return NodeError(math.inf, math.inf, -math.inf, False,
                             f"shape {list(x.shape)} vs reference {list(r.shape)}")
    if x.dtype == np.bool_ or r.dtype == np.bool_:
        x, r = x.astype(np.float64), r.astype(np.float64)
    x, r = x.astype(np.float64, copy=False), r.astype(np.float64, copy=False)
    both_nan = np.isnan(x) & np.isnan(r)
    same_inf = np.isinf(x) & (x == r)
    skip = both_nan | same_inf
    if not np.any(~skip):
        return NodeError(0.0, 0.0, math.inf, True)
    x, r = x[~skip], r[~skip]
    if not np.all(np.isfinite(x)) or not np.all(np.isfinite(r)):
        return NodeError(math.inf, math.inf, -math.inf, False, "non-finite values differ")
    diff = x - r
    max_abs = float(np.max(np.abs(diff))) if diff.size else 0.0
    scale = float(np.max(np.abs(r))) if r.size else 0.0
    rel = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else math.inf)
    noise = float(np.sum(diff * diff))
    signal = float(np.sum(r * r))
    if noise == 0:
        sqnr = math.inf
    elif signal == 0:
        sqnr = -math.inf
    else:
        sqnr = 10 * math.log10(signal / noise)
    if tolerance.min_sqnr is not None:
        within = sqnr >= tolerance.min_sqnr or max_abs <= tolerance.atol
    else:
        within = max_abs <= tolerance.atol + tolerance.rtol * scale
    return NodeError(max_abs, rel, sqnr, bool(within))
