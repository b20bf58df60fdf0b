"""What the verdict's rules will ask of one arm's numbers, for its early stop (tasks/earlystop.py), by the arm's role
and, once measured, the arms it is compared with."""
from __future__ import annotations

from tasks.earlystop import MIN_DRAFTS, Questions, pays_bound
from tasks.record import ArmResult
from tasks.verdict.evidence import CONTROL_GOOD, HEALTHY, NARROW, acceptance_interval, decision_thresholds, speed_judged
from tasks.verdict.probes import probe_flips

Compared = tuple[tuple[tuple[float, ...], float, str], ...]


def questions(role: str, offline: dict[str, float] | None = None, baseline_tok_s: tuple[float, ...] = (),
              candidate: dict[str, float] | None = None, position_limit: int = 0, k: int = 1,
              probe: str = "", compared: Compared | None = None, control: dict[str, float] | None = None) -> Questions:
    """What the verdict's rules will ask of this arm's acceptance and tok/s, for its early stop.

    A control settles only once its interval is narrower than NARROW, whatever it is clear of: versus_control compares
    every candidate with it, in this diagnosis and in each later one that reuses it, and overlapping intervals decide
    only when narrow. Measuring it narrow costs a few more prompts on a server already loaded; a control too wide to
    compare with costs a later diagnosis its reload. control: the control arm's metrics, where it was measured before
    the candidate (reused): the candidate then settles once clear of the control's interval as well as of its
    thresholds, or narrow. candidate: the candidate arm's metrics, where measured first: a probe settles once clear of
    where the probes rule's comparison with it flips (probes.probe_flips). probe: the probe that derived the arm.
    position_limit: the positions its drafter declares, where the server serves more (static check position_limit):
    context_limit's question, acceptance before that position against past it, drafting k tokens a step. A drafter's
    speed is judged where its acceptance may be called healthy (speed_floor), a k_sweep probe's whatever it accepts.
    compared: the baseline's, measured after the drafters (speed_compared)."""
    known = candidate if candidate and candidate.get("num_drafts") else None
    ref = control if role == "candidate" and control and control.get("num_drafts") else None
    flips = probe_flips(probe, known) if role == "probe" else ()
    judged = speed_judged(role, probe)
    thresholds = () if role == "control" else decision_thresholds(role, offline) + flips
    speed_from = speed_floor(ref) if judged and role != "baseline" and probe != "k_sweep" else 0.0
    return Questions(thresholds, MIN_DRAFTS, baseline_tok_s, judged, acceptance_interval(ref) if ref else None,
                     position_limit, max(1, k), speed_from, compared if role == "baseline" else None,
                     NARROW if role == "control" or ref else 0.0)


def speed_floor(control: dict[str, float] | None) -> float:
    """The acceptance from which the verdict may call a drafter healthy, and draft_overhead then judges its speed:
    HEALTHY, or, against a control measured already and not low (low_control decides before), where its interval
    starts (versus_control: at or above a good control with narrow intervals)."""
    lo, hi = acceptance_interval(control) if control and control.get("num_drafts") else (HEALTHY, 0.0)
    return HEALTHY if hi < CONTROL_GOOD else min(HEALTHY, lo)


def speed_compared(results: list[ArmResult]) -> Compared:
    """For a baseline measured after the drafters: each measured arm whose speed the verdict may judge (speed_judged,
    on its own server, its acceptance interval reaching speed_floor or a k_sweep probe), with its per-request tok/s
    and the bound draft_overhead tests its speedup against (the tokens a step emits: the engine's mean acceptance
    length, which counts drafts shorter than k as they were)."""
    floor = speed_floor(next((r.metrics for r in results if r.role == "control" and r.ok), None))
    return tuple((tuple(r.request_tok_s), pays_bound(r.metrics.get("mean_acceptance_length", 1.0)), r.arm)
                 for r in results if r.ok and r.role != "baseline" and not r.served_with and r.request_tok_s
                 and speed_judged(r.role, r.probe)
                 and (r.probe == "k_sweep" or acceptance_interval(r.metrics)[1] >= floor))
