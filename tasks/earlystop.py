"""Early stop: end an arm's measured window once its numbers are as precise as the verdict needs.

Sequential intervals, checked after every completed request: acceptance's interval as the verdict takes it (Wilson over
the drafts counted so far, from the engine's counters read mid-window, joined with the spread over requests from their
own counts: tasks.acceptance.acceptance_interval) and per-request tok/s's t-interval. Acceptance is known well enough
once its interval is narrow (`acceptance_half_width`, or `narrow` where the verdict compares the arm with another) or,
over at least the verdict's minimum of drafts, lies clear of every threshold the verdict will test this arm against
(`decisions`, from tasks/verdict.py): a drafter at 0.36 need not be pinned to +-0.05 for the verdict to call it "below
0.6 and above 0.1". The control settles only narrow: every candidate, in this diagnosis and in later ones that reuse it,
is compared with its interval, and overlapping intervals decide only when narrow. A candidate measured after a reused
control settles once clear of the control's interval (`rival`) as well as of its thresholds, or narrow. Likewise tok/s
is known well enough once narrow (`tok_s_rel_half_width`) or once the verdict's own speedup interval over the baseline
arm's requests (infra.stats.speedup_interval) lies clear of 1: the speedup's side of 1 is then settled (for a drafter
whose steps emit more than 2 tokens, clear of half of them: draft_overhead's other bound). Arms whose speed the verdict
does not judge (the control, probes: only their acceptance is compared) need not settle tok/s at all, nor a drafter
whose acceptance lies clear below healthy (the verdict judges a drafter's speed only where its acceptance is healthy:
`speed_from`). On one host the baseline is measured after the drafters (flows/diagnose.py), so that its own question is
theirs: it settles once every judged arm's speedup over it lies clear of that arm's bound (`compared`), at its first
requests where no arm's speed is judged, and at its own precision at most, once it has served every prompt those arms
did (the verdict pairs them prompt by prompt only over as many requests of each). A drafter served past the positions it
declares (static check position_limit) is also asked context_limit's question: its acceptance before that position
against past it, from each request's own counts. That is settled once both sides hold the verdict's floor of drafts and
their intervals are apart or both narrow; until then the window goes on (to the cap, where no sequence passes the
limit). A token or time budget stops the window regardless. Checking after every request makes the nominal 95% slightly
optimistic; the targets are set tighter than the verdict's margins to absorb that.
"""
from __future__ import annotations

from dataclasses import dataclass

from infra.config import BenchConfig
from infra.stats import mean_interval, speedup_interval, wilson

MIN_DRAFTS = 30  # below this, no interval is narrow enough to decide anything (the verdict's floor, tasks/verdict)


@dataclass(frozen=True)
class Questions:
    """What the verdict will ask of one arm's numbers (tasks/verdict/evidence.py:questions, by its role)."""

    decisions: tuple[float, ...] = ()  # acceptance thresholds the verdict compares this arm with
    min_drafts: int = MIN_DRAFTS  # the verdict decides nothing from fewer drafts of this arm
    baseline_tok_s: tuple[float, ...] = ()  # the baseline arm's per-request tok/s, once measured
    tok_s_judged: bool = True  # False: the verdict reads only this arm's acceptance (tasks.verdict.speed_judged)
    rival: tuple[float, float] | None = None  # the acceptance interval this arm's is compared with, if measured
    position_limit: int = 0  # the drafter's declared positions, where served past them: context_limit's question
    k: int = 1  # draft tokens per draft: drafts on either side of position_limit count as draft tokens / k
    # the acceptance from which the verdict judges this arm's speed (draft_overhead reads a drafter's speed only where
    # its acceptance is healthy): below it, settled, the arm's tok/s need not settle; 0: judged whatever it accepts
    speed_from: float = 0.0
    # the baseline's, measured after the arms whose speed is judged: each such arm's per-request tok/s, the bound its
    # speedup is tested against and its name; None where the baseline is measured before them (it then settles its
    # own tok/s, not knowing what they will need)
    compared: tuple[tuple[tuple[float, ...], float, str], ...] | None = None
    # where > 0, the width of the acceptance interval at which the arm settles (versus_control's NARROW: overlapping
    # intervals decide only narrower than that); 0: the config's acceptance_half_width
    narrow: float = 0.0

    def describe(self, speculative: bool = True) -> str:
        """What the window was measured towards, in words: the arm's run records it (tag specdiag.asked). Without
        speculation only its tok/s is asked."""
        said = [f"acceptance against {', '.join(f'{t:g}' for t in sorted(self.decisions))}"] \
            if self.decisions and speculative else []
        if self.rival and speculative:
            said.append(f"acceptance against the compared arm's [{self.rival[0]:.3f}-{self.rival[1]:.3f}]")
        if said:
            said.append(f"over at least {self.min_drafts} drafts")
        if self.narrow and speculative:
            said.append(f"{'or ' if said else ''}acceptance to an interval narrower than {self.narrow:g}")
        if self.position_limit and speculative:
            said.append(f"acceptance before position {self.position_limit} against past it")
        where = f" where its acceptance reaches {self.speed_from:g}" if self.speed_from and speculative else ""
        if not self.tok_s_judged:
            said.append("tok/s not judged")
        elif self.compared is not None:
            arms = ", ".join(f"{a} ({len(t)} requests, bound {b:.3g}x)" for t, b, a in self.compared)
            said.append(f"tok/s against {arms}" if arms else "tok/s: no arm measured before it has its speed judged")
        elif self.baseline_tok_s:
            said.append(f"tok/s against the baseline's {len(self.baseline_tok_s)} requests{where}")
        else:
            said.append(f"tok/s to its own precision{where}")
        return "; ".join(said)


@dataclass(frozen=True)
class Progress:
    """What the window has measured so far."""

    requests_ok: int
    output_tokens: int
    elapsed_s: float
    request_tok_s: list[float]
    drafts: float | None = None  # None: no speculative decoding on this arm
    accepted_rate: float = 0.0
    asks: Questions = Questions()
    # (accepted, drafted) draft tokens before and past asks.position_limit, from each request's own counts; None where
    # the question is not asked or the engine gives no per-request counts (the verdict then cannot ask it either)
    split: tuple[tuple[float, float], tuple[float, float]] | None = None
    accepted_per_draft: float = 0.0  # accepted draft tokens per draft (the engine's counters): a step emits 1 more
    # the verdict's acceptance interval so far (tasks.acceptance.acceptance_interval: Wilson over the drafts joined
    # with the spread over requests); None: Wilson over the drafts alone
    interval: tuple[float, float] | None = None

    def acceptance(self) -> tuple[float, float]:
        return self.interval or wilson(self.accepted_rate * self.drafts, self.drafts)


def should_stop(cfg: BenchConfig, p: Progress) -> str:
    """'' to go on, else why the window can end now."""
    if cfg.max_output_tokens and p.output_tokens >= cfg.max_output_tokens:
        return f"token budget {cfg.max_output_tokens} reached"
    if cfg.max_bench_s and p.elapsed_s >= cfg.max_bench_s:
        return f"time budget {cfg.max_bench_s:.0f} s reached"
    if p.requests_ok < cfg.min_requests:
        return ""
    mean, lo, hi = mean_interval(p.request_tok_s)
    tok_rel = (hi - lo) / 2 / mean if mean > 0 else float("inf")
    q = p.asks
    # the verdict's own speedup and the bound it tests it against, tokens a step emits counted as the verdict does
    speedup = speedup_interval(p.request_tok_s, list(q.baseline_tok_s or ()))
    bound = pays_bound(1 + p.accepted_per_draft) if p.drafts else 1.0
    versus = _comparisons_settled(q.compared, p.request_tok_s) if p.drafts is None and q.compared is not None else ""
    if versus:
        tok = versus
    elif _speed_moot(p):  # said first where it holds: what the verdict will read, not what happened to be precise
        tok = f"not judged (acceptance below {q.speed_from:g})"
    elif tok_rel <= cfg.tok_s_rel_half_width and not _pairs_pending(p):
        tok = f"known to +-{tok_rel:.0%}"
    elif speedup and not speedup[1] <= bound <= speedup[2]:
        tok = f"{speedup[0]:.3f}x the baseline [{speedup[1]:.3f}-{speedup[2]:.3f}], clear of {bound:.3g}x"
    elif q.tok_s_judged or p.drafts is None:
        return ""
    else:
        tok = ""
    if p.drafts is None:
        return f"tok/s {tok} after {p.requests_ok} requests"
    settled = _acceptance_settled(cfg, p, tok)
    by_position = _by_position(cfg, p) if settled else None
    return "" if by_position is None else settled + by_position


def pays_bound(tokens_per_step: float) -> float:
    """The speedup draft_overhead (tasks/verdict/rules.py) tests a drafter's against: 1, or half the tokens a step
    emits where that is more (the drafter then costs about as much as it saves)."""
    return max(1.0, tokens_per_step / 2)


def _comparisons_settled(compared, tok_s: list[float]) -> str:
    """The baseline measured after the arms whose speed is judged: '' while any one's speedup over it (the verdict's
    own interval) holds that arm's bound, or before the baseline has served every prompt that arm did (until then the
    two cover different prompts, and the prompts' own spread would pass for the arms'), else how they settled."""
    said = []
    for arm_tok_s, bound, arm in compared:
        s = speedup_interval(arm_tok_s, tok_s)
        if len(tok_s) < len(arm_tok_s) or s is None or s[1] <= bound <= s[2]:
            return ""
        said.append(f"{arm}: {s[0]:.3f}x [{s[1]:.3f}-{s[2]:.3f}], clear of {bound:.3g}x")
    return f"against {'; '.join(said)}" if said else "not compared (no arm measured before it has its speed judged)"


def _pairs_pending(p: Progress) -> bool:
    """A baseline that has not yet served every prompt of an arm it is compared with: its own precision does not end
    it before then, as the verdict pairs the two prompt by prompt only over as many requests of each."""
    compared = p.asks.compared
    return p.drafts is None and bool(compared) and len(p.request_tok_s) < max(len(t) for t, _, _ in compared)


def _speed_moot(p: Progress) -> bool:
    """The arm's acceptance lies clear below where the verdict starts judging its speed (Questions.speed_from), over
    the verdict's floor of drafts: its tok/s need not settle."""
    q = p.asks
    return bool(q.speed_from and p.drafts and p.drafts >= q.min_drafts and p.acceptance()[1] < q.speed_from)


def _acceptance_settled(cfg: BenchConfig, p: Progress, tok: str) -> str:
    """Why the arm's acceptance is known well enough for the verdict, or ''."""
    q = p.asks
    a_lo, a_hi = p.acceptance()
    tail = f"over {p.drafts:.0f} drafts{f' and tok/s {tok}' if tok else ''} after {p.requests_ok} requests"
    if (a_hi - a_lo < q.narrow) if q.narrow else (a_hi - a_lo) / 2 <= cfg.acceptance_half_width:
        return f"acceptance known to +-{(a_hi - a_lo) / 2:.3f} ([{a_lo:.3f}-{a_hi:.3f}]) {tail}"
    clear = not any(a_lo <= t <= a_hi for t in q.decisions) and \
        (q.rival is None or a_lo > q.rival[1] or a_hi < q.rival[0])
    if (q.decisions or q.rival) and p.drafts >= q.min_drafts and clear:
        rival = f" and of [{q.rival[0]:.3f}-{q.rival[1]:.3f}] (the arm it is compared with)" if q.rival else ""
        return (f"acceptance [{a_lo:.3f}-{a_hi:.3f}] clear of the verdict's thresholds "
                f"{', '.join(f'{t:g}' for t in sorted(q.decisions))}{rival} {tail}")
    return ""


def _by_position(cfg: BenchConfig, p: Progress) -> str | None:
    """context_limit's question (tasks/verdict/rules.py): '' where not asked, None while open, else how it settled."""
    q = p.asks
    if not q.position_limit or p.split is None:
        return ""
    if min(d for _, d in p.split) < MIN_DRAFTS * q.k:  # the rule's own floor on either side
        return None
    (w_lo, w_hi), (b_lo, b_hi) = sides = [wilson(a / q.k, d / q.k) for a, d in p.split]
    if b_hi < w_lo or b_lo > w_hi:
        how = "apart"
    elif all((hi - lo) / 2 <= cfg.acceptance_half_width for lo, hi in sides):
        how = f"both known to +-{cfg.acceptance_half_width:g}"
    else:
        return None
    return f"; before position {q.position_limit} [{w_lo:.3f}-{w_hi:.3f}], past it [{b_lo:.3f}-{b_hi:.3f}]: {how}"
