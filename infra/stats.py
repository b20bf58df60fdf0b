"""The statistics the verdict and the early stop share: a proportion's Wilson interval, a mean's t-interval, a
speedup's interval."""
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


def speed_logs(arm: list[float], base: list[float]) -> tuple[np.ndarray, np.ndarray, bool]:
    """The logs of two arms' per-request tok/s, and whether they pair by prompt (as many of each). A request that
    emitted no token has no ratio: dropped, with its pair where paired."""
    a, b = np.asarray(arm, dtype=float), np.asarray(base, dtype=float)
    paired = a.size == b.size
    keep_a, keep_b = ((a > 0) & (b > 0),) * 2 if paired else (a > 0, b > 0)
    return np.log(a[keep_a]), np.log(b[keep_b]), paired


def speedup_interval(arm: list[float], base: list[float]) -> tuple[float, float, float] | None:
    """An arm's per-request tok/s over the baseline's: the geometric mean ratio with its 95% interval, on the logs.
    Over as many requests as the baseline, paired by prompt: every arm serves the same prompts in the same order, so
    request i of both shares a prompt and its length, and the t-interval of the log ratios leaves the prompts' spread
    out. Where the early stop ended the two at different counts, every request of both counts instead: the mean logs'
    difference with Welch's interval, so that no request measured for the comparison is dropped from it. None with
    fewer than two requests on either side (no spread to make an interval from)."""
    a, b, paired = speed_logs(arm, base)
    if a.size < 2 or b.size < 2:
        return None
    if paired:
        mean, lo, hi = mean_interval(list(a - b))
    else:
        va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
        df = (va + vb) ** 2 / (va ** 2 / (a.size - 1) + vb ** 2 / (b.size - 1)) if va + vb > 0 else 1.0
        mean = float(a.mean() - b.mean())
        half = stdtrit(df, 0.975) * (np.sqrt(va + vb) or 1e-12)
        lo, hi = mean - half, mean + half
    return float(np.exp(mean)), float(np.exp(lo)), float(np.exp(hi))
