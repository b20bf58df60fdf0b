"""Charts for the parent run: per-position acceptance of every arm on one chart; tok/s with speedup."""
from __future__ import annotations

import tempfile
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from prefect import task  # noqa: E402
from prefect.cache_policies import NO_CACHE  # noqa: E402

from infra.tracking import ROLE_COLORS, Tracker  # noqa: E402
from tasks.record import ArmResult  # noqa: E402
from tasks.speedup import speed_models  # noqa: E402


def per_position(metrics: dict[str, float]) -> list[float]:
    return [metrics[f"acceptance_rate_pos_{i}"] for i in range(64) if f"acceptance_rate_pos_{i}" in metrics]


def draw(results: list[ArmResult], out: Path) -> list[Path]:
    acc_path, tps_path = out / "acceptance_per_position.png", out / "throughput.png"
    fig, ax = plt.subplots(figsize=(6, 4))
    longest = 0
    for r in results:
        curve = per_position(r.metrics)
        if curve:
            ax.plot(range(len(curve)), curve, marker="o", label=r.arm, color=ROLE_COLORS.get(r.role))
            longest = max(longest, len(curve))
    ax.set_xticks(range(longest))
    ax.set(xlabel="draft position", ylabel="acceptance rate (of drafts)", ylim=(-0.02, 1.02),
           title="Per-position acceptance")
    ax.legend()
    fig.tight_layout()
    fig.savefig(acc_path, dpi=100)
    plt.close(fig)

    ok = [r for r in results if r.ok and "output_tok_s" in r.metrics]
    fig, ax = plt.subplots(figsize=(6, 4))
    bars = ax.bar([r.arm for r in ok], [r.metrics["output_tok_s"] for r in ok],
                  color=[ROLE_COLORS.get(r.role, "tab:blue") for r in ok])
    for bar, r in zip(bars, ok):
        if "speedup_vs_baseline" in r.metrics:
            ax.annotate(f"{r.metrics['speedup_vs_baseline']:.3f}x", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        ha="center", va="bottom")
    ax.set(ylabel="output tokens/s", title="Throughput (speedup vs baseline)")
    fig.tight_layout()
    fig.savefig(tps_path, dpi=100)
    plt.close(fig)
    return [acc_path, tps_path] + _speed_by_k(results, out) + _per_request(results, out)


def _speed_by_k(results: list[ArmResult], out: Path) -> list[Path]:
    """Predicted speedup per k (the speed model), the measured one at the served k with its interval."""
    models = speed_models(results)
    if not models:
        return []
    path = out / "speedup_by_k.png"
    fig, ax = plt.subplots(figsize=(6, 4))
    for sm in models.values():
        line, = ax.plot(list(sm.predicted), list(sm.predicted.values()), marker="o", label=f"{sm.arm} (predicted)")
        if sm.measured:
            mean, lo, hi = sm.measured
            ax.errorbar([sm.k], [mean], yerr=[[mean - lo], [hi - mean]], fmt="s", color=line.get_color(),
                        capsize=4, label=f"{sm.arm} (measured)")
    ax.axhline(1.0, color="grey", linestyle="--")
    ax.set_xticks(sorted({k for sm in models.values() for k in sm.predicted}))
    ax.set(xlabel="num_speculative_tokens (k)", ylabel="speedup vs baseline", title="Speedup by k")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return [path]


def _per_request(results: list[ArmResult], out: Path) -> list[Path]:
    """Each request's own acceptance, one column of dots per drafter arm, with the interval over requests: the spread
    the verdict's intervals come from (prompts differ; drafts within one request are not independent)."""
    arms = [r for r in results if r.request_acceptance]
    if not arms:
        return []
    path = out / "acceptance_per_request.png"
    fig, ax = plt.subplots(figsize=(6, 4))
    for x, r in enumerate(arms):
        color = ROLE_COLORS.get(r.role, "tab:blue")
        ax.scatter([x] * len(r.request_acceptance), r.request_acceptance, color=color, alpha=0.6, s=18)
        m = r.metrics
        if "acceptance_rate_req" in m:
            ax.errorbar([x + 0.15], [m["acceptance_rate_req"]], yerr=[[m["acceptance_rate_req"] -
                        m["acceptance_rate_req_lo"]], [m["acceptance_rate_req_hi"] - m["acceptance_rate_req"]]],
                        fmt="D", color=color, capsize=4)
    ax.set_xticks(range(len(arms)), [r.arm for r in arms], fontsize=8)
    ax.set(ylabel="acceptance rate (per request)", ylim=(-0.02, 1.02),
           title="Acceptance per request (95% CI over requests)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return [path]


@task(name="plots", cache_policy=NO_CACHE)
def plots(tracker: Tracker, parent_run_id: str, results: list[ArmResult]) -> dict[str, bytes]:
    """The charts on the parent run; returned as PNG bytes for the report."""
    with tempfile.TemporaryDirectory() as tmp:
        paths = draw(results, Path(tmp))
        for path in paths:
            tracker.file(parent_run_id, path)
        return {path.name: path.read_bytes() for path in paths}
