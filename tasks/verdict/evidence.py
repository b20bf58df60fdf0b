"""What the verdict's rules reason with: their thresholds, the Verdict, and the intervals and lines of evidence.

Acceptance is a proportion; its Wilson interval uses the number of drafts as n (the tokens within one
draft are correlated, so counting draft tokens would overstate the precision). Drafts within one request are
correlated too (one prompt, one context): where the engine reports each request's own counts and enough requests
ran, the interval is also taken over requests (tasks/acceptance.py), and the wider of the two is used.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

from infra.stats import wilson
from tasks.acceptance import acceptance_interval, over_requests
from tasks.earlystop import MIN_DRAFTS

VOCAB_CODES = {"d2t_missing", "d2t_shape", "d2t_range", "d2t_duplicates", "d2t_scrambled", "d2t_partial",
               "embedding_mismatch", "tokenizer"}
# A good control accepts whole drafts, so it makes few of them; its interval still narrows fast
# (all 26 accepted -> [0.87, 1]). The floor only guards against a handful of drafts.
MIN_CONTROL_DRAFTS = 10
NEAR_ZERO = 0.10  # acceptance whose whole interval lies below this means the drafts are essentially never right
CONTROL_GOOD = 0.30  # a known-good control whose interval lies above this shows the engine path works
HEALTHY = 0.60  # a drafter whose whole interval lies above this is doing its job, control or not
NARROW = 0.15  # intervals narrower than this that overlap mean "as good as the control"
# Served acceptance whose upper bound is below this fraction of the offline lower bound (same checkpoint, same
# prompts, reference forward): the engine does not run the drafter the way it was trained.
INTEGRATION_RATIO = 0.5


def decision_thresholds(role: str, offline: dict[str, float] | None = None) -> tuple[float, ...]:
    """The acceptance values the rules below compare an arm of this role with: the candidate and probes against
    NEAR_ZERO, HEALTHY and (offline known) the integration bound, for their early stop; the control against
    CONTROL_GOOD and HEALTHY (its early stop settles it narrow instead: tasks/verdict/asks.questions). Comparisons
    between arms (probe vs candidate) are not known while one arm runs; MIN_DRAFTS and the fixed half-width cover
    them."""
    if role == "control":
        return CONTROL_GOOD, HEALTHY
    out = (NEAR_ZERO, HEALTHY)
    off = offline_interval(offline or {})
    return out + ((round(INTEGRATION_RATIO * off[0], 4),) if off and off[0] >= NEAR_ZERO else ())


def speed_judged(role: str, probe: str = "") -> bool:
    """Whether the verdict reads this arm's tok/s (the speedup over the baseline), not only its acceptance: a k_sweep
    probe's too, since the verdict recommends the k whose measured speedup is best."""
    return role not in ("control", "probe") or probe == "k_sweep"


# Every cause a verdict can name. Adding one: a rule in rules.py (or a probe's row in probes.PROBE_CAUSES), its tests,
# and a row of the README's verdict table; tests/unit/test_verdict.py checks all three for each name here.
Cause = Literal["checkpoint_mismatch", "spec_disabled", "inconclusive", "vocab_mismatch", "aux_layers", "integration",
                "template_mismatch", "sampling_mismatch", "context_limit", "healthy", "training_quality",
                "draft_overhead"]
CAUSES: tuple[str, ...] = get_args(Cause)


@dataclass
class Verdict:
    cause: Cause

    def __post_init__(self):
        if self.cause not in CAUSES:
            raise ValueError(f"no such cause {self.cause!r}: one of {', '.join(CAUSES)}")
    evidence: list[str] = field(default_factory=list)
    next_step: str = ""
    # The fix the cause implies, for --confirm: {"num_speculative_tokens": k}, {"probe": NAME} (the probe arm that
    # applies it), or {"confirmed_by": WHAT} when the evidence already is the intervention (offline, a probe arm).
    fix: dict = field(default_factory=dict)

    def markdown(self) -> str:
        lines = [f"# Verdict: `{self.cause}`", "", "Evidence:", *[f"- {e}" for e in self.evidence]]
        return "\n".join(lines + ([f"\nNext: {self.next_step}"] if self.next_step else []))


def offline_interval(m: dict[str, float]) -> tuple[float, float] | None:
    """The offline acceptance's interval, n = slots / mean length (about the drafts serving would make)."""
    if "offline_acceptance_rate" not in m:
        return None
    n = m.get("offline_num_slots", 0.0) / max(1.0, m.get("offline_mean_acceptance_length", 1.0))
    return wilson(m["offline_acceptance_rate"] * n, n)


def fmt_offline(name: str, m: dict[str, float]) -> str:
    lo, hi = offline_interval(m)
    return (f"{name}: offline acceptance {m['offline_acceptance_rate']:.3f} [95% CI {lo:.3f}-{hi:.3f}] over "
            f"{m.get('offline_num_slots', 0):.0f} draft slots (reference forward, no engine)")


def fmt(name: str, m: dict[str, float]) -> str:
    lo, hi = acceptance_interval(m)
    requests = f" / {m['spec_requests']:.0f} requests" if over_requests(m) else ""
    return (f"{name}: acceptance {m.get('acceptance_rate', 0):.3f} [95% CI {lo:.3f}-{hi:.3f}] over "
            f"{m.get('num_drafts', 0):.0f} drafts / {m.get('num_draft_tokens', 0):.0f} draft tokens{requests}")


def probe_line(p) -> str:
    """A probe arm's acceptance, named as the probe that derived it."""
    return fmt(p.arm, p.metrics) + f" (probe {p.probe})"


PROBE_RATIO = 1.5  # a probe arm decides only when its acceptance differs from the candidate's by this factor


def differs(a: dict[str, float], b: dict[str, float]) -> bool:
    """a's acceptance is clearly above b's: separated intervals and a large ratio, not noise."""
    (a_lo, _), (_, b_hi) = acceptance_interval(a), acceptance_interval(b)
    return a.get("num_drafts", 0) >= MIN_DRAFTS and a_lo > b_hi and \
        a.get("acceptance_rate", 0) >= PROBE_RATIO * b.get("acceptance_rate", 0)
