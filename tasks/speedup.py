"""The speedup model: what acceptance buys and what drafting costs, per arm, and the k that pays best.

A verification step with k drafts emits E_k = 1 + a_0 + ... + a_(k-1) tokens on average, a_i being the share of
drafts whose first i+1 tokens were all accepted (vLLM's per-position counters over num_drafts; this does not
depend on k). One step costs c baseline steps: c = TPOT_spec * E_k / TPOT_baseline, from the same measured window.
Split c = 1 + k*d (verifying k+1 tokens costs about one baseline step on a GPU; d is the drafting cost per draft
token, the rest of the step): the predicted speedup at k' <= k is E_k' / (1 + k'*d). A k_sweep arm measures
other k directly. At k the model's prediction is the TPOT ratio; the measured speedup (tok/s, TTFT included) sits
beside it, so a gap between them is visible.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from infra.stats import speedup_interval as tok_s_ratio
from tasks.record import ArmResult


@dataclass
class SpeedModel:
    arm: str
    k: int
    tokens_per_step: float  # E_k
    step_cost: float  # c, in baseline steps
    draft_cost: float  # d, baseline steps per draft token
    predicted: dict[int, float] = field(default_factory=dict)  # k' -> predicted speedup
    measured: tuple[float, float, float] | None = None  # mean, lo, hi of the tok/s ratio

    @property
    def best_k(self) -> int | None:
        """The k with the best predicted speedup, or None when none of them beats the baseline."""
        k, s = max(self.predicted.items(), key=lambda kv: kv[1])
        return k if s > 1.0 else None

    def metrics(self) -> dict[str, float]:
        out = {"tokens_per_step": self.tokens_per_step, "step_cost": self.step_cost, "draft_cost": self.draft_cost,
               "best_k": float(self.best_k or 0)}
        return out | {f"predicted_speedup_k{k}": s for k, s in self.predicted.items()}

    def line(self) -> str:
        best = f"best k {self.best_k} ({self.predicted[self.best_k]:.3f}x)" if self.best_k else \
            f"no k up to {self.k} pays off (best {max(self.predicted.values()):.3f}x)"
        meas = f"; measured {self.measured[0]:.3f}x [{self.measured[1]:.3f}-{self.measured[2]:.3f}]" \
            if self.measured else ""
        return (f"{self.arm}: {self.tokens_per_step:.3f} tokens per step at k={self.k}, each step costing "
                f"{self.step_cost:.3f} baseline steps ({self.draft_cost:.3f} per draft token): predicted "
                f"{self.predicted[self.k]:.3f}x{meas}; {best}")


def speedup_interval(r: ArmResult, base: ArmResult) -> tuple[float, float, float] | None:
    """The arm's tok/s over the baseline's with its 95% interval (infra.stats.speedup_interval, which the early stop
    settles too). None for an arm measured on another arm's server, after it: it met the prompts' prefixes cached, so
    its tok/s (TTFT included) reads high against the baseline's cold server; only the TPOT-based model speaks for it."""
    return None if r.served_with else tok_s_ratio(r.request_tok_s, base.request_tok_s)


def model(r: ArmResult, base: ArmResult, k: int) -> SpeedModel | None:
    m, b = r.metrics, base.metrics
    a = [m.get(f"acceptance_rate_pos_{i}") for i in range(k)]
    if None in a or not m.get("tpot_ms_p50") or not b.get("tpot_ms_p50"):
        return None
    e = 1 + sum(a)
    c = m["tpot_ms_p50"] * e / b["tpot_ms_p50"]
    d = max(0.0, (c - 1) / k)
    predicted = {j: (1 + sum(a[:j])) / (1 + j * d) for j in range(1, k + 1)}
    return SpeedModel(r.arm, k, e, c, d, predicted, speedup_interval(r, base))


def speed_models(results: list[ArmResult]) -> dict[str, SpeedModel]:
    """arm -> its model, for every drafter arm that ran next to a baseline."""
    base = next((r for r in results if r.role == "baseline" and r.ok), None)
    out = {}
    for r in results:
        if base and r.ok and r is not base and r.k:
            sm = model(r, base, r.k)
            if sm:
                out[r.arm] = sm
    return out


def k_sweep(results: list[ArmResult]) -> tuple[str | None, int | None]:
    """The candidate and its k_sweep probe arms side by side: predicted vs measured speedup per k, and the k with
    the best measured speedup: None when no k_sweep arm ran, or when that k's interval still reaches the served k's
    (the line says so: the point estimates alone would pick a k at random among equals)."""
    cand = next((r for r in results if r.role == "candidate" and r.ok), None)
    sweep = [r for r in results if r.probe == "k_sweep" and r.ok]
    models = speed_models(results)
    if cand is None or not sweep or cand.arm not in models:
        return None, None
    rows = []
    for r in sorted([cand, *sweep], key=lambda r: r.k):
        own = models.get(r.arm)
        predicted = models[cand.arm].predicted.get(r.k) or (own.predicted[r.k] if own else None)
        if own and own.measured:
            rows.append((r.k, predicted, own.measured))
    if not rows:
        return None, None
    best = max(rows, key=lambda row: row[2][0])
    served = next((m for k, _, m in rows if k == cand.k), None)
    clear = best[0] == cand.k or served is None or best[2][1] > served[2]
    cells = [f"k={k}: predicted {p:.3f}x, measured {m[0]:.3f}x [{m[1]:.3f}-{m[2]:.3f}]" for k, p, m in rows]
    tail = "" if clear else f", not clearly: its interval reaches that of k={cand.k} as served"
    return f"k_sweep: {'; '.join(cells)}; best measured k={best[0]}{tail}", best[0] if clear else None
