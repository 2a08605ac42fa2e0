"""The few statistics the report needs: percentiles, geometric mean, least-squares line."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

__all__ = ["summarize", "geomean", "fit_line"]


def summarize(samples: Sequence[float]) -> dict[str, float]:
    """Median and p10/p90 of pooled per-call samples (seconds)."""
    p10, p50, p90 = np.percentile(np.asarray(samples, dtype=float), [10, 50, 90])
    return {"median_s": float(p50), "p10_s": float(p10), "p90_s": float(p90), "n": len(samples)}


def geomean(values: Sequence[float]) -> float:
    values = [v for v in values if v and v > 0 and math.isfinite(v)]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else float("nan")


def fit_line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least squares ``y = slope * x + intercept``; returns ``(slope, intercept)``."""
    slope, intercept = np.polyfit(np.asarray(xs, float), np.asarray(ys, float), 1)
    return float(slope), float(intercept)
