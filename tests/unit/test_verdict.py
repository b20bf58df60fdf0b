import pytest

from tasks.inspect import Finding
from tasks.record import ArmResult
from infra.stats import mean_interval, wilson
from tasks.verdict import acceptance_interval, decide, throughput_lines


def arm(name, role, rate=None, drafts=200, k=4, ok=True, error="", tok_s=None):
    m = {"output_tokens": 100.0}
    if rate is not None:
        m.update(acceptance_rate=rate, num_drafts=float(drafts), num_draft_tokens=float(drafts * k))
    return ArmResult(name, role, f"run-{name}", ok, error, m, tok_s or [])


def expecting(result, rate):
    result.metrics["expected_acceptance"] = rate  # DrafterConfig.expected_acceptance, e.g. from a model card
    return result


BASE = arm("baseline", "baseline")
VOCAB = {"cand": [Finding("error", "embedding_mismatch", "rows shuffled")]}


def test_wilson_matches_the_textbook_values():
    lo, hi = wilson(50, 100)
    assert (round(lo, 4), round(hi, 4)) == (0.4038, 0.5962)
    assert wilson(0, 0) == (0.0, 1.0)
    assert acceptance_interval({"acceptance_rate": 0.5, "num_drafts": 100}) == (lo, hi)


@pytest.mark.parametrize("cand, ctrl, findings, cause", [
    (arm("cand", "candidate", 0.01), arm("ctl", "control", 0.99), VOCAB, "vocab_mismatch"),
    (arm("cand", "candidate", 0.45), arm("ctl", "control", 0.99), {}, "training_quality"),
    (arm("cand", "candidate", 0.45), arm("ctl", "control", 0.99), VOCAB, "vocab_mismatch"),
    (arm("cand", "candidate", 0.99), arm("ctl", "control", 0.99), {}, "healthy"),
    (arm("cand", "candidate", 0.99), None, {}, "healthy"),
    (arm("cand", "candidate", 0.12), expecting(arm("ctl", "control", 0.10), 0.7), {}, "integration"),
    (arm("cand", "candidate", 0.12), arm("ctl", "control", 0.10), {}, "inconclusive"),  # no expectation: no claim
    (arm("cand", "candidate", ok=False, error="SpecDecodingOff: [x] no vllm:spec_decode_* series"),
     arm("ctl", "control", 0.99), {}, "spec_disabled"),
    (arm("cand", "candidate", 0.0, drafts=0), arm("ctl", "control", 0.99), {}, "spec_disabled"),
])
def test_rules_name_the_cause(cand, ctrl, findings, cause):
    results = [BASE, cand] + ([ctrl] if ctrl else [])
    v = decide(results, findings)
    assert v.cause == cause, v.evidence
    assert v.evidence


def test_verdict_never_claims_more_than_the_evidence():
    # too few drafts: no interval is narrow enough
    v = decide([BASE, arm("cand", "candidate", 0.01, drafts=10), arm("ctl", "control", 0.99)], VOCAB)
    assert v.cause == "inconclusive" and "--prompts" in v.next_step
    # wide overlapping intervals between candidate and control
    v = decide([BASE, arm("cand", "candidate", 0.50, drafts=40), arm("ctl", "control", 0.58, drafts=40)], {})
    assert v.cause == "inconclusive" and "overlap" in " ".join(v.evidence)
    # a control with a handful of drafts cannot anchor a comparison
    v = decide([BASE, arm("cand", "candidate", 0.45), arm("ctl", "control", 1.0, drafts=5)], {})
    assert v.cause == "inconclusive" and "too few drafts" in " ".join(v.evidence)
    # ...but a control that accepted all of 26 drafts can
    v = decide([BASE, arm("cand", "candidate", 0.32, drafts=56), arm("ctl", "control", 1.0, drafts=26)], {})
    assert v.cause == "training_quality"
    # a mediocre drafter with no control to compare with
    v = decide([BASE, arm("cand", "candidate", 0.45)], {})
    assert v.cause == "inconclusive" and "--control" in v.next_step
    # the candidate arm crashed for another reason
    v = decide([BASE, arm("cand", "candidate", ok=False, error="ServerDied: boom"), arm("ctl", "control", 0.99)], {})
    assert v.cause == "inconclusive"


def test_near_zero_without_a_static_fault_is_not_called_vocab_mismatch():
    v = decide([BASE, arm("cand", "candidate", 0.01), arm("ctl", "control", 0.99)], {})
    assert v.cause == "training_quality"


def test_throughput_interval_and_speedup_line():
    mean, lo, hi = mean_interval([10.0, 12.0, 11.0, 13.0])
    assert mean == 11.5 and lo < 11.5 < hi
    lines = throughput_lines([arm("baseline", "baseline", tok_s=[10, 11, 9, 10]),
                              arm("cand", "candidate", 0.5, tok_s=[5, 5.5, 4.5, 5])])
    assert lines and "speedup 0.500x" in lines[0]


def with_offline(result, rate, slots=600, length=1.4):
    result.metrics.update(offline_acceptance_rate=rate, offline_num_slots=float(slots),
                          offline_mean_acceptance_length=length)
    return result


@pytest.mark.parametrize("served, offline, ctrl, cause", [
    (0.02, 0.25, arm("ctl", "control", 0.99), "integration"),  # the engine breaks a drafter that works offline
    (0.02, 0.25, None, "integration"),  # the offline reference forward is itself the control
    (0.20, 0.22, None, "training_quality"),  # served agrees with offline and both are low: the drafter
    (0.20, 0.22, arm("ctl", "control", 0.99), "training_quality"),
    (0.02, 0.03, arm("ctl", "control", 0.99), "training_quality"),  # low offline too: not the engine
    (0.15, 0.25, None, "inconclusive"),  # below offline but not far below: no claim
])
def test_served_vs_offline_acceptance_separates_engine_from_drafter(served, offline, ctrl, cause):
    cand = with_offline(arm("cand", "candidate", served, k=3), offline)
    v = decide([BASE, cand] + ([ctrl] if ctrl else []), {})
    assert v.cause == cause, v.evidence
    assert any("offline acceptance" in e for e in v.evidence)


def test_offline_numbers_never_hide_a_vocabulary_fault():
    cand = with_offline(arm("cand", "candidate", 0.0), 0.0)
    assert decide([BASE, cand, arm("ctl", "control", 0.99)], VOCAB).cause == "vocab_mismatch"


def probe(name, kind, rate, drafts=200):
    r = arm(name, "probe", rate, drafts=drafts)
    r.probe = kind
    return r


@pytest.mark.parametrize("cand_rate, probes, cause", [
    (0.05, [probe("c@control-mapping", "control_mapping", 0.60)], "vocab_mismatch"),
    (0.05, [probe("c@eager", "graphs", 0.80)], "integration"),  # 0% with graphs, high eager (vllm #54997)
    (0.25, [probe("c@raw", "raw_prompts", 0.60)], "template_mismatch"),
    (0.60, [probe("c@raw", "raw_prompts", 0.25)], "template_mismatch"),
    (0.25, [probe("c@raw", "raw_prompts", 0.28)], "training_quality"),  # no real difference: no claim from it
    (0.25, [probe("c@raw", "raw_prompts", 0.60, drafts=12)], "training_quality"),  # too few drafts to decide
    (0.60, [probe("c@T=1", "temperature", 0.25)], "sampling_mismatch"),  # T=1 25% vs greedy (vllm #46878)
    (0.25, [probe("c@T=1", "temperature", 0.23)], "training_quality"),
    (0.20, [probe("c@enable_thinking=false", "thinking", 0.55)], "template_mismatch"),  # vllm #44244
    (0.05, [probe("c@control-mapping", "control_mapping", 0.04)], "training_quality"),  # no better: not the map
])
def test_probe_arms_name_the_cause_they_isolate(cand_rate, probes, cause):
    results = [BASE, arm("cand", "candidate", cand_rate), arm("ctl", "control", 0.99), *probes]
    v = decide(results, {})
    assert v.cause == cause, v.evidence


def test_every_probe_that_changes_acceptance_is_named_not_only_the_first():
    """Measured on the demo (smol-eagle3 with raw_prompts and temperature probes): raw 0.128 and T=1 0.004 against
    0.439 served. The first probe in the plan names the cause; the other one, as clear, is stated beside it with its
    own cause and fix instead of being left out; a probe with no clear difference still says so."""
    results = [BASE, arm("cand", "candidate", 0.44), arm("ctl", "control", 0.99),
               probe("c@raw", "raw_prompts", 0.13), probe("c@T=1", "temperature", 0.01),
               probe("c@enable_thinking=false", "thinking", 0.45)]
    v = decide(results, {})
    assert v.cause == "template_mismatch" and v.fix == {"confirmed_by": "the probe arm c@raw"}
    also = [e for e in v.evidence if e.startswith("c@T=1") and "`sampling_mismatch` as well" in e]
    assert len(also) == 1, v.evidence
    assert "serving chat template" in v.next_step
    assert "for `sampling_mismatch` (c@T=1): judge it at the served" in v.next_step
    assert any(e.startswith("c@enable_thinking=false") and "no clear difference" in e for e in v.evidence)


def test_a_probe_that_could_still_differ_from_the_candidate_is_open_not_checked():
    """"No clear difference" is a finding only where the probe's interval lies clear of where the comparison flips
    (tasks/verdict/probes.probe_flips: 1.5 x 0.30 and 0.30 / 1.5 here) over the rule's floor of drafts; a probe run
    to its cap short of that says the question is open and what settling it costs."""
    def quiet(p):
        v = decide([BASE, arm("cand", "candidate", 0.30, drafts=400), arm("ctl", "control", 0.99), p], {})
        return next(e for e in v.evidence if e.startswith(p.arm))
    checked = quiet(probe("c@raw", "raw_prompts", 0.31, drafts=300))  # [0.26-0.36]: between the flips
    assert checked.endswith("no clear difference from the candidate"), checked
    wide = probe("c@raw", "raw_prompts", 0.40, drafts=40)  # [0.26-0.55]: holds 0.45
    wide.metrics.update(requests_ok=3.0, bench_duration_s=6.0)
    line = quiet(wide)
    assert "whether it differs from the candidate is open" in line and "clear of 0.45, 0.2" in line, line
    assert "more requests" in line
    assert "is open" in quiet(probe("c@raw", "raw_prompts", 0.30, drafts=20))  # under the rule's 30 drafts


def test_probe_arms_are_planned_from_the_candidate():
    from infra.arms import plan_arms
    from infra.config import load_profile

    cfg = load_profile("demo", {"drafter": "smol-eagle3", "control": "smol-eagle3-scrambled",
                                "probes": ["k_sweep", "graphs", "raw_prompts", "temperature", "thinking",
                                           "control_mapping"]})
    arms = {a.name: a for a in plan_arms(cfg)}
    assert [arms[f"smol-eagle3@k={k}"].spec.num_speculative_tokens for k in (1, 2, 4, 6)] == [1, 2, 4, 6]
    assert "--enforce-eager" not in arms["smol-eagle3@graphs"].target_args
    assert dict(arms["smol-eagle3@raw"].bench) == {"endpoint": "completions"}
    assert dict(arms["smol-eagle3@T=1"].bench) == {"temperature": 1.0}  # the demo benchmarks greedy
    assert dict(arms["smol-eagle3@enable_thinking=false"].bench) == {"chat_template_kwargs": {"enable_thinking": False}}
    assert arms["smol-eagle3@control-mapping"].mapping_from == "embedded:smol-eagle3-scrambled"
    assert {a.role for a in arms.values() if "@" in a.name} == {"probe"}


def test_a_perfect_drafter_is_healthy_over_few_drafts_but_a_handful_decides_nothing():
    # a good drafter accepts whole drafts, so 128 tokens make only ~26 drafts: [0.87, 1] still decides
    assert decide([BASE, arm("cand", "candidate", 1.0, drafts=26)], {}).cause == "healthy"
    assert decide([BASE, arm("cand", "candidate", 1.0, drafts=6)], {}).cause == "inconclusive"
    assert decide([BASE, arm("cand", "candidate", 0.5, drafts=26)], {}).cause == "inconclusive"


def _eagle(name, role, rate, method="eagle3", **kw):
    a = arm(name, role, rate, k=3, **kw)
    a.method = method
    return a


def test_missing_offline_evidence_never_makes_training_quality_for_an_eagle3_head():
    """An EAGLE-3 head low against a draft-model control: without the offline reference, the control shows only
    that the draft-model path works; training and integration cannot be told apart."""
    from tasks.offline import OfflineResult

    failed = OfflineResult(status="failed", note="exit -1: SameFileError (offline_eval_error.txt)")
    results = [BASE, _eagle("cand", "candidate", 0.05), _eagle("ctl", "control", 0.99, method="draft_model")]
    v = decide(results, {}, failed)
    assert v.cause == "inconclusive", v.evidence
    assert any("offline evaluation failed: exit -1" in e for e in v.evidence)
    assert "offline" in v.next_step
    # a control of the candidate's own method does exercise its engine path, and decides
    same = [BASE, _eagle("cand", "candidate", 0.05), _eagle("ctl", "control", 0.99)]
    assert decide(same, {}, failed).cause == "training_quality"
    # with the offline numbers the served-vs-offline rule decides, whatever the control
    cand = with_offline(_eagle("cand", "candidate", 0.02), 0.25)
    assert decide([BASE, cand, results[2]], {}, OfflineResult(status="ok")).cause == "integration"


def test_a_gated_candidate_is_named_by_its_finding():
    gated = arm("cand", "candidate", ok=False, error="StaticCheckFailed: d2t_missing: no d2t")
    found = {"cand": [Finding("error", "d2t_missing", "no d2t"), Finding("info", "aux_layers", "fed [2, 15, 27]")]}
    v = decide([BASE, gated, arm("ctl", "control", 0.99)], found)
    assert v.cause == "vocab_mismatch" and any("d2t_missing" in e for e in v.evidence) and "--force" in v.next_step
    shapes = {"cand": [Finding("error", "hidden_size", "expects 7168, target has 4096")]}
    assert decide([BASE, gated, arm("ctl", "control", 0.99)], shapes).cause == "checkpoint_mismatch"


@pytest.mark.parametrize("variant_rate, slots, cause", [
    (0.45, 600, "aux_layers"),  # fed the engine's default layers, the head accepts far more: trained on those
    (0.14, 600, "training_quality"),  # about the same on any layers: the layers are not the story
    (0.45, 12, "training_quality"),  # a handful of slots decides nothing
])
def test_a_head_that_accepts_far_more_on_other_layers_was_trained_on_them(variant_rate, slots, cause):
    from tasks.offline import OfflineResult

    cand = with_offline(arm("cand", "candidate", 0.10, k=3), 0.11)
    cand.metrics.update(offline_acceptance_rate_aux_default=variant_rate, offline_num_slots_aux_default=float(slots),
                        offline_mean_acceptance_length_aux_default=1.0 + 3 * variant_rate)
    offline = OfflineResult(status="ok", variants={"cand": {"default": {"aux": [2, 15, 27]}}})
    v = decide([BASE, cand, arm("ctl", "control", 0.99)], {}, offline)
    assert v.cause == cause, v.evidence
    if cause == "aux_layers":
        assert "[2, 15, 27]" in v.next_step and any("(default)" in e for e in v.evidence)


def test_every_drafter_arm_gets_its_own_cause():
    """The seed's terms: the origin head at 0.7, the fine-tuned one at 0.15 on one engine -> the fine-tuned one is
    `training_quality`, the origin `healthy`; both at 0.15 -> the engine (`integration`)."""
    from tasks.verdict import arm_verdicts

    custom, aqmedai = arm("custom", "candidate", 0.15, drafts=400), arm("aqmedai", "control", 0.70, drafts=300)
    results = [BASE, custom, aqmedai, arm("ngram", "extra", 0.20, drafts=300)]
    assert decide(results, {}).cause == "training_quality"
    others = arm_verdicts(results, {})
    assert others["aqmedai"].cause == "healthy" and others["ngram"].cause == "training_quality"
    both_low = [BASE, custom, expecting(arm("aqmedai", "control", 0.15, drafts=300), 0.518)]  # vllm PR #35966
    assert decide(both_low, {}).cause == "integration"
    assert arm_verdicts(both_low, {})["aqmedai"].cause == "inconclusive"  # alone, low with no reference


def test_the_controls_mapping_restoring_acceptance_offline_confirms_vocab_mismatch():
    """A wrong but self-consistent d2t passes every static check; the candidate head with the control's d2t, offline,
    accepts far more: vocab_mismatch, confirmed by the intervention, even beside a weak control."""
    from tasks.offline import OfflineResult

    cand = with_offline(arm("cand", "candidate", 0.01, k=3), 0.01)
    cand.metrics.update(offline_acceptance_rate_aux_control_mapping=0.30, offline_num_slots_aux_control_mapping=600.0,
                        offline_mean_acceptance_length_aux_control_mapping=1.9)
    offline = OfflineResult(status="ok", variants={"cand": {"control_mapping": {"d2t": {"file": "c/model.safetensors"}}}})
    v = decide([BASE, cand, arm("ctl", "control", 0.14)], {}, offline)
    assert v.cause == "vocab_mismatch" and "control's d2t" in v.evidence[-1], v.evidence
    assert decide([BASE, cand, arm("ctl", "control", 0.14)], {}, OfflineResult(status="ok")).cause != "vocab_mismatch"


def test_a_control_only_as_good_as_it_always_was_never_makes_integration():
    """The demo's weak EAGLE-3 head as control: 0.14 served, 0.15 offline on the same prompts. The candidate is low,
    but a control that reaches what it always reaches says nothing of the engine."""
    weak = with_offline(arm("ctl", "control", 0.14, k=3), 0.15)
    v = decide([BASE, arm("cand", "candidate", 0.02), weak], {})
    assert v.cause == "inconclusive" and "weak control" in v.evidence[-1], v.evidence
    broken = with_offline(arm("ctl", "control", 0.02, k=3), 0.30)  # far under its own offline acceptance
    assert decide([BASE, arm("cand", "candidate", 0.02), broken], {}).cause == "integration"


def test_every_cause_has_a_rule_a_test_and_a_readme_row():
    """The causes are one typed list (evidence.Cause). Each is named by a rule (or a probe's row), asserted by a test
    of the verdict, and a row of the README's one verdict table; no rule names a cause outside the list."""
    import re
    from pathlib import Path

    from tasks.verdict import probes, rules
    from tasks.verdict.evidence import CAUSES

    root = Path(__file__).resolve().parents[2]
    named = set(re.findall(r'"(\w+)"', Path(rules.__file__).read_text())) & set(CAUSES)  # a Verdict refuses others
    named |= {cause for _, cause, _, _ in rules.INTERVENTIONS} | {c for _, c, _, _ in probes.PROBE_CAUSES.values()}
    table = (root / "README.md").read_text().split("## The verdict table", 1)[1].split("\n## ", 1)[0]
    rows = set(re.findall(r"^\| `(\w+)` \|", table, re.M))
    tests = "".join(p.read_text() for d in ("unit", "e2e", "ssh") for p in (root / "tests" / d).glob("test_*.py"))
    asserted = set(re.findall(r'"(\w+)"', tests))  # a verdict's expected cause (an assertion, a parametrized case)
    assert named == set(CAUSES), set(CAUSES) - named  # every cause is named by a rule
    assert rows == set(CAUSES), rows ^ set(CAUSES)
    assert set(CAUSES) <= asserted, set(CAUSES) - asserted
    assert [r.__name__ for r in rules.RULES][-1] == "training_quality"  # the last rule always decides
    with pytest.raises(ValueError, match="no such cause"):
        rules.Verdict("vocabulary")


def _paced(result, requests, seconds_per_request=2.0, ready_s=25.0):
    """An arm's window as the benchmark records it: requests, its duration, its server load."""
    result.metrics.update(requests_ok=float(requests), bench_duration_s=requests * seconds_per_request,
                          server_ready_s=ready_s)
    return result


def _scaled(result, prompts):
    """The same arm measured over `prompts` requests at the same pace and rate."""
    m = result.metrics
    per = m["num_drafts"] / m["requests_ok"]
    return arm(result.arm, result.role, m["acceptance_rate"], drafts=round(per * prompts))


@pytest.mark.parametrize("cand, ctrl", [
    (_paced(arm("cand", "candidate", 0.20, drafts=20), 2), _paced(arm("ctl", "control", 0.95), 8)),  # thin
    (_paced(arm("cand", "candidate", 0.45, drafts=45), 3), _paced(arm("ctl", "control", 0.55, drafts=60), 4)),  # overlap
    (_paced(arm("cand", "candidate", 0.30), 8), _paced(arm("ctl", "control", 0.90, drafts=6), 1)),  # thin control
])
def test_an_undecided_verdict_names_the_wide_interval_and_the_prompts_that_settle_it(cand, ctrl):
    v = decide([BASE, cand, ctrl], {})
    assert v.cause == "inconclusive"
    costs = [e for e in v.evidence if "settling it costs" in e]
    assert costs and all("more requests" in e and "server load (25 s here)" in e for e in costs), v.evidence
    assert "[" in costs[0] and "too wide" in costs[0]
    prompts = int(v.next_step.split("--prompts ")[1].split()[0])
    # measured at that many prompts, the same rates are decided, and fewer would not always have been
    settled = decide([BASE, _scaled(cand, prompts), _scaled(ctrl, prompts)], {})
    assert settled.cause != "inconclusive", settled.evidence
    assert prompts > min(cand.metrics["requests_ok"], ctrl.metrics["requests_ok"])


def test_a_rate_on_the_threshold_itself_is_said_to_be_unsettleable():
    from tasks.verdict.settle import drafts_needed, settle

    assert drafts_needed(0.6, 40, clear_of=(0.6,), most=1e5) is None
    line, prompts = settle("cand", {"acceptance_rate": 0.6, "num_drafts": 40.0, "requests_ok": 4.0}, (0.6,))
    assert prompts is None and "no budget settles it" in line
