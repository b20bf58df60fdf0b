"""Write one arm into its MLflow child run: params, metrics, artifacts, status. Nothing measured is lost."""
from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd
from prefect import task
from prefect.cache_policies import NO_CACHE

from infra.tracking import ROLE_COLORS, RUN_COLOR, Tag, Tracker
from tasks.bench import BenchResult
from tasks.scrape import Snapshot


@dataclass
class ArmResult:
    arm: str
    role: str
    run_id: str
    ok: bool = False
    error: str = ""
    metrics: dict[str, float] = field(default_factory=dict)
    request_tok_s: list[float] = field(default_factory=list)  # per measured request, for intervals
    request_acceptance: list[float] = field(default_factory=list)  # per measured request that drafted
    probe: str = ""  # the probe that derived this arm from the candidate, if any
    method: str = ""  # the speculative method (eagle3, draft_model, ngram, ...); "" for the baseline
    k: int = 0  # num_speculative_tokens; 0 for the baseline
    interrupted: bool = False  # stopped by Ctrl-C, SIGTERM or a Prefect cancellation: the run ends KILLED
    reused_from: str = ""  # "<run id> (<when>)" when an earlier measurement with the same fingerprint stands in
    served_with: str = ""  # the arm whose server it was measured on, after that arm (flows/arm.py riders)
    swapped_into: str = ""  # the run of the arm that loaded that server, where its drafter was swapped in


@dataclass
class ArmEvidence:
    """Whatever an arm measured before it ended, well or not."""

    server_cmd: str = ""
    log_path: str = ""
    engine_version: str = ""
    bench: BenchResult | None = None
    before: Snapshot | None = None
    after: Snapshot | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    sweep: pd.DataFrame | None = None  # the concurrency sweep's rows, if one ran


def arm_run(arm) -> tuple[str, dict[str, str]]:
    """An arm's MLflow run name (the runs table's first column) and tags, measured or reused."""
    tags = {Tag.KIND: "arm", Tag.ARM: arm.name, Tag.DRAFTER: arm.drafter or "none",
            Tag.ROLE: arm.role, Tag.PROBE: arm.probe or "none", RUN_COLOR: ROLE_COLORS[arm.role]}
    return (arm.name if arm.role == "baseline" else f"{arm.role}: {arm.name}"), tags




def served(result: ArmResult) -> str:
    if result.reused_from:
        return f"reused {result.reused_from}"
    if result.swapped_into:
        return f"swapped into {result.swapped_into}"
    return f"on {result.served_with}'s server" if result.served_with else "fresh load"


def known_before(arm, offline: dict[str, float] | None) -> dict[str, float]:
    """What an arm's run carries before it is measured: its offline numbers and its declared expected acceptance."""
    out = dict(offline or {})
    if arm.spec and arm.spec.expected_acceptance is not None:
        out["expected_acceptance"] = arm.spec.expected_acceptance
    return out


@task(name="record-arm", cache_policy=NO_CACHE)
def record_arm(tracker: Tracker, result: ArmResult, params: dict[str, str], ev: ArmEvidence) -> None:
    """The arm's evidence into its run; the run ends whatever happens here (FAILED if recording itself fails)."""
    run, recorded = result.run_id, False
    try:
        if result.error:
            tracker.text(run, result.error, "error.txt")
            tracker.tag(run, Tag.ERROR, result.error.splitlines()[0][:500])
        tracker.params(run, {**params, "server_cmd": ev.server_cmd or "not launched",
                             "engine_version": ev.engine_version or "unknown"})
        tracker.tag(run, Tag.SERVED, served(result))
        tracker.metrics(run, result.metrics)
        tracker.file(run, ev.log_path)
        if ev.bench:
            tracker.table(run, ev.bench.frame(), "requests.csv")
            if ev.bench.stop_reason:
                tracker.tag(run, Tag.EARLY_STOP, ev.bench.stop_reason)
            if ev.bench.asked:
                tracker.tag(run, Tag.ASKED, ev.bench.asked[:500])
        if ev.sweep is not None:
            tracker.table(run, ev.sweep, "concurrency_sweep.csv")
        if ev.before:
            tracker.text(run, ev.before.metrics_text, "metrics_before.txt")
        if ev.after:
            tracker.text(run, ev.after.metrics_text, "metrics_after.txt")
        recorded = True
    finally:
        tracker.finish(run, result.ok and recorded, killed=result.interrupted)
