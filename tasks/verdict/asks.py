"""What the verdict's rules will ask of one arm's numbers, for its early stop (tasks/earlystop.py), by the arm's role
and, once measured, the candidate's window it is compared with."""
from __future__ import annotations

from tasks.earlystop import MIN_DRAFTS, Questions
from tasks.verdict.evidence import MIN_CONTROL_DRAFTS, acceptance_interval, decision_thresholds, speed_judged
from tasks.verdict.probes import probe_flips


def questions(role: str, offline: dict[str, float] | None = None, baseline_tok_s: tuple[float, ...] = (),
              candidate: dict[str, float] | None = None, position_limit: int = 0, k: int = 1,
              probe: str = "") -> Questions:
    """candidate: the candidate arm's metrics, where it was measured first: a control is then settled once clear of
    the candidate's interval as well as of its thresholds (versus_control's question), over the rules' floor for a
    control, MIN_CONTROL_DRAFTS; a probe once clear of where the probes rule's comparison with it flips
    (probes.probe_flips). probe: the probe that derived the arm. position_limit: the positions its drafter declares,
    where the server serves more (static check position_limit): context_limit's question, acceptance before that
    position against past it, drafting k tokens a step."""
    known = candidate if candidate and candidate.get("num_drafts") else None
    rival = acceptance_interval(known) if role == "control" and known else None
    flips = probe_flips(probe, known) if role == "probe" else ()
    return Questions(decision_thresholds(role, offline) + flips, MIN_CONTROL_DRAFTS if rival else MIN_DRAFTS,
                     baseline_tok_s, speed_judged(role, probe), rival, position_limit, max(1, k))
