"""The statistics the verdict and the early stop share: a proportion's Wilson interval, a mean's t-interval."""
from __future__ import annotations

import numpy as np
from scipy.special import stdtrit  # the t distribution's quantile (scipy.stats costs 0.4 s more to import)


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
    half = stdtrit(v.size - 1, 0.975) * (v.std(ddof=1) / np.sqrt(v.size) or 1e-12)
    return float(v.mean()), float(v.mean() - half), float(v.mean() + half)


def ratio_interval(num: list[float], den: list[float]) -> tuple[float, float, float] | None:
    """A ratio of sums over clusters (accepted / drafted over requests) with its 95% interval from the spread over
    the clusters: the delta method's cluster-robust variance, t with n-1 degrees of freedom. Drafts within one
    request are correlated (one prompt, one context), so the requests are the independent units, not the drafts.
    None with fewer than two clusters that drafted."""
    a, d = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    a, d = a[d > 0], d[d > 0]
    if d.size < 2:
        return None
    r = a.sum() / d.sum()
    resid = a - r * d
    se = np.sqrt(d.size / (d.size - 1) * np.sum(resid ** 2)) / d.sum()
    half = stdtrit(d.size - 1, 0.975) * se
    return float(r), max(0.0, float(r - half)), min(1.0, float(r + half))
