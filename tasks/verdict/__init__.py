"""Name the cause: the rules (tasks/verdict/rules.py, a table tried in order) over the measured evidence
(tasks/verdict/evidence.py), never claiming more than it supports; every drafter arm's own cause; the record."""
from __future__ import annotations

import json
from dataclasses import asdict, replace

from prefect import task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from infra.tracking import Tag, Tracker
from tasks.compare import stream_metrics
from tasks.inspect import Finding
from tasks.offline import OfflineResult
from tasks.record import ArmResult
from tasks.speedup import k_sweep, speed_models
from tasks.verdict.asks import questions, speed_compared
from tasks.verdict.evidence import (HEALTHY, INTEGRATION_RATIO, MIN_DRAFTS, NEAR_ZERO, Verdict,
                                    acceptance_interval, decision_thresholds, offline_interval, probe_line,
                                    speed_judged)
from tasks.verdict.probes import probe_flips
from tasks.verdict.rules import RULES, decide

EVIDENCE = "evidence.json"  # the static findings and the offline evaluation, as the rules read them

__all__ = ["EVIDENCE", "assemble", "HEALTHY", "INTEGRATION_RATIO", "MIN_DRAFTS", "NEAR_ZERO", "RULES", "Verdict",
           "acceptance_interval", "arm_verdicts", "decide", "decision_thresholds", "offline_interval", "probe_flips",
           "questions", "speed_compared", "speed_judged", "throughput_lines", "verdict"]


def throughput_lines(results: list[ArmResult]) -> list[str]:
    """Per drafter arm: the speed model (tokens per step, step cost, predicted vs measured, best k), or, without
    per-position counters, the measured speedup alone."""
    base = next((r for r in results if r.role == "baseline" and r.ok), None)
    models, lines = speed_models(results), []
    for r in results:
        if r.arm in models:
            lines.append(models[r.arm].line())
        elif r.ok and base and r is not base and "speedup_paired" in (m := stream_metrics(r, base)):
            lines.append(f"{r.arm}: {m['stream_tok_s']:.3f} tok/s per stream vs baseline "
                         f"{stream_metrics(base, None)['stream_tok_s']:.3f}; speedup {m['speedup_paired']:.3f}x "
                         f"[{m['speedup_paired_lo']:.3f}-{m['speedup_paired_hi']:.3f}]")
    return lines


def arm_verdicts(results: list[ArmResult], findings: dict[str, list[Finding]],
                 offline: OfflineResult | None = None) -> dict[str, Verdict]:
    """A cause for every other drafter arm, decided as if it were the candidate: the control's against its own
    evidence (no reference), an extra arm's against the control. Probes are read by the candidate's verdict."""
    ctrl = next((r for r in results if r.role == "control"), None)
    base = [r for r in results if r.role == "baseline"]
    out = {}
    for r in results:
        if r.role not in ("control", "extra"):
            continue
        ref = [ctrl] if ctrl is not None and r is not ctrl else []
        out[r.arm] = decide(base + [replace(r, role="candidate")] + ref, findings, offline)
    return out


def assemble(results: list[ArmResult], findings: dict[str, list[Finding]],
             offline: OfflineResult | None = None) -> tuple[Verdict, dict[str, Verdict]]:
    """The candidate's verdict with every line of evidence the record shows, and each other drafter arm's own cause:
    from the arms' figures, the static findings and the offline evaluation alone (flows/verdict.py recomputes it)."""
    v = decide(results, findings, offline)
    v.evidence += [probe_line(p) for p in results if p.role == "probe" and p.ok
                   and not any(e.startswith(f"{p.arm}: acceptance") for e in v.evidence)]  # read or not, shown
    v.evidence += [line for line in throughput_lines(results) if line not in v.evidence]
    sweep, _ = k_sweep(results)
    if sweep:
        v.evidence.append(sweep)
    others = arm_verdicts(results, findings, offline)
    v.evidence += [f"{arm} on its own: `{av.cause}` ({av.evidence[-1] if av.evidence else ''})"
                   for arm, av in others.items()]
    return v, others


@task(name="verdict", cache_policy=NO_CACHE)
def verdict(tracker: Tracker, parent_run_id: str, results: list[ArmResult],
            findings: dict[str, list[Finding]], offline: OfflineResult | None = None) -> Verdict:
    v, others = assemble(results, findings, offline)
    causes = {**{r.arm: v.cause for r in results if r.role == "candidate"}, **{a: o.cause for a, o in others.items()}}
    for arm, cause in causes.items():
        tracker.tag(next(r.run_id for r in results if r.arm == arm), Tag.ARM_VERDICT, cause)
    for arm, sm in speed_models(results).items():
        tracker.metrics(next(r.run_id for r in results if r.arm == arm), sm.metrics())
    tracker.tag(parent_run_id, Tag.VERDICT, v.cause)
    tracker.text(parent_run_id, v.markdown(), "verdict.md")
    tracker.text(parent_run_id, json.dumps({"findings": {a: [asdict(f) for f in fs] for a, fs in findings.items()},
                                            "offline": asdict(offline or OfflineResult())}, indent=1, default=str),
                 EVIDENCE)
    create_markdown_artifact(v.markdown(), key="specdiag-verdict", description="specdiag verdict")
    return v
