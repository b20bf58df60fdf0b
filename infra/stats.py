"""The statistics the verdict and the early stop share: a proportion's Wilson interval, a mean's t-interval."""
from __future__ import annotations

import numpy as np
from scipy import stats


def wilson(successes: float, n: float, z: float = 1.96) -> tuple[float, float]:
    if n <= 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def mean_interval(values: list[float]) -> tuple[float, float, float]:
    """Mean and 95% t-interval of per-request throughputs (run-to-run noise)."""
    v = np.asarray(values, dtype=float)
    if v.size < 2:
        return (float(v.mean()) if v.size else 0.0,) * 3
    lo, hi = stats.t.interval(0.95, v.size - 1, loc=v.mean(), scale=stats.sem(v) or 1e-12)
    return float(v.mean()), float(lo), float(hi)
