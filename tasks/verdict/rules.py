"""The verdict's rules: one small rule per cause, tried in the order of RULES; the first that decides names it.

A rule reads the Case (candidate, control, static findings, offline evaluation) and returns a Verdict, or None after
adding the evidence lines it checked, so that the verdict a later rule gives still shows them. The order is the
precedence: a failed arm before any measurement, too little data before any cause, a change that restores
acceptance (offline intervention, probe) before a correlation, the candidate's own evidence before the control's.
`draft_overhead` is read last, from the speed model, over an acceptance found healthy. Adding a cause is adding a
rule here and a row to the README's verdict table.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from infra.stats import wilson
from tasks.acceptance import split_at
from tasks.earlystop import pays_bound
from tasks.inspect import Finding, position_limit
from tasks.offline import OfflineResult
from tasks.record import ArmResult
from tasks.speedup import k_sweep, speed_models
from tasks.verdict.evidence import (CONTROL_GOOD, HEALTHY, INTEGRATION_RATIO, MIN_CONTROL_DRAFTS, MIN_DRAFTS,
                                    NARROW, NEAR_ZERO, PROBE_RATIO, VOCAB_CODES, Verdict, acceptance_interval,
                                    decision_thresholds, fmt, fmt_offline, offline_interval, probe_line)
from tasks.verdict.probes import read_probes
from tasks.verdict.settle import next_step, pairs_needed, settle, width


@dataclass
class Case:
    """What the rules read: the arms, the static findings per arm, the offline evaluation; the evidence so far."""
    results: list[ArmResult]
    findings: dict[str, list[Finding]]
    offline: OfflineResult
    evidence: list[str] = field(default_factory=list)

    def __post_init__(self):
        self.cand = next((r for r in self.results if r.role == "candidate"), None)
        self.ctrl = next((r for r in self.results if r.role == "control"), None)

    @property
    def m(self) -> dict[str, float]:
        return self.cand.metrics

    @property
    def vocab_errors(self) -> list[Finding]:
        return [f for f in self.findings.get(self.cand.arm, []) if f.severity == "error" and f.code in VOCAB_CODES]

    @property
    def interval(self) -> tuple[float, float]:
        return acceptance_interval(self.m)

    @property
    def off(self) -> tuple[float, float] | None:
        return offline_interval(self.m)


def no_candidate(c: Case) -> Verdict | None:
    if c.cand is None:
        return Verdict("inconclusive", ["no candidate arm ran"], "pass --drafter")


def stopped_before_load(c: Case) -> Verdict | None:
    """The static checks refused the checkpoint: a mapping fault is vocab_mismatch, any other checkpoint_mismatch."""
    if not c.cand.ok and c.cand.error.startswith("StaticCheckFailed"):
        gating = [f for f in c.findings.get(c.cand.arm, []) if f.gating]
        cause = "vocab_mismatch" if gating and all(f.code in VOCAB_CODES for f in gating) else "checkpoint_mismatch"
        return Verdict(cause, [f"static check: {f.line()}" for f in gating] + [
            f"{c.cand.arm} was stopped before its server load: the engine would refuse this checkpoint or serve "
            f"drafts it cannot map"], "fix the checkpoint as the findings say (or --force to measure it anyway)")


def spec_disabled(c: Case) -> Verdict | None:
    """The engine served without drafting: no spec-decode counters, or tokens generated and no draft proposed."""
    if not c.cand.ok and "SpecDecodingOff" in c.cand.error:
        return Verdict("spec_disabled", [c.cand.error.splitlines()[0]],
                       "check that the speculative config reaches the engine (server_cmd, server log)")
    if c.cand.ok and c.m.get("num_drafts", 0) == 0 and c.m.get("output_tokens", 0) > 0:
        return Verdict("spec_disabled", [f"{c.cand.arm}: {c.m.get('output_tokens', 0):.0f} tokens generated, "
                                         f"0 drafts proposed"],
                       "the drafter never proposed: check the speculative config")


def candidate_failed(c: Case) -> Verdict | None:
    if not c.cand.ok:
        return Verdict("inconclusive", [f"candidate arm failed: {c.cand.error.splitlines()[0]}"] +
                       [f"static check: {f.line()}" for f in c.vocab_errors], "fix the failure and rerun")


def thin_evidence(c: Case) -> Verdict | None:
    """Too few drafts decide nothing, unless even their wide interval lies above HEALTHY. Otherwise the measured
    acceptance and the static mapping faults lead the evidence."""
    n, (lo, _) = c.m.get("num_drafts", 0), c.interval
    c.evidence.append(fmt(c.cand.arm, c.m))
    if MIN_CONTROL_DRAFTS <= n < MIN_DRAFTS and lo >= HEALTHY:
        return Verdict("healthy", c.evidence + [f"the whole interval lies above {HEALTHY}, even over few drafts"])
    if n < MIN_DRAFTS:
        line, prompts = settle(c.cand.arm, c.m, decision_thresholds("candidate", c.m), at_least=MIN_DRAFTS)
        return Verdict("inconclusive", c.evidence + [f"fewer than {MIN_DRAFTS} drafts: the interval is too wide",
                                                     line], next_step([prompts]))
    c.evidence += [f"static check: {f.line()}" for f in c.vocab_errors]


def _offline_variant(cand: ArmResult, offline: OfflineResult, kind: str) -> tuple[float, str, dict, dict] | None:
    """The best offline variant of the candidate that changes `kind` (aux / d2t) and accepts far more than the head
    as the engine runs it: separated intervals, PROBE_RATIO, enough slots."""
    m, found = cand.metrics, []
    _, fed_hi = offline_interval(m)
    for name, change in offline.variants.get(cand.arm, {}).items():
        v = {k.removesuffix(f"_aux_{name}"): val for k, val in m.items() if k.endswith(f"_aux_{name}")}
        if kind in change and v.get("offline_num_slots", 0) >= MIN_DRAFTS and offline_interval(v)[0] > fed_hi and \
                v["offline_acceptance_rate"] >= PROBE_RATIO * m["offline_acceptance_rate"]:
            found.append((v["offline_acceptance_rate"], name, change, v))
    return max(found, key=lambda f: f[0]) if found else None


# One thing changed offline, in the order tried: (what the variant changes, the cause it names, the evidence, the
# next step). {aux} / {name}: the variant's layer ids and name.
INTERVENTIONS = [
    ("d2t", "vocab_mismatch", "with the control's d2t instead of its own: its vocabulary mapping is wrong (confirmed "
     "by the intervention, offline)", "regenerate the candidate's d2t/t2d from the data it was trained on, or reuse "
     "the control's"),
    ("aux", "aux_layers", "when fed target layers {aux} ({name}) instead of the ones the engine feeds it: the head "
     "was trained on other layers than it is served", "set eagle_aux_hidden_state_layer_ids to {aux} in the head's "
     "config.json (the layers it was trained on)"),
]


def offline_intervention(c: Case) -> Verdict | None:
    """One thing changed offline (the mapping, the layers fed) makes the head accept far more: that thing is the
    cause, confirmed by the intervention without a server, static findings or not."""
    if not c.off:
        return None
    cand, evidence = c.cand, c.evidence
    evidence.append(fmt_offline(cand.arm, c.m))
    for kind, cause, why, fix in INTERVENTIONS:
        found = _offline_variant(cand, c.offline, kind)
        if found:
            rate, name, change, v = found
            lo, hi = offline_interval(v)
            fill = {"aux": change.get("aux"), "name": name}
            return Verdict(cause, evidence + [f"{cand.arm}: offline acceptance {rate:.3f} [95% CI {lo:.3f}-{hi:.3f}] "
                                              f"{why.format(**fill)}"], fix.format(**fill),
                           {"confirmed_by": "the offline evaluation"})
    return None


def low_control(c: Case) -> Verdict | None:
    """A low control names the engine only when it is low against what it should reach: its own offline acceptance
    on the same prompts, or the profile's expected_acceptance. As good as it ever was, it is a weak control."""
    m, evidence, (_, c_hi) = c.ctrl.metrics, c.evidence, acceptance_interval(c.ctrl.metrics)
    if c_hi >= CONTROL_GOOD:
        return None
    off = offline_interval(m)
    expected = (off[0], f"its own offline acceptance (lower {off[0]:.3f})") if off else \
        (m["expected_acceptance"], f"its expected_acceptance {m['expected_acceptance']:.2f} (profile)") \
        if "expected_acceptance" in m else None
    if expected and c_hi < INTEGRATION_RATIO * expected[0]:
        return Verdict("integration", evidence + [
            f"the control is low against {expected[1]}: served upper {c_hi:.3f} is under half of it; the engine path "
            f"(hidden states, patches, flags) is at fault, not this drafter"],
            "compare with the control on a known-good engine build; check aux layer ids")
    why = f"as good as {expected[1]}: a weak control, not a broken engine" if expected else \
        "nothing says what it should reach (no offline numbers, no expected_acceptance in the profile)"
    return Verdict("inconclusive", evidence + [f"the control is low too (upper {c_hi:.3f}), but {why}"],
                   "use a stronger control, or declare the control's expected_acceptance (e.g. from its model card), "
                   "or let the offline evaluation run for it")


PAYING_SPEEDUP = 1.1  # a k recommended for draft_overhead must be predicted to gain at least this much


def draft_overhead(v: Verdict, results: list[ArmResult]) -> Verdict:
    """Acceptance called healthy, but the drafter costs more than it saves: the speedup's whole interval lies below 1,
    or below half of what the acceptance buys (the tokens each step emits, were drafting free). The second clause does
    not hang on the host: the target drafting for itself costs about one baseline step per draft token anywhere, and
    lands near 1x, a little above on one CPU and a little below on another."""
    cand = next((r for r in results if r.role == "candidate" and r.ok), None)
    sm = speed_models(results).get(cand.arm) if cand else None
    if v.cause != "healthy" or not sm or not sm.measured:
        return v
    bound = pays_bound(sm.tokens_per_step)
    if sm.measured[2] >= bound:
        return v if sm.measured[1] >= bound else _pays_open(v, cand, results, sm, bound)
    below = "below 1" if sm.measured[2] < 1.0 else f"under half of the {sm.tokens_per_step:.3f} tokens a step emits"
    _, best_measured = k_sweep(results)
    fix = {}
    if best_measured is not None and best_measured != sm.k:
        pays, fix = f"serve it with k={best_measured} (the best measured in the k_sweep)", \
            {"confirmed_by": f"the k_sweep arm at k={best_measured}"}
    elif sm.best_k and sm.best_k != sm.k and sm.predicted[sm.best_k] >= PAYING_SPEEDUP:
        pays = f"serve it with k={sm.best_k} (predicted {sm.predicted[sm.best_k]:.3f}x)"
        fix = {"num_speculative_tokens": sm.best_k}
    elif sm.best_k == sm.k and sm.predicted[sm.k] >= PAYING_SPEEDUP:
        pays = f"k={sm.k} as served is already the best k (predicted {sm.predicted[sm.k]:.3f}x); what holds it back " \
               f"is the drafter's cost ({sm.draft_cost:.3f} baseline steps per draft token): a cheaper drafter (an " \
               "EAGLE-3 head, ngram) gains more"
    else:
        pays = f"no k pays off with this drafter on this host and load (none predicted {PAYING_SPEEDUP}x or more): " \
               "use a cheaper drafter (an EAGLE-3 head, ngram) or none"
    return Verdict("draft_overhead", v.evidence + [sm.line(), f"acceptance is fine, but the measured speedup is "
                   f"{sm.measured[2]:.3f}x at best, {below}: each step costs {sm.step_cost:.3f} baseline steps for "
                   f"{sm.tokens_per_step:.3f} tokens"], pays, fix)


def _pays_open(v: Verdict, cand: ArmResult, results: list[ArmResult], sm, bound: float) -> Verdict:
    """Healthy acceptance, and draft_overhead's question still open: the measured speedup's interval holds its bound.
    The verdict stays `healthy` (acceptance is what it names) and says what would settle whether the drafter pays."""
    base = next(r for r in results if r.role == "baseline" and r.ok)
    n, n_base = len(cand.request_tok_s), len(base.request_tok_s)
    over = f"{n} prompts" if n == n_base else f"{n} requests against the baseline's {n_base}"
    mean, lo, hi = sm.measured
    line = f"whether {cand.arm} pays is open: its measured speedup {mean:.3f}x [{lo:.3f}-{hi:.3f}] over {over} " \
           f"holds {bound:.3g}, under which its drafting would cost more than it saves"
    need = pairs_needed(cand.request_tok_s, base.request_tok_s, bound)
    if need is None:
        return Verdict(v.cause, v.evidence + [line + ": it sits on that bound, and no number of prompts settles it"],
                       v.next_step, v.fix)
    return Verdict(v.cause, v.evidence + [f"{line}; settling it takes about {need} prompts in both arms"],
                   v.next_step or f"to settle the speedup, rerun with --fixed --fresh --prompts {need}", v.fix)


def probes(c: Case) -> Verdict | None:
    """One probe arm changed one thing; a large, significant change names the cause. A probe that changes nothing
    clear stays in the evidence: that thing was checked (or, undecided, said to be open). Where several probes change
    acceptance, the first in the plan names the cause and each other one is stated beside it, with its own cause and
    fix: both hold."""
    fired, quiet = read_probes(c.results, c.m)
    if not fired:
        c.evidence += quiet
        return None
    (p, cause, why, fix), *more = fired
    also = [f"{probe_line(q)}: far from the candidate too, `{q_cause}` as well: {q_why}"
            for q, q_cause, q_why, _ in more]
    fixes = "".join(f"; and for `{q_cause}` ({q.arm}): {q_fix}" for q, q_cause, _, q_fix in more)
    return Verdict(cause, c.evidence + [probe_line(p), why, *also, *quiet], fix + fixes,
                   {"confirmed_by": f"the probe arm {p.arm}"})


def context_limit(c: Case) -> Verdict | None:
    """A drafter that declares fewer positions than are served, and accepts far less beyond its limit than before it
    in the same arm: context_limit. Served only beyond it, nothing to compare with: inconclusive, unless acceptance
    is healthy there anyway. Served only within it: an evidence line, and the other rules decide."""
    cand, findings, evidence = c.cand, c.findings.get(c.cand.arm, []), c.evidence
    limit = position_limit(findings)
    if not limit:
        return None
    k, m = max(1, cand.k), cand.metrics
    (wa, wd), (ba, bd) = split_at(m, limit)
    static = f"static check: {next(f for f in findings if f.code == 'position_limit').line()}"
    if bd < MIN_DRAFTS * k:
        evidence.append(f"{cand.arm}: {bd:.0f} draft tokens beyond position {limit}: the served sequences stayed "
                        f"within its declared range" if "seqpos_0_drafted" in m else
                        f"{cand.arm}: no acceptance by position (the engine gave no per-request counts)")
        return None
    (b_lo, b_hi) = wilson(ba / k, bd / k)
    beyond = f"beyond position {limit}: {ba:.0f} of {bd:.0f} draft tokens accepted"
    if wd < MIN_DRAFTS * k:
        if b_lo >= HEALTHY:
            return None
        return Verdict("inconclusive", evidence + [static, f"{cand.arm}: {beyond}, and no drafts before it to compare "
                       f"with"], f"serve prompts shorter than {limit} tokens as well (e.g. --prompt-set chat): "
                       f"acceptance before and after the limit decides it")
    (w_lo, _), within = wilson(wa / k, wd / k), f"before it: {wa:.0f} of {wd:.0f}"
    line = f"{cand.arm}: {beyond} ({ba / bd:.3f}, upper {b_hi:.3f}); {within} ({wa / wd:.3f}, lower {w_lo:.3f})"
    if b_hi < w_lo and ba / bd * PROBE_RATIO <= wa / wd:
        return Verdict("context_limit", evidence + [static, line, "the same arm accepts far less past the drafter's "
                       "declared position range: its context is too short for the served sequences"],
                       f"use a drafter trained on sequences as long as those served (SpecForge/speculators max "
                       f"length), or serve no longer than {limit} tokens (--max-model-len)")
    evidence.append(line)
    return None




def vocab_near_zero(c: Case) -> Verdict | None:
    if c.interval[1] < NEAR_ZERO and c.vocab_errors:
        return Verdict("vocab_mismatch", c.evidence + [
            "near-zero acceptance together with a vocabulary-mapping fault found in the checkpoint"],
            "regenerate or restore the drafter's vocabulary mapping (d2t/t2d, embedding rows)",
            {"probe": "control_mapping"})


def integration_offline(c: Case) -> Verdict | None:
    """Served far below what the same checkpoint reaches offline on the same prompts: the engine runs it otherwise."""
    off, hi = c.off, c.interval[1]
    if off and off[0] >= NEAR_ZERO and hi < INTEGRATION_RATIO * off[0]:
        return Verdict("integration", c.evidence + [
            f"served acceptance (upper {hi:.3f}) is far below what the same checkpoint reaches offline on the "
            f"same prompts (lower {off[0]:.3f}): the engine feeds or wires the drafter differently from how it "
            f"was trained"], "check the aux hidden-state layers the engine captures (server log: 'auxiliary "
            "layers'), engine patches and the drafter's norm flags against the engine version")


def healthy(c: Case) -> Verdict | None:
    if c.interval[0] >= HEALTHY:
        return Verdict("healthy", c.evidence + [f"the whole interval lies above {HEALTHY}"])


def training_quality_offline(c: Case) -> Verdict | None:
    off, hi = c.off, c.interval[1]
    if off and off[1] < CONTROL_GOOD and hi >= off[0]:
        return Verdict("training_quality", c.evidence + [
            "served acceptance matches the drafter's own offline acceptance, and both are low: the engine runs it "
            "as trained; the drafter itself predicts poorly"], "train longer or on data closer to the served prompts")


def control_usable(c: Case) -> Verdict | None:
    """From here on the control decides: without a usable one, nothing does."""
    ctrl = c.ctrl
    if ctrl is None or not ctrl.ok or ctrl.metrics.get("num_drafts", 0) < MIN_CONTROL_DRAFTS:
        why = "no control arm" if ctrl is None else (f"control failed: {ctrl.error.splitlines()[0]}" if not ctrl.ok
                                                     else "control has too few drafts")
        if ctrl is not None and ctrl.ok:
            line, prompts = settle(ctrl.arm, ctrl.metrics, decision_thresholds("control"),
                                   at_least=MIN_CONTROL_DRAFTS)
            return Verdict("inconclusive", c.evidence + [why, line], next_step([prompts]))
        return Verdict("inconclusive", c.evidence + [why], "add a known-good control drafter (--control) and rerun")
    c.evidence.append(fmt(ctrl.arm, ctrl.metrics) + " (control)")


def versus_control(c: Case) -> Verdict | None:
    """At or above a good control: healthy; overlapping wide intervals decide nothing."""
    (lo, hi), (c_lo, c_hi) = c.interval, acceptance_interval(c.ctrl.metrics)
    if lo > c_hi:
        return Verdict("healthy", c.evidence + ["candidate acceptance is above the control's"])
    if hi >= c_lo:
        if max(hi - lo, c_hi - c_lo) < NARROW:
            return Verdict("healthy", c.evidence + ["candidate acceptance matches the control's"])
        wide = [settle(r.arm, r.metrics, half_width=NARROW / 2) for r in (c.cand, c.ctrl) if width(r.metrics) >= NARROW]
        return Verdict("inconclusive", c.evidence + ["candidate and control intervals overlap and are wide"] +
                       [line for line, _ in wide], next_step([p for _, p in wide]))


def vocab_below_control(c: Case) -> Verdict | None:
    if c.vocab_errors:
        return Verdict("vocab_mismatch", c.evidence + ["candidate below control, with a vocabulary-mapping fault"],
                       "restore the drafter's vocabulary mapping", {"probe": "control_mapping"})


def other_engine_path(c: Case) -> Verdict | None:
    """A control served through another engine path (a draft model for an EAGLE-3 head) shows that path works, not
    the one the candidate takes: without the offline reference, training and integration look alike."""
    cand, ctrl, offline = c.cand, c.ctrl, c.offline
    if cand.method != ctrl.method and not c.off:
        return Verdict("inconclusive", c.evidence + [
            offline.line() or f"no offline evaluation of {cand.arm}",
            f"the control is a {ctrl.method or 'different'} drafter, the candidate {cand.method}: the control does "
            f"not exercise the candidate's engine path, so a low candidate may be its training or the engine's "
            f"integration"], ("supply your training pipeline's hidden-state dumps (--hidden-states DIR)"
                              if offline.status == "skipped" else
                              "make the offline evaluation run (offline_eval_error.txt on the parent run says why)")
            + f" or add a known-good {cand.method} control (--control)")


def training_quality(c: Case) -> Verdict:
    (_, hi), (c_lo, _) = c.interval, acceptance_interval(c.ctrl.metrics)
    return Verdict("training_quality", c.evidence + [
        f"candidate significantly below the control (upper {hi:.3f} < control lower {c_lo:.3f}) with no static "
        f"fault: the drafter itself predicts worse"], "train longer or on data closer to the served prompts")


# The precedence, first to last; the last always decides.
RULES: list[Callable[[Case], Verdict | None]] = [
    no_candidate, stopped_before_load, spec_disabled, candidate_failed, thin_evidence,
    offline_intervention, vocab_near_zero, integration_offline, probes, context_limit, healthy,
    training_quality_offline, control_usable, low_control, versus_control, vocab_below_control, other_engine_path,
    training_quality,
]


def decide(results: list[ArmResult], findings: dict[str, list[Finding]],
           offline: OfflineResult | None = None) -> Verdict:
    case = Case(results, findings, offline or OfflineResult())
    v = draft_overhead(next(v for rule in RULES if (v := rule(case)) is not None), results)
    if offline and offline.line() and offline.line() not in v.evidence:
        v.evidence.append(offline.line())
    return v
