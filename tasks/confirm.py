"""--confirm: the fix the verdict implies, run as one more arm, and whether it helped (tag specdiag.confirmed).

Where the verdict's own evidence already is the intervention (the offline evaluation with the control's d2t or
other aux layers, a probe arm, a measured k_sweep arm), nothing more runs: it is confirmed by that. A fix that one arm
can apply (another k, the control's mapping, eager mode) is served and compared with the candidate: acceptance
clearly higher (separated intervals, 1.5x), or for draft_overhead a paired speedup whose interval lies above the
candidate's. Causes whose fix lies outside the serving (training, the engine's code) say so.
"""
from __future__ import annotations

from dataclasses import replace

from prefect import task
from prefect.cache_policies import NO_CACHE

from infra.arms import PROBES, Arm
from infra.config import Profile, SpecdiagError
from infra.tracking import Tag, Tracker
from tasks.compare import stream_metrics
from tasks.record import ArmResult
from tasks.verdict.evidence import Verdict, differs, fmt



SERVED = "served already as the probe arm "  # the fix's arm was planned up front (infra/arms.probe_arms)


def fix_arm(cfg: Profile, v: Verdict, arms: list[Arm], measured: list[ArmResult] = ()) -> tuple[Arm | None, str]:
    """The candidate with the verdict's fix applied; or None, and what stands instead of an arm (a probe arm already
    measured that applies the fix: under --confirm the control's mapping is planned up front, a window on the
    candidate's server rather than a load after the verdict)."""
    cand = next((a for a in arms if a.role == "candidate"), None)
    ctrl = next((a for a in arms if a.role == "control"), None)
    if "confirmed_by" in v.fix:
        return None, f"confirmed by {v.fix['confirmed_by']}"
    if cand is None or cand.spec is None:
        return None, "no candidate to apply a fix to"
    if "num_speculative_tokens" in v.fix:
        k = v.fix["num_speculative_tokens"]
        return Arm(f"{cand.name}@fix-k={k}", "confirm", cand.drafter,
                   cand.spec.model_copy(update={"num_speculative_tokens": k}), "confirm"), ""
    if "probe" in v.fix:
        if (done := fixed_by(v, measured)) is not None:
            return None, SERVED + done.arm
        try:
            arm = PROBES[v.fix["probe"]](cfg, cand, ctrl)[0]
        except SpecdiagError as exc:
            return None, f"the fix cannot be served as one arm here: {exc}"
        return replace(arm, name=f"{arm.name}-fix", role="confirm", probe="confirm"), ""
    return None, f"no fix that one more arm can apply for `{v.cause}` (see Next)"


def fixed_by(v: Verdict, results: list[ArmResult]) -> ArmResult | None:
    """The arm that applied the verdict's fix: the confirm arm, else a probe arm measured up front that applies it."""
    return next((r for r in results if r.role == "confirm"), None) or next(
        (r for r in results if r.role == "probe" and r.ok and r.probe == v.fix.get("probe")), None)


def judge(v: Verdict, results: list[ArmResult]) -> tuple[str, str]:
    """(confirmed / not confirmed, the line that says why) for the arm that applied the fix against the candidate."""
    cand = next(r for r in results if r.role == "candidate")
    fixed = fixed_by(v, results)
    if not fixed.ok:
        return "not confirmed", f"the fix arm {fixed.arm} failed: {fixed.error.splitlines()[0]}"
    if v.cause == "draft_overhead":
        base = next(r for r in results if r.role == "baseline" and r.ok)
        f, c = stream_metrics(fixed, base), stream_metrics(cand, base)
        better = f.get("speedup_paired_lo", 0.0) > c.get("speedup_paired_hi", float("inf"))
        return ("confirmed" if better else "not confirmed"), (
            f"{fixed.arm}: paired speedup {f.get('speedup_paired', 0):.3f}x [{f.get('speedup_paired_lo', 0):.3f}-"
            f"{f.get('speedup_paired_hi', 0):.3f}] vs the candidate's {c.get('speedup_paired', 0):.3f}x "
            f"[{c.get('speedup_paired_lo', 0):.3f}-{c.get('speedup_paired_hi', 0):.3f}]")
    better = differs(fixed.metrics, cand.metrics)
    return ("confirmed" if better else "not confirmed"), \
        fmt(fixed.arm, fixed.metrics) + (" : clearly above the candidate's" if better else
                                         ": not clearly above the candidate's")


@task(name="confirm", cache_policy=NO_CACHE)
def confirm(tracker: Tracker, parent_run_id: str, v: Verdict, results: list[ArmResult], why: str) -> Verdict:
    """The outcome as tag specdiag.confirmed, a line of the verdict's evidence, and verdict.md again."""
    if fixed_by(v, results) is not None:
        outcome, line = judge(v, results)
        line = f"--confirm: `{outcome}`: {line}"
    else:
        outcome = "confirmed" if why.startswith("confirmed by") else "not run"
        line = f"--confirm: {why}"
    v = replace(v, evidence=v.evidence + [line])
    tracker.tag(parent_run_id, Tag.CONFIRMED, outcome)
    tracker.text(parent_run_id, v.markdown(), "verdict.md")
    return v
