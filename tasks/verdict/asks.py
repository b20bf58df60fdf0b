"""What the verdict's rules will ask of one arm's numbers, for its early stop (tasks/earlystop.py), by the arm's role
and, once measured, the arms it is compared with."""
from __future__ import annotations

from tasks.earlystop import MIN_DRAFTS, Questions, pays_bound
from tasks.record import ArmResult
from tasks.verdict.evidence import (HEALTHY, MIN_CONTROL_DRAFTS, acceptance_interval, decision_thresholds,
                                    speed_judged)
from tasks.verdict.probes import probe_flips

Compared = tuple[tuple[tuple[float, ...], float, str], ...]


def questions(role: str, offline: dict[str, float] | None = None, baseline_tok_s: tuple[float, ...] = (),
              candidate: dict[str, float] | None = None, position_limit: int = 0, k: int = 1,
              probe: str = "", compared: Compared | None = None, control: dict[str, float] | None = None) -> Questions:
    """candidate: the candidate arm's metrics, where it was measured first: a control is then settled once clear of
    the candidate's interval as well as of its thresholds (versus_control's question), over the rules' floor for a
    control, MIN_CONTROL_DRAFTS; a probe once clear of where the probes rule's comparison with it flips
    (probes.probe_flips). probe: the probe that derived the arm. position_limit: the positions its drafter declares,
    where the server serves more (static check position_limit): context_limit's question, acceptance before that
    position against past it, drafting k tokens a step. A drafter's speed is judged from HEALTHY on (draft_overhead),
    a k_sweep probe's whatever it accepts. compared: the baseline's, measured after the drafters (speed_compared).
    control: the control arm's metrics, where it was measured before the candidate (reused): the candidate is then
    settled once clear of the control's interval as well as of its thresholds, or narrow (versus_control's question:
    overlapping intervals decide only when narrow)."""
    known = candidate if candidate and candidate.get("num_drafts") else None
    ref = control if role == "candidate" and control and control.get("num_drafts") else None
    rival = acceptance_interval(known) if role == "control" and known else (acceptance_interval(ref) if ref else None)
    flips = probe_flips(probe, known) if role == "probe" else ()
    judged = speed_judged(role, probe)
    floor = MIN_CONTROL_DRAFTS if role == "control" and rival else MIN_DRAFTS
    return Questions(decision_thresholds(role, offline) + flips, floor, baseline_tok_s, judged, rival, position_limit,
                     max(1, k), HEALTHY if judged and role != "baseline" and probe != "k_sweep" else 0.0,
                     compared if role == "baseline" else None)


def speed_compared(results: list[ArmResult]) -> Compared:
    """For a baseline measured after the drafters: each measured arm whose speed the verdict may judge (speed_judged,
    on its own server, its acceptance interval reaching HEALTHY or a k_sweep probe), with its per-request tok/s and
    the bound draft_overhead tests its speedup against (the tokens a step emits: the engine's mean acceptance length,
    which counts drafts shorter than k as they were)."""
    return tuple((tuple(r.request_tok_s), pays_bound(r.metrics.get("mean_acceptance_length", 1.0)), r.arm)
                 for r in results if r.ok and r.role != "baseline" and not r.served_with and r.request_tok_s
                 and speed_judged(r.role, r.probe)
                 and (r.probe == "k_sweep" or acceptance_interval(r.metrics)[1] >= HEALTHY))
