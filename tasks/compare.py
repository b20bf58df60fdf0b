"""Compare the arms: speedup vs the baseline, one table in the parent run, the Prefect UI and the terminal."""
from __future__ import annotations

import pandas as pd
from prefect import task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from infra.tracking import Tracker
from tasks.record import ArmResult

COLUMNS = ["arm", "role", "status", "acceptance_rate", "mean_acceptance_length", "output_tok_s",
           "speedup_vs_baseline", "ttft_ms_p50", "tpot_ms_p50", "server_ready_s"]


def comparison_table(results: list[ArmResult]) -> pd.DataFrame:
    base = next((r for r in results if r.role == "baseline" and r.ok), None)
    base_tps = base.metrics.get("output_tok_s") if base else None
    rows = []
    for r in results:
        if r.ok and base_tps and "output_tok_s" in r.metrics:
            r.metrics["speedup_vs_baseline"] = r.metrics["output_tok_s"] / base_tps
        rows.append({"arm": r.arm, "role": r.role, "status": "ok" if r.ok else "FAILED",
                     **{c: r.metrics.get(c) for c in COLUMNS[3:]}})
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
        if "speedup_vs_baseline" in r.metrics:
            tracker.metrics(r.run_id, {"speedup_vs_baseline": r.metrics["speedup_vs_baseline"]})
    failed = [f"- {r.arm}: {r.error.splitlines()[0] if r.error else 'failed'}" for r in results if not r.ok]
    report = comparison_markdown(frame) + ("\n\nFailed arms:\n" + "\n".join(failed) if failed else "")
    tracker.table(parent_run_id, frame, "comparison.csv")
    tracker.text(parent_run_id, report, "comparison.md")
    create_markdown_artifact(report, key="specdiag-comparison", description="specdiag arm comparison")
    return frame
