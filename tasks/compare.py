"""Compare the arms: speedup vs the baseline, one table in the parent run, the Prefect UI and the terminal."""
from __future__ import annotations

import pandas as pd
from prefect import task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from infra.stats import mean_interval
from infra.tracking import Tracker
from tasks.record import ArmResult, served
from tasks.speedup import speedup_interval

COLUMNS = ["arm", "role", "status", "acceptance_rate", "acceptance_rate_req", "mean_acceptance_length", "output_tok_s",
           "speedup_vs_baseline", "stream_tok_s", "speedup_paired", "ttft_ms_p50", "tpot_ms_p50", "server_ready_s",
           "measured"]
METRIC_COLUMNS = COLUMNS[3:-1]  # "measured": now, or reused from an earlier run with the same fingerprint
# Recorded here, as the verdict prints them: the mean of the requests' own tok/s with its interval, and the speedup
# paired by prompt (geometric mean of request-by-request ratios) with its interval. output_tok_s is the aggregate.
STREAM_METRICS = ("speedup_vs_baseline", "stream_tok_s", "stream_tok_s_lo", "stream_tok_s_hi", "speedup_paired",
                  "speedup_paired_lo", "speedup_paired_hi")


def stream_metrics(r: ArmResult, base: ArmResult | None) -> dict[str, float]:
    out = {}
    if r.request_tok_s:
        out.update(zip(("stream_tok_s", "stream_tok_s_lo", "stream_tok_s_hi"), mean_interval(r.request_tok_s)))
    paired = speedup_interval(r, base) if base else None
    if paired:
        out.update(zip(("speedup_paired", "speedup_paired_lo", "speedup_paired_hi"), paired))
    return out


def measured(r: ArmResult) -> str:
    """The table's `measured` column: the run's specdiag.served, named by arm (and "now" where measured now)."""
    if r.swapped_into:
        return f"now, swapped into {r.served_with}'s server ({r.metrics.get('swap_s', 0):.1f} s)"
    return served(r) if r.reused_from else f"now, {served(r)}"


def comparison_table(results: list[ArmResult]) -> pd.DataFrame:
    base = next((r for r in results if r.role == "baseline" and r.ok), None)
    base_tps = base.metrics.get("output_tok_s") if base else None
    rows = []
    for r in results:
        if r.ok and base_tps and "output_tok_s" in r.metrics:
            r.metrics["speedup_vs_baseline"] = r.metrics["output_tok_s"] / base_tps
        if r.ok:
            r.metrics.update(stream_metrics(r, base))
        rows.append({"arm": r.arm, "role": r.role, "status": "ok" if r.ok else "FAILED",
                     **{c: r.metrics.get(c) for c in METRIC_COLUMNS}, "measured": measured(r)})
    return pd.DataFrame(rows, columns=COLUMNS)


def comparison_markdown(frame: pd.DataFrame) -> str:
    cells = frame.astype(object).where(frame.notna(), "-")
    fmt = [[f"{v:.3f}" if isinstance(v, float) else str(v) for v in row] for row in cells.values.tolist()]
    lines = ["| " + " | ".join(frame.columns) + " |", "|" + "---|" * len(frame.columns)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in fmt])


@task(name="compare", cache_policy=NO_CACHE)
def compare(tracker: Tracker, parent_run_id: str, results: list[ArmResult]) -> pd.DataFrame:
    frame = comparison_table(results)
    for r in results:
        tracker.metrics(r.run_id, {k: r.metrics[k] for k in STREAM_METRICS if k in r.metrics})
    failed = [f"- {r.arm}: {r.error.splitlines()[0] if r.error else 'failed'}" for r in results if not r.ok]
    report = comparison_markdown(frame) + ("\n\nFailed arms:\n" + "\n".join(failed) if failed else "")
    tracker.table(parent_run_id, frame, "comparison.csv")
    tracker.text(parent_run_id, report, "comparison.md")
    create_markdown_artifact(report, key="specdiag-comparison", description="specdiag arm comparison")
    rows = frame.round(3).astype(object).where(frame.notna(), None).to_dict("records")
    create_table_artifact(rows, key="specdiag-arms", description="the arms' figures, as recorded in MLflow")
    return frame
