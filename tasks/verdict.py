"""Name the cause: explicit rules over the measured evidence, never claiming more than it supports.

Acceptance is a proportion; its Wilson interval uses the number of drafts as n (the tokens within one
draft are correlated, so counting draft tokens would overstate the precision). Drafts within one request are
correlated too (one prompt, one context): where the engine reports each request's own counts and enough requests
ran, the interval is also taken over requests (tasks/acceptance.py), and the wider of the two is used.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from prefect import task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from infra.stats import wilson
from infra.tracking import Tracker
from tasks.acceptance import split_at
from tasks.inspect import Finding
from tasks.offline import OfflineResult
from tasks.compare import stream_metrics
from tasks.record import ArmResult
from tasks.speedup import k_sweep, speed_models

VOCAB_CODES = {"d2t_missing", "d2t_shape", "d2t_range", "d2t_duplicates", "d2t_scrambled", "d2t_partial",
               "embedding_mismatch", "tokenizer"}
MIN_DRAFTS = 30  # below this, no interval is narrow enough to decide anything
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
    """The acceptance values the rules below compare an arm of this role with, for the early stop: the candidate
    and probes against NEAR_ZERO, HEALTHY and (offline known) the integration bound; the control against
    CONTROL_GOOD and HEALTHY. Comparisons between arms (control vs candidate, probe vs candidate) are not known
    while one arm runs; MIN_DRAFTS and the fixed half-width cover them."""
    if role == "control":
        return CONTROL_GOOD, HEALTHY
    out = (NEAR_ZERO, HEALTHY)
    off = offline_interval(offline or {})
    return out + ((round(INTEGRATION_RATIO * off[0], 4),) if off and off[0] >= NEAR_ZERO else ())


def speed_judged(role: str) -> bool:
    """Whether the verdict reads this arm's tok/s (the speedup over the baseline), not only its acceptance."""
    return role not in ("control", "probe")


@dataclass
class Verdict:
    cause: str
    evidence: list[str] = field(default_factory=list)
    next_step: str = ""

    def markdown(self) -> str:
        lines = [f"# Verdict: `{self.cause}`", "", "Evidence:", *[f"- {e}" for e in self.evidence]]
        return "\n".join(lines + ([f"\nNext: {self.next_step}"] if self.next_step else []))


MIN_REQUESTS = 6  # fewer requests than this give no usable spread over requests: drafts are the unit then


def over_requests(m: dict[str, float]) -> bool:
    return m.get("spec_requests", 0) >= MIN_REQUESTS and "acceptance_rate_req_lo" in m


def acceptance_interval(m: dict[str, float]) -> tuple[float, float]:
    drafts = m.get("num_drafts", 0.0)
    lo, hi = wilson(m.get("acceptance_rate", 0.0) * drafts, drafts)
    if over_requests(m):
        return min(lo, m["acceptance_rate_req_lo"]), max(hi, m["acceptance_rate_req_hi"])
    return lo, hi


def offline_interval(m: dict[str, float]) -> tuple[float, float] | None:
    """The offline acceptance's interval, n = slots / mean length (about the drafts serving would make)."""
    if "offline_acceptance_rate" not in m:
        return None
    n = m.get("offline_num_slots", 0.0) / max(1.0, m.get("offline_mean_acceptance_length", 1.0))
    return wilson(m["offline_acceptance_rate"] * n, n)


def _fmt_offline(name: str, m: dict[str, float]) -> str:
    lo, hi = offline_interval(m)
    return (f"{name}: offline acceptance {m['offline_acceptance_rate']:.3f} [95% CI {lo:.3f}-{hi:.3f}] over "
            f"{m.get('offline_num_slots', 0):.0f} draft slots (reference forward, no engine)")


def _fmt(name: str, m: dict[str, float]) -> str:
    lo, hi = acceptance_interval(m)
    requests = f" / {m['spec_requests']:.0f} requests" if over_requests(m) else ""
    return (f"{name}: acceptance {m.get('acceptance_rate', 0):.3f} [95% CI {lo:.3f}-{hi:.3f}] over "
            f"{m.get('num_drafts', 0):.0f} drafts / {m.get('num_draft_tokens', 0):.0f} draft tokens{requests}")


PROBE_RATIO = 1.5  # a probe arm decides only when its acceptance differs from the candidate's by this factor


def _differs(a: dict[str, float], b: dict[str, float]) -> bool:
    """a's acceptance is clearly above b's: separated intervals and a large ratio, not noise."""
    (a_lo, _), (_, b_hi) = acceptance_interval(a), acceptance_interval(b)
    return a.get("num_drafts", 0) >= MIN_DRAFTS and a_lo > b_hi and \
        a.get("acceptance_rate", 0) >= PROBE_RATIO * b.get("acceptance_rate", 0)


def probe_verdict(cand: ArmResult, results: list[ArmResult], evidence: list[str]) -> Verdict | None:
    """One probe arm changed one thing; a large, significant change names the cause."""
    m = cand.metrics
    for p in (r for r in results if r.role == "probe" and r.ok):
        line = _fmt(p.arm, p.metrics) + f" (probe {p.probe})"
        if p.probe == "control_mapping" and _differs(p.metrics, m):
            return Verdict("vocab_mismatch", evidence + [line, "with the control's d2t/t2d the same head accepts far "
                           "more: its own vocabulary mapping is wrong"], "regenerate the candidate's d2t/t2d from "
                           "the data it was trained on, or reuse the control's")
        if p.probe == "graphs" and (_differs(p.metrics, m) or _differs(m, p.metrics)):
            return Verdict("integration", evidence + [line, "acceptance changes with CUDA graphs / compilation alone: "
                           "the engine's graph path runs the drafter differently"],
                           "serve the drafter eager (speculative config enforce_eager) and report it to the engine")
        if p.probe == "raw_prompts" and (_differs(p.metrics, m) or _differs(m, p.metrics)):
            return Verdict("template_mismatch", evidence + [line, "the same prompts with and without the chat "
                           "template give very different acceptance: the drafter was trained on another prompt "
                           "format than it is served with"], "benchmark and train with the serving chat template")
    return None


def decide(results: list[ArmResult], findings: dict[str, list[Finding]],
           offline: OfflineResult | None = None) -> Verdict:
    v = _draft_overhead(_decide(results, findings, offline or OfflineResult()), results)
    if offline and offline.line() and offline.line() not in v.evidence:
        v.evidence.append(offline.line())
    return v


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


def _offline_intervention(cand: ArmResult, offline: OfflineResult, evidence: list[str]) -> Verdict | None:
    """One thing changed offline (the mapping, the layers fed) makes the head accept far more: that thing is the
    cause, confirmed by the intervention without a server."""
    for kind, cause, why, fix in INTERVENTIONS:
        found = _offline_variant(cand, offline, kind)
        if found:
            rate, name, change, v = found
            lo, hi = offline_interval(v)
            fill = {"aux": change.get("aux"), "name": name}
            return Verdict(cause, evidence + [f"{cand.arm}: offline acceptance {rate:.3f} [95% CI {lo:.3f}-{hi:.3f}] "
                                              f"{why.format(**fill)}"], fix.format(**fill))
    return None


def _low_control(ctrl: ArmResult, c_hi: float, evidence: list[str]) -> Verdict:
    """A low control names the engine only when it is low against what it should reach: its own offline acceptance
    on the same prompts, or the profile's expected_acceptance. As good as it ever was, it is a weak control."""
    m = ctrl.metrics
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


def _draft_overhead(v: Verdict, results: list[ArmResult]) -> Verdict:
    """Acceptance called healthy, but the drafter costs more than it saves: the speedup's whole interval lies below 1,
    or below half of what the acceptance buys (the tokens each step emits, were drafting free). The second clause does
    not hang on the host: the target drafting for itself costs about one baseline step per draft token anywhere, and
    lands near 1x, a little above on one CPU and a little below on another."""
    cand = next((r for r in results if r.role == "candidate" and r.ok), None)
    sm = speed_models(results).get(cand.arm) if cand else None
    if v.cause != "healthy" or not sm or not sm.measured or sm.measured[2] >= max(1.0, sm.tokens_per_step / 2):
        return v
    below = "below 1" if sm.measured[2] < 1.0 else f"under half of the {sm.tokens_per_step:.3f} tokens a step emits"
    _, best_measured = k_sweep(results)
    if best_measured is not None and best_measured != sm.k:
        pays = f"serve it with k={best_measured} (the best measured in the k_sweep)"
    elif sm.best_k and sm.best_k != sm.k and sm.predicted[sm.best_k] >= PAYING_SPEEDUP:
        pays = f"serve it with k={sm.best_k} (predicted {sm.predicted[sm.best_k]:.3f}x)"
    else:
        pays = f"no k pays off with this drafter on this host and load (none predicted {PAYING_SPEEDUP}x or more): " \
               "use a cheaper drafter (an EAGLE-3 head, ngram) or none"
    return Verdict("draft_overhead", v.evidence + [sm.line(), f"acceptance is fine, but the measured speedup is "
                   f"{sm.measured[2]:.3f}x at best, {below}: each step costs {sm.step_cost:.3f} baseline steps for "
                   f"{sm.tokens_per_step:.3f} tokens"], pays)


def _context_limit(cand: ArmResult, findings: list[Finding], evidence: list[str]) -> Verdict | None:
    """A drafter that declares fewer positions than are served, and accepts far less beyond its limit than before it
    in the same arm: context_limit. Served only beyond it, nothing to compare with: inconclusive, unless acceptance
    is healthy there anyway. Served only within it: an evidence line, and the other rules decide."""
    limit = next((int(f.value) for f in findings if f.code == "position_limit" and f.value), None)
    if limit is None:
        return None
    k, m = max(1, cand.k), cand.metrics
    (wa, wd), (ba, bd) = split_at(m, limit)
    static = f"static check: {next(f for f in findings if f.code == 'position_limit').line()}"
    if bd < MIN_DRAFTS * k:
        evidence.append(f"{cand.arm}: {bd:.0f} draft tokens beyond position {limit}: the served sequences stayed "
                        f"within its declared range" if "seqpos_0_drafted" in m else
                        f"{cand.arm}: no acceptance by position (the engine gave no per-request counts)")
        return None
    (b_lo, b_hi), beyond = wilson(ba / k, bd / k), f"beyond position {limit}: {ba:.0f} of {bd:.0f} draft tokens accepted"
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


def _decide(results: list[ArmResult], findings: dict[str, list[Finding]], offline: OfflineResult) -> Verdict:
    cand = next((r for r in results if r.role == "candidate"), None)
    ctrl = next((r for r in results if r.role == "control"), None)
    if cand is None:
        return Verdict("inconclusive", ["no candidate arm ran"], "pass --drafter")
    vocab_errors = [f for f in findings.get(cand.arm, []) if f.severity == "error" and f.code in VOCAB_CODES]
    if not cand.ok:
        if cand.error.startswith("StaticCheckFailed"):
            gating = [f for f in findings.get(cand.arm, []) if f.gating]
            cause = "vocab_mismatch" if gating and all(f.code in VOCAB_CODES for f in gating) else "checkpoint_mismatch"
            return Verdict(cause, [f"static check: {f.line()}" for f in gating] + [
                f"{cand.arm} was stopped before its server load: the engine would refuse this checkpoint or serve "
                f"drafts it cannot map"], "fix the checkpoint as the findings say (or --force to measure it anyway)")
        if "SpecDecodingOff" in cand.error:
            return Verdict("spec_disabled", [cand.error.splitlines()[0]],
                           "check that the speculative config reaches the engine (server_cmd, server log)")
        return Verdict("inconclusive", [f"candidate arm failed: {cand.error.splitlines()[0]}"] +
                       [f"static check: {f.line()}" for f in vocab_errors], "fix the failure and rerun")
    m = cand.metrics
    if m.get("num_drafts", 0) == 0 and m.get("output_tokens", 0) > 0:
        return Verdict("spec_disabled", [f"{cand.arm}: {m.get('output_tokens', 0):.0f} tokens generated, 0 drafts proposed"],
                       "the drafter never proposed: check the speculative config")
    evidence = [_fmt(cand.arm, m)]
    lo, hi = acceptance_interval(m)
    if MIN_CONTROL_DRAFTS <= m.get("num_drafts", 0) < MIN_DRAFTS and lo >= HEALTHY:  # few drafts, but decisive
        return Verdict("healthy", evidence + [f"the whole interval lies above {HEALTHY}, even over few drafts"])
    if m.get("num_drafts", 0) < MIN_DRAFTS:
        return Verdict("inconclusive", evidence + [f"fewer than {MIN_DRAFTS} drafts: the interval is too wide"],
                       f"rerun with more prompts or tokens (--prompts, --max-tokens)")
    evidence += [f"static check: {f.line()}" for f in vocab_errors]
    off = offline_interval(m)
    if off:  # one thing changed offline that restores acceptance names it, static findings or not
        evidence.append(_fmt_offline(cand.arm, m))
        changed = _offline_intervention(cand, offline, evidence)
        if changed:
            return changed
    if hi < NEAR_ZERO and vocab_errors:
        return Verdict("vocab_mismatch", evidence + [
            "near-zero acceptance together with a vocabulary-mapping fault found in the checkpoint"],
            "regenerate or restore the drafter's vocabulary mapping (d2t/t2d, embedding rows)")
    if off:
        if off[0] >= NEAR_ZERO and hi < INTEGRATION_RATIO * off[0]:
            return Verdict("integration", evidence + [
                f"served acceptance (upper {hi:.3f}) is far below what the same checkpoint reaches offline on the "
                f"same prompts (lower {off[0]:.3f}): the engine feeds or wires the drafter differently from how it "
                f"was trained"], "check the aux hidden-state layers the engine captures (server log: 'auxiliary "
                "layers'), engine patches and the drafter's norm flags against the engine version")
    probed = probe_verdict(cand, results, evidence)
    if probed:
        return probed
    limited = _context_limit(cand, findings.get(cand.arm, []), evidence)
    if limited:
        return limited
    if lo >= HEALTHY:
        return Verdict("healthy", evidence + [f"the whole interval lies above {HEALTHY}"])
    if off and off[1] < CONTROL_GOOD and hi >= off[0]:
        return Verdict("training_quality", evidence + [
            "served acceptance matches the drafter's own offline acceptance, and both are low: the engine runs it "
            "as trained; the drafter itself predicts poorly"], "train longer or on data closer to the served prompts")
    if ctrl is None or not ctrl.ok or ctrl.metrics.get("num_drafts", 0) < MIN_CONTROL_DRAFTS:
        why = "no control arm" if ctrl is None else (f"control failed: {ctrl.error.splitlines()[0]}" if not ctrl.ok
                                                     else "control has too few drafts")
        return Verdict("inconclusive", evidence + [why], "add a known-good control drafter (--control) and rerun")
    c_lo, c_hi = acceptance_interval(ctrl.metrics)
    evidence.append(_fmt(ctrl.arm, ctrl.metrics) + " (control)")
    if c_hi < CONTROL_GOOD:
        return _low_control(ctrl, c_hi, evidence)
    if lo > c_hi:
        return Verdict("healthy", evidence + ["candidate acceptance is above the control's"])
    if hi >= c_lo:
        if max(hi - lo, c_hi - c_lo) < NARROW:
            return Verdict("healthy", evidence + ["candidate acceptance matches the control's"])
        return Verdict("inconclusive", evidence + ["candidate and control intervals overlap and are wide"],
                       "rerun with more prompts (--prompts) to narrow the intervals")
    if vocab_errors:
        return Verdict("vocab_mismatch", evidence + ["candidate below control, with a vocabulary-mapping fault"],
                       "restore the drafter's vocabulary mapping")
    if cand.method != ctrl.method and not off:
        # a control served through another engine path (a draft model for an EAGLE-3 head) shows that path works,
        # not the one the candidate takes: without the offline reference, training and integration look alike
        return Verdict("inconclusive", evidence + [offline.line() or f"no offline evaluation of {cand.arm}",
                       f"the control is a {ctrl.method or 'different'} drafter, the candidate {cand.method}: the "
                       f"control does not exercise the candidate's engine path, so a low candidate may be its "
                       f"training or the engine's integration"],
                       ("supply your training pipeline's hidden-state dumps (--hidden-states DIR)"
                        if offline.status == "skipped" else
                        "make the offline evaluation run (offline_eval_error.txt on the parent run says why)")
                       + f" or add a known-good {cand.method} control (--control)")
    return Verdict("training_quality", evidence + [
        f"candidate significantly below the control (upper {hi:.3f} < control lower {c_lo:.3f}) with no static "
        f"fault: the drafter itself predicts worse"], "train longer or on data closer to the served prompts")


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


@task(name="verdict", cache_policy=NO_CACHE)
def verdict(tracker: Tracker, parent_run_id: str, results: list[ArmResult],
            findings: dict[str, list[Finding]], offline: OfflineResult | None = None) -> Verdict:
    v = decide(results, findings, offline)
    v.evidence += [line for line in throughput_lines(results) if line not in v.evidence]
    sweep, _ = k_sweep(results)
    if sweep:
        v.evidence.append(sweep)
    cand = next((r for r in results if r.role == "candidate"), None)
    if cand is not None:
        tracker.tag(cand.run_id, "specdiag.arm_verdict", v.cause)
    for arm, av in arm_verdicts(results, findings, offline).items():
        tracker.tag(next(r.run_id for r in results if r.arm == arm), "specdiag.arm_verdict", av.cause)
        v.evidence.append(f"{arm} on its own: `{av.cause}` ({av.evidence[-1] if av.evidence else ''})")
    for arm, sm in speed_models(results).items():
        tracker.metrics(next(r.run_id for r in results if r.arm == arm), sm.metrics())
    tracker.tag(parent_run_id, "specdiag.verdict", v.cause)
    tracker.text(parent_run_id, v.markdown(), "verdict.md")
    create_markdown_artifact(v.markdown(), key="specdiag-verdict", description="specdiag verdict")
    return v
